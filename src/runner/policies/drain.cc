#include "runner/policies/drain.h"

#include <utility>

#include "common/log.h"

namespace erun {

Actions DrainPolicy::start(const JobSnapshot& s, const std::string& host, const std::string& reason,
                           bool from_discovery) {
  if (drains_.count(host)) return {};
  int live = 0;
  for (const WorkerView& w : s.workers) {
    if (w.survivor() && w.assignment.slot.host == host) ++live;
  }
  if (live == 0 && !s.discovered(host)) return {};  // not the job's: nothing to drain
  ERUN_LOG_INFO("{}: host {} drains ({}): its {} worker{} leave{} the job at the next commit, with nothing rolled "
                "back (--drain-timeout {:g} s)",
                who(s.generation), host, reason, live, live == 1 ? "" : "s", live == 1 ? "s" : "", seconds(timeout_));
  drains_[host] = Drain{reason, s.now, from_discovery};
  return {act::Emit{ev::HostDraining{.generation = s.generation, .host = host, .reason = reason, .workers = live}},
          act::HostsChanged{}};
}

HostSet DrainPolicy::usable(const HostSet& listed) const {
  std::vector<Host> usable;
  for (const Host& h : listed.hosts()) {
    if (drains_.count(h.name)) continue;
    Host kept = h;
    kept.draining = false;
    usable.push_back(std::move(kept));
  }
  return HostSet(std::move(usable));
}

bool DrainPolicy::ends(const JobSnapshot& s, const std::string& host, const Drain& d, int left) const {
  if (left > 0) return false;
  const int at = s.listed ? s.listed->find(host) : -1;
  if (at < 0) return true;  // it left discovery (it may come back later and grow the job again)
  return d.from_discovery && !s.listed->hosts()[static_cast<size_t>(at)].draining;
}

Actions DrainPolicy::tend(const JobSnapshot& s) {
  Actions out;
  bool changed = false;
  for (auto it = drains_.begin(); it != drains_.end();) {
    const std::string& host = it->first;
    Drain& d = it->second;
    const bool overdue = s.now - d.since >= timeout_;
    int left = 0;
    bool retired_killed = false;
    for (const WorkerView& w : s.workers) {
      if (!w.alive || w.assignment.slot.host != host) continue;
      ++left;
      if (w.state == WorkerState::kExcluded || w.state == WorkerState::kStopping) continue;
      if (w.state == WorkerState::kDismissed) continue;  // told to stop
      // Not in a generation yet, or out of its generation at a commit and
      // asking for the next one: its part is done.
      if (w.pending() || s.waiting.count(w.assignment.slot)) {
        ERUN_LOG_INFO("{}: host {} drains; stopping this worker", who(s.generation, host, w.assignment.rank), host);
        out.push_back(act::Dismiss{w.key});
      } else if (overdue && !d.overdue) {
        ERUN_LOG_WARN("{}: host {} drains and this worker did not leave at a commit within --drain-timeout {:g} s; "
                      "it leaves as a failure (the survivors restore the last commit): commit more often than "
                      "the notice, or raise --drain-timeout",
                      who(s.generation, host, w.assignment.rank), host, seconds(timeout_));
        // A member's end is the generation's failure, handled as any; a
        // retiring one's breaks the survivors' collectives, who restore:
        // a failure too, counted here.
        out.push_back(act::Kill{w.key});
        retired_killed = retired_killed || w.state == WorkerState::kRetiring;
      }
    }
    if (overdue) d.overdue = true;
    if (retired_killed) out.push_back(act::CountReset{"worker failed"});
    if (left == 0 && !d.drained) {
      d.drained = true;
      ERUN_LOG_INFO("{}: host {} drained in {:.2f} s", who(s.generation), host, seconds(s.now - d.since));
      out.push_back(act::Emit{
          ev::HostDrained{.generation = s.generation, .host = host, .seconds = seconds(s.now - d.since)}});
    }
    if (ends(s, host, d, left)) {
      ERUN_LOG_INFO("host {}: no longer draining{}", host, s.discovered(host) ? "" : " (discovery dropped it)");
      it = drains_.erase(it);
      changed = true;
    } else {
      ++it;
    }
  }
  if (changed) out.push_back(act::HostsChanged{});
  return out;
}

}  // namespace erun
