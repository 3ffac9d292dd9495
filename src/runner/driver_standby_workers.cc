// Standbys (docs/design.md, "Standbys"): on free slots (discovered beyond
// the plan) erun runs the program up to its first join, where it waits as a
// pending worker of no plan; when a member is lost, the next plan takes a
// ready standby's slot in its place, so the job is back at full size as soon
// as the survivors re-join, without paying the program's start-up. The
// nearest standby goes first: on the same host, then in the same rack
// (`rack=NAME` on the discovery line), then any.
#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "common/log.h"
#include "runner/driver.h"

namespace erun {

namespace {
constexpr double kStandbyBackoffFirst = 1.0;  // seconds before a dead standby's slot gets another
constexpr double kStandbyBackoffMax = 60.0;
}  // namespace

int Driver::wanted_standbys() {
  if (o_.standby == 0 || !d_.membership || !in_place_possible()) return 0;
  return o_.standby < 0 ? 1 : o_.standby;
}

int Driver::tend_live_standbys(const MembershipSnapshot& m, const HostSet& usable) {
  std::set<SlotKey> waiting;
  for (auto& j : m.waiting) waiting.insert(j.slot);
  auto usable_slot = [&](const SlotKey& s) { return s.local_index < usable.slots_of(s.host); };
  int live = 0;
  for (auto& w : workers_) {
    if (!w.standby() || !survivor(w)) continue;
    if (!usable_slot(w.assignment.slot) || outcome_.any_success) {
      // Its host left (discovery, a drain, the blacklist) or training is over.
      ERUN_LOG_INFO("{}[{}]: standby stopped ({})", w.assignment.slot.host, w.assignment.slot.local_index,
                    outcome_.any_success ? "the job is finishing" : "its host left the job");
      w.handle->terminate();
      w.set_state(WorkerState::kStopping);
      continue;
    }
    if (waiting.count(w.assignment.slot)) {
      if (!w.standby_ready()) {
        w.set_stage(WorkerStage::kStandbyReady);
        const double took = seconds(clock_.now() - w.started);
        ERUN_LOG_INFO("{}[{}]: standby ready after {:.2f} s (started, waiting in the rendezvous)",
                      w.assignment.slot.host, w.assignment.slot.local_index, took);
        d_.events->emit(
            ev::StandbyReady{.host = w.assignment.slot.host, .slot = w.assignment.slot.local_index, .seconds = took});
      }
    } else if (!w.standby_ready() && clock_.now() - w.started > o_.rendezvous_timeout) {
      w.handle->kill();
      standby_lost(w, fmt::format("did not reach the rendezvous within --rendezvous-timeout {:.0f} s; killed",
                                  seconds(o_.rendezvous_timeout)));
      continue;
    }
    ++live;
  }
  return live;
}

void Driver::tend_standbys(const MembershipSnapshot& m) {
  // The plan cache's hosts (follow_membership() brought them up to date this tick).
  const HostSet& usable = plan_cache_.usable();
  int live = tend_live_standbys(m, usable);
  const int want = wanted_standbys();
  if (live >= want || outcome_.any_success || !gen_.complete || phase() != JobPhase::kRunning) return;
  // Free slots: those of the hosts that run members first (a standby beside
  // the members it may replace), then those of spare hosts (beyond
  // --max-np), whose agent may keep a commit replica too (--commit-replicas):
  // a standby promoted there after the members' hosts are lost whole adopts
  // it at its first sync. Listed again only when the hosts or the plan changed.
  const auto key = std::make_pair(discovery_.epoch, rec_.generation);
  if (standby_scan_.key == key && !standby_scan_.found) return;
  standby_scan_.key = key;
  standby_scan_.found = false;
  std::vector<const Host*> order;
  std::set<std::string> ordered;
  for (auto& name : plan_.hosts()) {
    if (int i = usable.find(name); i >= 0 && ordered.insert(name).second) {
      order.push_back(&usable.hosts()[static_cast<size_t>(i)]);
    }
  }
  const auto now = clock_.now();
  auto consider = [&](const Host* h) {
    for (int i = 0; i < h->slots && live < want; ++i) {
      const SlotKey slot{h->name, i};
      if (plan_.contains(slot) || slot_held(slot, /*pending_too=*/true) || stragglers_.resting(slot)) continue;
      standby_scan_.found = true;
      if (auto b = standby_scan_.backoff.find(slot); b != standby_scan_.backoff.end() && b->second.active) {
        if (now < b->second.until) continue;
        b->second.active = false;
      }
      RankAssignment a = plan_over_slots(rec_.generation, {slot}).ranks.front();
      a.rank = -1;  // none yet: its rank comes with the plan that promotes it
      if (launch_worker(a, plan_.ranks.empty() ? h->name : plan_.ranks.front().slot.host, 0, WorkerStage::kStandby)) {
        ERUN_LOG_INFO("{}[{}]: standby started (--standby {}{})", h->name, i, want,
                      ordered.count(h->name) ? "" : "; a spare host");
        ++live;
      }
    }
  };
  for (const Host* h : order) consider(h);
  // Then the spare hosts, in discovery's order (only as far as one is needed).
  for (auto& h : usable.hosts()) {
    if (live >= want) break;
    if (!ordered.count(h.name)) consider(&h);
  }
}

int Driver::distance(const std::string& a, const std::string& b) const { return host_distance(discovery_.hosts, a, b); }

bool Driver::standby_ready_at(const SlotKey& slot) const {
  return std::any_of(workers_.begin(), workers_.end(), [&](const Worker& w) {
    return w.standby_ready() && survivor(w) && w.assignment.slot == slot;
  });
}

Plan Driver::with_standbys(const Plan& full) const {
  std::vector<const Worker*> ready;
  for (auto& w : workers_) {
    if (w.standby_ready() && survivor(w) && !full.contains(w.assignment.slot)) ready.push_back(&w);
  }
  if (ready.empty()) return full;
  std::vector<SlotKey> slots;
  bool swapped = false;
  for (auto& r : full.ranks) {
    if (slot_held(r.slot, /*pending_too=*/true) || ready.empty()) {
      slots.push_back(r.slot);
      continue;
    }
    // The nearest standby: on the same host, else in the same rack, else the first.
    auto it = std::min_element(ready.begin(), ready.end(), [&](const Worker* a, const Worker* b) {
      return distance(a->assignment.slot.host, r.slot.host) < distance(b->assignment.slot.host, r.slot.host);
    });
    slots.push_back((*it)->assignment.slot);
    ready.erase(it);
    swapped = true;
  }
  return swapped ? plan_over_slots(full.generation, slots) : full;
}

void Driver::standbys_overtake(const MembershipSnapshot& m) {
  // Every tick: nothing to look at unless a standby is ready.
  if (std::none_of(workers_.begin(), workers_.end(), [](const Worker& w) { return w.standby_ready(); })) {
    return;
  }
  std::set<SlotKey> waiting;
  for (auto& j : m.waiting) waiting.insert(j.slot);
  auto ready = [&](const Worker& w) {
    return w.standby_ready() && survivor(w) && waiting.count(w.assignment.slot) > 0;
  };
  for (auto& r : workers_) {
    if (!r.replacement() || !survivor(r) || waiting.count(r.assignment.slot)) continue;
    // The nearest ready standby: on the replacement's host, else in its rack, else the first.
    Worker* s = nullptr;
    int best = 3;
    for (auto& w : workers_) {
      if (!ready(w)) continue;
      if (int d = distance(w.assignment.slot.host, r.assignment.slot.host); d < best) {
        s = &w;
        best = d;
      }
    }
    if (!s) return;
    ERUN_LOG_INFO("{}: standby {}[{}] is ready before the worker starting on {}[{}]: it takes that place, the other "
                  "is stopped",
                  who(rec_.generation), s->assignment.slot.host, s->assignment.slot.local_index, r.assignment.slot.host,
                  r.assignment.slot.local_index);
    r.handle->terminate();
    r.set_state(WorkerState::kStopping);
    s->assignment.rank = r.assignment.rank;
    const bool grows = r.stage == WorkerStage::kGrowth;
    promote_standby(*s, grows ? "the job grows" : "the job grows back: a replacement was still starting", r.stage);
    // Its slot replaces the other's in the plan the job grows into.
    plan_cache_.invalidate();
  }
}

void Driver::promote_standby(Worker& w, const char* why, WorkerStage to) {
  w.set_stage(to);
  ERUN_LOG_INFO("{}: standby {}[{}] promoted ({}): it joins without starting again", who(rec_.generation),
                w.assignment.slot.host, w.assignment.slot.local_index, why);
  d_.events->emit(ev::StandbyPromoted{.generation = rec_.generation,
                                      .host = w.assignment.slot.host,
                                      .slot = w.assignment.slot.local_index,
                                      .reason = why});
}

void Driver::standby_lost(Worker& w, const std::string& why) {
  Rest& b = standby_scan_.backoff[w.assignment.slot];
  const double wait = std::min(kStandbyBackoffMax, kStandbyBackoffFirst * (1 << std::min(b.times, 6)));
  ++b.times;
  b.until = clock_.now() + from_seconds(wait);
  b.active = true;
  ERUN_LOG_WARN("{}[{}]: standby {}; another is started there in {:.0f} s (the job is not affected)",
                w.assignment.slot.host, w.assignment.slot.local_index, why, wait);
  w.set_state(WorkerState::kExcluded);
  standby_scan_.key = {-1, -1};  // look for free slots again
}

}  // namespace erun
