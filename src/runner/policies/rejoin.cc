#include "runner/policies/rejoin.h"

#include <signal.h>

#include <algorithm>
#include <set>

#include "common/log.h"

namespace erun {

Duration RejoinDeadlines::survivor_limit(bool after_failure) const {
  return after_failure ? std::min<Duration>(rendezvous_timeout_, collective_timeout_ + std::chrono::seconds(1))
                       : rendezvous_timeout_;
}

bool RejoinDeadlines::due(TimePoint published_at, bool after_failure, TimePoint now) const {
  return now - published_at >= std::min(survivor_limit(after_failure), rendezvous_timeout_);
}

Actions RejoinDeadlines::watch(const JobSnapshot& s, const MembershipSnapshot& m) const {
  if (s.complete || !due(s.published_at, s.after_failure, s.now)) return {};
  const Duration waited = s.now - s.published_at;
  std::set<SlotKey> joined;
  for (auto& j : m.members) joined.insert(j.slot);
  for (auto& j : m.waiting) joined.insert(j.slot);
  Actions out;
  for (const WorkerView& w : s.workers) {
    if (!w.alive || w.left_out() || w.pending() || joined.count(w.assignment.slot)) continue;
    if (!w.joined && mode_ != WorkerMode::kElastic) continue;  // a restart-mode program never joins
    const bool fresh = w.launched_generation == s.generation;
    const Duration limit = fresh ? rendezvous_timeout_ : survivor_limit(s.after_failure);
    if (waited < limit) continue;
    ERUN_LOG_WARN("{}: did not join generation {} within {:.0f} s ({}); killing it",
                  who(s.generation, w.assignment.slot.host, w.assignment.rank), s.generation, seconds(limit),
                  limit == rendezvous_timeout_ ? "--rendezvous-timeout" : "--collective-timeout + 1 s after a failure");
    out.push_back(act::FailGeneration{w.assignment.slot.host, w.assignment.rank, ExitStatus{0, SIGKILL},
                                      {"did not re-join within --rendezvous-timeout"}, seconds(s.now - w.started)});
    out.push_back(act::Exclude{w.key});  // killed: never planned again, even before it is reaped
  }
  return out;
}

Actions retire_due(const JobSnapshot& s) {
  Actions out;
  for (const WorkerView& w : s.workers) {
    if (w.state != WorkerState::kRetiring || !w.alive) continue;  // a dismissed one may take --term-grace
    if (s.waiting.count(w.assignment.slot) || s.now >= w.retire_by) {
      ERUN_LOG_INFO("{}: slot left the job; stopping its worker", who(s.generation, w.assignment.slot.host,
                                                                      w.assignment.rank));
      out.push_back(act::Dismiss{w.key});
    }
  }
  return out;
}

}  // namespace erun
