#include "runner/policies/straggler_watch.h"

#include <algorithm>
#include <cmath>
#include <set>

#include <fmt/format.h>

#include "common/log.h"

namespace erun {

namespace {
constexpr double kMinGain = 0.2;          // eviction must make the job at least this much faster
constexpr double kPreflightFactor = 3.0;  // a new host this much slower at the check is held back

double median_of(std::vector<uint32_t> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
}  // namespace

bool new_to_job(const Plan& running, const std::string& host) {
  return std::none_of(running.ranks.begin(), running.ranks.end(), [&](auto& r) { return r.slot.host == host; });
}

StragglerWatch::StragglerWatch(const DriverOptions& o)
    : mode_(o.stragglers),
      window_(o.straggler_window),
      cooldown_min_s_(o.cooldown_min_s),
      cooldown_max_s_(o.cooldown_max_s),
      preflight_(o.preflight),
      detector_(StragglerOptions{o.straggler_factor, o.straggler_window}) {}

Actions StragglerWatch::watch(const JobSnapshot& s, const std::vector<RankTiming>& timings) {
  Actions out;
  for (auto& [slot, rest] : resting_) {
    if (rest.active && s.now >= rest.until) {
      rest.active = false;
      ERUN_LOG_INFO("{}: {}[{}]: its straggler cooldown ended; the slot may grow the job again", who(s.generation),
                    slot.host, slot.local_index);
      out.push_back(act::SlotsChanged{});  // the plans see the slot again
    }
  }
  if (mode_ == StragglerPolicy::kOff) return out;
  if (s.complete && detector_gen_ != s.generation) {
    std::vector<SlotKey> members;
    for (auto& r : s.running().ranks) members.push_back(r.slot);
    detector_.start_generation(s.generation, members);
    detector_gen_ = s.generation;
  }
  for (auto& t : timings) detector_.add(t);
  for (const Straggler& found : detector_.take_found()) {
    Actions more = decide(s, found);
    out.insert(out.end(), more.begin(), more.end());
  }
  return out;
}

Actions StragglerWatch::decide(const JobSnapshot& s, const Straggler& found) {
  if (found.generation != s.generation) return {};
  const RankAssignment* a = s.running().find(found.slot);
  if (!a) return {};
  std::string verdict;
  bool evict = false;
  if (mode_ == StragglerPolicy::kReport) {
    verdict = "reported only (--stragglers report)";
  } else if (!s.in_place) {
    verdict = "reported only (restart mode restarts every worker to leave one out)";
  } else if (s.running().size() - 1 < std::max(s.min_np, 1)) {
    verdict = fmt::format("reported, not left out: the job would run below --min-np {}", s.min_np);
  } else if (found.gain() < kMinGain) {
    verdict = fmt::format("reported, not left out: the job would run only {:.0f} % faster without it",
                          100 * found.gain());
  } else {
    evict = true;
  }
  Actions out;
  double rest_s = 0;
  if (evict) {
    rest_s = rest_slot(found.slot, s.now);
    out.push_back(act::SlotsChanged{});  // the plans leave the slot out from now on
    verdict = fmt::format("it leaves the job at the next commit, and its slot sits out {:.0f} s", rest_s);
  }
  ERUN_LOG_WARN("{}: straggler: it computes {:.1f}x as long as the others in {} commit intervals in a row (an "
                "interval takes {:.2f} s, about {:.2f} s without it); {}",
                who(s.generation, found.slot.host, a->rank), found.factor, window_, found.interval_s,
                found.without_s, verdict);
  out.push_back(act::Emit{ev::Straggler{.generation = s.generation,
                                        .host = found.slot.host,
                                        .slot = found.slot.local_index,
                                        .rank = a->rank,
                                        .factor = found.factor,
                                        .interval = found.interval_s,
                                        .without = found.without_s,
                                        .action = evict ? "evict" : "report",
                                        .cooldown = rest_s}});
  return out;
}

double StragglerWatch::rest_slot(const SlotKey& slot, TimePoint now) {
  Rest& rest = resting_[slot];
  const double s = std::min(cooldown_min_s_ * std::pow(2.0, rest.times), cooldown_max_s_);
  rest.times += 1;
  rest.active = true;
  rest.until = now + from_seconds(s);
  return s;
}

bool StragglerWatch::preflight_on() const { return preflight_ && mode_ != StragglerPolicy::kOff; }

Actions StragglerWatch::preflight(const JobSnapshot& s, const WorkerView& w, const JoinRequest& j,
                                  const MembershipSnapshot& m) {
  const std::string& host = w.assignment.slot.host;
  if (!preflight_on() || (j.probe_us == 0 && j.link_us == 0) || !new_to_job(s.running(), host)) return {};
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
  if (check.empty()) return {};
  const double rest_s = rest_slot(w.assignment.slot, s.now);
  ERUN_LOG_WARN("{}: held back: {}; its slot is tried again in {:.0f} s", who(s.generation, host, w.assignment.rank),
                why, rest_s);
  return {act::SlotsChanged{},
          act::Emit{ev::PreflightHeldBack{.generation = s.generation,
                                          .host = host,
                                          .slot = w.assignment.slot.local_index,
                                          .check = check,
                                          .probe_ms = took_ms,
                                          .median_ms = median_ms,
                                          .cooldown = rest_s}},
          act::Dismiss{w.key}};  // stopped on purpose: no failure of its host
}

void StragglerWatch::note_probe_responders(const MembershipSnapshot& m) {
  // Members join a generation one by one: its list is final once it stops growing.
  const std::pair<long, size_t> key{m.generation, m.members.size()};
  if (key == responders_key_) return;
  responders_key_ = key;
  responders_.clear();
  std::set<std::string> hosts;
  for (auto& member : m.members) {
    if (member.probe_port == 0 || !hosts.insert(member.slot.host).second) continue;
    responders_.emplace_back(member.slot, member.probe_port);
    if (responders_.size() >= 8) break;  // a few hosts to choose from are enough
  }
}

std::optional<std::pair<SlotKey, uint32_t>> StragglerWatch::probe_peer_for(const std::string& host,
                                                                           const Plan& running) const {
  if (!preflight_on() || !new_to_job(running, host)) return std::nullopt;
  for (auto& [slot, port] : responders_) {
    if (slot.host != host && running.contains(slot)) return std::make_pair(slot, port);
  }
  return std::nullopt;
}

bool StragglerWatch::resting(const SlotKey& slot) const {
  auto it = resting_.find(slot);
  return it != resting_.end() && it->second.active;
}

bool StragglerWatch::any_resting() const {
  return std::any_of(resting_.begin(), resting_.end(), [](const auto& r) { return r.second.active; });
}

Plan StragglerWatch::without_resting(Plan p) const {
  if (!any_resting()) return p;
  std::vector<SlotKey> kept;
  for (auto& r : p.ranks) {
    if (!resting(r.slot)) kept.push_back(r.slot);
  }
  if (kept.size() == p.ranks.size()) return p;
  return plan_over_slots(p.generation, kept);
}

MembershipSnapshot StragglerWatch::look(Membership* membership) {
  if (!membership) return {};
  MembershipSnapshot m = membership->snapshot();
  note_probe_responders(m);
  return m;
}

}  // namespace erun
