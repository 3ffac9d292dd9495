// Stragglers (docs/design.md, "Stragglers"): the ranks report each commit
// interval (TIMING: its length, its time in collectives); the detector
// (runner/policies/stragglers.h) finds a rank that computes much longer than the
// others, again and again. With --stragglers evict its slot leaves the job
// at the next commit, as a drain does, when the job stays at --min-np or
// above and would run at least 20 % faster; the slot sits out a cooldown
// that doubles on repeat (--blacklist-cooldown-range), then may grow the job
// again. Otherwise, and in restart mode, it is only reported.
#include <algorithm>
#include <cmath>
#include <set>

#include <fmt/format.h>

#include "common/log.h"
#include "runner/driver.h"

namespace erun {

namespace {
constexpr double kMinGain = 0.2;          // eviction must make the job at least this much faster
constexpr double kPreflightFactor = 3.0;  // a new host this much slower at the check is held back
}

void Driver::watch_stragglers(const MembershipSnapshot& m) {
  if (d_.account) {
    const double now = realtime_seconds();
    for (auto& t : m.timings) d_.account->commit_seen(t.commit_id, now);
  }
  for (auto& [slot, rest] : resting_) {
    if (rest.active && clock_.now() >= rest.until) {
      rest.active = false;
      ERUN_LOG_INFO("{}: {}[{}]: its straggler cooldown ended; the slot may grow the job again", who(rec_.generation),
                    slot.host, slot.local_index);
      ++discovery_.epoch;  // the plans see the slot again
    }
  }
  if (o_.stragglers == StragglerPolicy::kOff || !d_.membership) return;
  if (gen_.complete && stragglers_gen_ != rec_.generation) {
    std::vector<SlotKey> members;
    for (auto& r : plan_.ranks) members.push_back(r.slot);
    stragglers_.start_generation(rec_.generation, members);
    stragglers_gen_ = rec_.generation;
  }
  for (auto& t : m.timings) stragglers_.add(t);
  for (const Straggler& s : stragglers_.take_found()) handle_straggler(s);
}

void Driver::handle_straggler(const Straggler& s) {
  if (s.generation != rec_.generation) return;
  const RankAssignment* a = plan_.find(s.slot);
  if (!a) return;
  std::string verdict;
  bool evict = false;
  if (o_.stragglers == StragglerPolicy::kReport) {
    verdict = "reported only (--stragglers report)";
  } else if (!in_place_possible()) {
    verdict = "reported only (restart mode restarts every worker to leave one out)";
  } else if (plan_.size() - 1 < std::max(o_.min_np, 1)) {
    verdict = fmt::format("reported, not left out: the job would run below --min-np {}", o_.min_np);
  } else if (s.gain() < kMinGain) {
    verdict = fmt::format("reported, not left out: the job would run only {:.0f} % faster without it",
                          100 * s.gain());
  } else {
    evict = true;
  }
  double rest_s = 0;
  if (evict) {
    rest_s = rest_slot(s.slot);
    verdict = fmt::format("it leaves the job at the next commit, and its slot sits out {:.0f} s", rest_s);
  }
  ERUN_LOG_WARN("{}: straggler: it computes {:.1f}x as long as the others in {} commit intervals in a row (an "
                "interval takes {:.2f} s, about {:.2f} s without it); {}",
                who(rec_.generation, s.slot.host, a->rank), s.factor, o_.straggler_window, s.interval_s, s.without_s,
                verdict);
  d_.events->emit(ev::Straggler{.generation = rec_.generation,
                                .host = s.slot.host,
                                .slot = s.slot.local_index,
                                .rank = a->rank,
                                .factor = s.factor,
                                .interval = s.interval_s,
                                .without = s.without_s,
                                .action = evict ? "evict" : "report",
                                .cooldown = rest_s});
}

double Driver::rest_slot(const SlotKey& slot) {
  Rest& rest = resting_[slot];
  const double s = std::min(o_.cooldown_min_s * std::pow(2.0, rest.times), o_.cooldown_max_s);
  rest.times += 1;
  rest.active = true;
  rest.until = clock_.now() + from_seconds(s);
  ++discovery_.epoch;  // the plans leave the slot out from now on
  return s;
}

namespace {
double median_of(std::vector<uint32_t> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
}  // namespace

bool Driver::preflight_on() const { return o_.preflight && o_.stragglers != StragglerPolicy::kOff; }

bool Driver::new_to_job(const std::string& host) const {
  return std::none_of(plan_.ranks.begin(), plan_.ranks.end(), [&](auto& r) { return r.slot.host == host; });
}

bool Driver::preflight_holds_back(Worker& w, const JoinRequest& j, const MembershipSnapshot& m) {
  const std::string& host = w.assignment.slot.host;
  if (!preflight_on() || (j.probe_us == 0 && j.link_us == 0) || !new_to_job(host)) return false;
  std::vector<uint32_t> probes, links;
  for (auto& member : m.members) {
    if (member.probe_us > 0) probes.push_back(member.probe_us);
    if (member.link_us > 0) links.push_back(member.link_us);
  }
  // The link probe against its bound and the members' that made one, then
  // the compute check against the members' (their own at their start): a
  // link past the bound is the plainer measure of the two (a busy machine
  // can slow a compute check several times over, docs/performance.md §14).
  std::string check, why;
  double took_ms = 0, median_ms = 0;
  const bool past_bound = j.link_us >= kLinkProbeBoundUs;
  const double links_median = links.empty() ? 0 : median_of(links);
  const double probes_median = probes.empty() ? 0 : median_of(probes);
  if (j.link_us > 0 && (past_bound || (!links.empty() && j.link_us > kPreflightFactor * links_median))) {
    check = "link";
    took_ms = j.link_us / 1e3;
    median_ms = past_bound ? 0 : links_median / 1e3;  // 0: the bound decided
    why = past_bound ? fmt::format("its link probe (1 MiB each way with a worker on another host) did not finish "
                                   "within {:.0f} ms",
                                   kLinkProbeBoundUs / 1e3)
                     : fmt::format("its link probe took {:.1f} ms, {:.1f}x the job's workers' median {:.1f} ms",
                                   took_ms, took_ms / median_ms, median_ms);
  } else if (j.probe_us > 0 && !probes.empty() && j.probe_us > kPreflightFactor * probes_median) {
    check = "compute";
    took_ms = j.probe_us / 1e3;
    median_ms = probes_median / 1e3;
    why = fmt::format("its pre-flight check took {:.0f} ms, {:.1f}x the job's workers' median {:.0f} ms", took_ms,
                      took_ms / median_ms, median_ms);
  }
  if (check.empty()) return false;
  const double rest_s = rest_slot(w.assignment.slot);
  ERUN_LOG_WARN("{}: held back: {}; its slot is tried again in {:.0f} s", who(rec_.generation, host, w.assignment.rank),
                why, rest_s);
  d_.events->emit(ev::PreflightHeldBack{.generation = rec_.generation,
                                        .host = host,
                                        .slot = w.assignment.slot.local_index,
                                        .check = check,
                                        .probe_ms = took_ms,
                                        .median_ms = median_ms,
                                        .cooldown = rest_s});
  w.handle->terminate();
  w.set_state(WorkerState::kDismissed);  // stopped on purpose: no failure of its host
  return true;
}

void Driver::note_probe_responders(const MembershipSnapshot& m) {
  // Members join a generation one by one: its list is final once it stops growing.
  const std::pair<long, size_t> key{m.generation, m.members.size()};
  if (key == probe_responders_.key) return;
  probe_responders_.key = key;
  probe_responders_.members.clear();
  std::set<std::string> hosts;
  for (auto& member : m.members) {
    if (member.probe_port == 0 || !hosts.insert(member.slot.host).second) continue;
    probe_responders_.members.emplace_back(member.slot, member.probe_port);
    if (probe_responders_.members.size() >= 8) break;  // a few hosts to choose from are enough
  }
}

std::string Driver::probe_peer_for(const std::string& host) const {
  if (!preflight_on() || !new_to_job(host)) return {};
  for (auto& [slot, port] : probe_responders_.members) {
    if (slot.host == host || !plan_.contains(slot)) continue;
    bool local = false;
    launcher_for(slot.host, &local);
    return fmt::format("{}:{}", advertise_address(slot.host, local), port);
  }
  return {};
}

bool Driver::resting(const SlotKey& slot) const {
  auto it = resting_.find(slot);
  return it != resting_.end() && it->second.active;
}

bool Driver::any_resting() const {
  return std::any_of(resting_.begin(), resting_.end(), [](const auto& r) { return r.second.active; });
}

Plan Driver::without_resting(Plan p) const {
  if (!any_resting()) return p;
  std::vector<SlotKey> kept;
  for (auto& r : p.ranks) {
    if (!resting(r.slot)) kept.push_back(r.slot);
  }
  if (kept.size() == p.ranks.size()) return p;
  return plan_over_slots(p.generation, kept);
}

}  // namespace erun
