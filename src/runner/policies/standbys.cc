#include "runner/policies/standbys.h"

#include <algorithm>
#include <set>
#include <vector>

#include <fmt/format.h>

#include "common/log.h"

namespace erun {

namespace {
constexpr double kBackoffFirst = 1.0;  // seconds before a dead standby's slot gets another
constexpr double kBackoffMax = 60.0;

// A standby erun stops (its host left, the job finishes) is on its way out:
// it holds its slot until it exits, but it is no standby any more.
bool stopped(const WorkerView& w) { return w.state == WorkerState::kStopping; }
bool ready(const WorkerView& w) { return w.stage == WorkerStage::kStandbyReady && w.survivor() && !stopped(w); }
// Ready, and on a host that is not blacklisted: it may become a member.
bool promotable(const JobSnapshot& s, const WorkerView& w) { return ready(w) && !s.sits_out(w.assignment.slot.host); }

// A survivor holds `slot` (a pending one included), other than those in
// `leaving` (told to stop in this turn).
bool held(const JobSnapshot& s, const SlotKey& slot, const std::set<long>& leaving = {}) {
  return std::any_of(s.workers.begin(), s.workers.end(), [&](const WorkerView& w) {
    return w.survivor() && w.assignment.slot == slot && !leaving.count(w.key);
  });
}

// The workers `out` stops: their slots are free from this turn on.
std::set<long> stopped_by(const Actions& out) {
  std::set<long> keys;
  for (auto& a : out) {
    if (auto* s = std::get_if<act::Stop>(&a)) keys.insert(s->worker);
    if (auto* x = std::get_if<act::Exclude>(&a)) keys.insert(x->worker);
  }
  return keys;
}
}  // namespace

bool standby_ready_at(const JobSnapshot& s, const SlotKey& slot) {
  return std::any_of(s.workers.begin(), s.workers.end(),
                     [&](const WorkerView& w) { return promotable(s, w) && w.assignment.slot == slot; });
}

int StandbyPolicy::wanted(const JobSnapshot& s) const {
  if (want_ == 0 || !s.in_place) return 0;
  return want_ < 0 ? 1 : want_;
}

void StandbyPolicy::lost(const SlotKey& slot, TimePoint now, const std::string& why) {
  Backoff& b = backoff_[slot];
  const double wait = std::min(kBackoffMax, kBackoffFirst * (1 << std::min(b.times, 6)));
  ++b.times;
  b.until = now + from_seconds(wait);
  b.active = true;
  ERUN_LOG_WARN("{}[{}]: standby {}; another is started there in {:.0f} s (the job is not affected)", slot.host,
                slot.local_index, why, wait);
  scanned_ = {-1, -1};  // look for free slots again
}

int StandbyPolicy::tend_live(const JobSnapshot& s, const Turn& turn, Actions& out) {
  auto usable_slot = [&](const SlotKey& k) { return k.local_index < turn.usable->slots_of(k.host); };
  int live = 0;
  for (const WorkerView& w : s.workers) {
    if (!is_standby(w.stage) || !w.survivor() || stopped(w)) continue;
    const SlotKey& slot = w.assignment.slot;
    if (!usable_slot(slot) || s.sits_out(slot.host) || turn.finishing) {
      // Its host left (discovery, a drain, the blacklist: a host kept in the
      // plan for its survivors gets no new worker) or training is over.
      ERUN_LOG_INFO("{}[{}]: standby stopped ({})", slot.host, slot.local_index,
                    turn.finishing ? "the job is finishing" : "its host left the job");
      out.push_back(act::Stop{w.key});
      continue;
    }
    if (s.waiting.count(slot)) {
      if (w.stage != WorkerStage::kStandbyReady) {
        const double took = seconds(s.now - w.started);
        ERUN_LOG_INFO("{}[{}]: standby ready after {:.2f} s (started, waiting in the rendezvous)", slot.host,
                      slot.local_index, took);
        out.push_back(act::SetStage{w.key, WorkerStage::kStandbyReady});
        out.push_back(act::Emit{ev::StandbyReady{.host = slot.host, .slot = slot.local_index, .seconds = took}});
      }
    } else if (w.stage != WorkerStage::kStandbyReady && s.now - w.started > rendezvous_timeout_) {
      out.push_back(act::Exclude{w.key});
      lost(slot, s.now, fmt::format("did not reach the rendezvous within --rendezvous-timeout {:.0f} s; killed",
                                    seconds(rendezvous_timeout_)));
      continue;
    }
    ++live;
  }
  return live;
}

bool StandbyPolicy::backoff_over(const SlotKey& slot, TimePoint now) {
  auto b = backoff_.find(slot);
  if (b == backoff_.end() || !b->second.active) return true;
  if (now < b->second.until) return false;
  b->second.active = false;
  return true;
}

void StandbyPolicy::start_more(const JobSnapshot& s, const Turn& turn, int live, Actions& out) {
  const int want = wanted(s);
  // Free slots: those of the hosts that run members first (a standby beside
  // the members it may replace), then those of spare hosts (beyond
  // --max-np), whose agent may keep a commit replica too (--commit-replicas):
  // a standby promoted there after the members' hosts are lost whole adopts
  // it at its first sync. Listed again only when the hosts or the plan changed.
  const auto key = std::make_pair(turn.hosts_epoch, s.generation);
  if (scanned_ == key && !found_) return;
  scanned_ = key;
  found_ = false;
  const Plan& plan = s.running();
  const HostSet& usable = *turn.usable;
  std::vector<const Host*> order;
  std::set<std::string> ordered;
  for (auto& name : plan.hosts()) {
    if (int i = usable.find(name); i >= 0 && ordered.insert(name).second) {
      order.push_back(&usable.hosts()[static_cast<size_t>(i)]);
    }
  }
  const std::set<long> leaving = stopped_by(out);
  auto consider = [&](const Host* h) {
    for (int i = 0; i < h->slots && live < want; ++i) {
      const SlotKey slot{h->name, i};
      if (plan.contains(slot) || held(s, slot, leaving) || turn.resting(slot) || s.sits_out(h->name)) continue;
      found_ = true;
      if (!backoff_over(slot, s.now)) continue;
      RankAssignment a = plan_over_slots(s.generation, {slot}).ranks.front();
      a.rank = -1;  // none yet: its rank comes with the plan that promotes it
      out.push_back(act::LaunchStandby{a, plan.ranks.empty() ? h->name : plan.ranks.front().slot.host, want,
                                       ordered.count(h->name) == 0});
      ++live;
    }
  };
  for (const Host* h : order) consider(h);
  // Then the spare hosts, in discovery's order (only as far as one is needed).
  for (auto& h : usable.hosts()) {
    if (live >= want) break;
    if (!ordered.count(h.name)) consider(&h);
  }
}

Actions StandbyPolicy::tend(const JobSnapshot& s, const Turn& turn) {
  Actions out;
  const int live = tend_live(s, turn, out);
  if (live < wanted(s) && turn.starts && !turn.finishing) start_more(s, turn, live, out);
  return out;
}

Plan StandbyPolicy::with_standbys(const JobSnapshot& s, const Plan& full) const {
  std::vector<const WorkerView*> waiting;
  for (const WorkerView& w : s.workers) {
    if (promotable(s, w) && !full.contains(w.assignment.slot)) waiting.push_back(&w);
  }
  if (waiting.empty()) return full;
  std::vector<SlotKey> slots;
  bool swapped = false;
  for (auto& r : full.ranks) {
    if (held(s, r.slot) || waiting.empty()) {
      slots.push_back(r.slot);
      continue;
    }
    // The nearest standby: on the same host, else in the same rack, else the first.
    auto it = std::min_element(waiting.begin(), waiting.end(), [&](const WorkerView* a, const WorkerView* b) {
      return host_distance(*s.hosts, a->assignment.slot.host, r.slot.host) <
             host_distance(*s.hosts, b->assignment.slot.host, r.slot.host);
    });
    slots.push_back((*it)->assignment.slot);
    waiting.erase(it);
    swapped = true;
  }
  return swapped ? plan_over_slots(full.generation, slots) : full;
}

Actions StandbyPolicy::overtake(const JobSnapshot& s) {
  // Every tick: nothing to look at unless a standby is ready.
  if (std::none_of(s.workers.begin(), s.workers.end(), ready)) return {};
  auto waits = [&](const WorkerView& w) { return promotable(s, w) && s.waiting.count(w.assignment.slot) > 0; };
  std::set<long> taken;
  Actions out;
  for (const WorkerView& r : s.workers) {
    if (!r.replacement() || !r.survivor() || s.waiting.count(r.assignment.slot)) continue;
    // The nearest ready standby: on the replacement's host, else in its rack, else the first.
    const WorkerView* best = nullptr;
    int best_distance = 3;
    for (const WorkerView& w : s.workers) {
      if (!waits(w) || taken.count(w.key)) continue;
      if (int d = host_distance(*s.hosts, w.assignment.slot.host, r.assignment.slot.host); d < best_distance) {
        best = &w;
        best_distance = d;
      }
    }
    if (!best) break;
    taken.insert(best->key);
    ERUN_LOG_INFO("{}: standby {}[{}] is ready before the worker starting on {}[{}]: it takes that place, the other "
                  "is stopped",
                  who(s.generation), best->assignment.slot.host, best->assignment.slot.local_index,
                  r.assignment.slot.host, r.assignment.slot.local_index);
    out.push_back(act::Stop{r.key});
    const bool grows = r.stage == WorkerStage::kGrowth;
    out.push_back(act::Promote{best->key, r.assignment.rank, r.stage,
                               grows ? "the job grows" : "the job grows back: a replacement was still starting"});
    out.push_back(act::Replan{});  // its slot replaces the other's in the plan the job grows into
  }
  return out;
}

}  // namespace erun
