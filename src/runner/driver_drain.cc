// Draining: a host that leaves on notice (docs/design.md, "Draining a
// host"). Its agent said DRAINING (SIGTERM to the agent, or a worker's
// library took its own SIGTERM as a notice), or discovery lists it as
// `host[:slots] draining`. The host leaves the plan as if discovery had
// dropped it: its workers leave at their next commit (the announcement says
// it is a drain, so a program that checks between commits commits there
// first), the survivors go on in place, nothing is rolled back, and neither
// the host nor the job counts a failure. Workers still there after
// --drain-timeout are stopped as a failure.
#include <signal.h>

#include <algorithm>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "common/log.h"
#include "runner/driver.h"

namespace erun {

void Driver::take_drains() {
  Launcher* remote = d_.remote_launcher != d_.local_launcher ? d_.remote_launcher : nullptr;
  for (Launcher* l : {d_.local_launcher, remote}) {
    if (!l) continue;
    for (auto& [host, why] : l->take_drains()) start_drain(host, why, /*from_discovery=*/false);
  }
}

bool Driver::on_draining_host(const Worker& w) const { return drains_.count(w.assignment.slot.host) > 0; }

bool Driver::draining_members() const {
  // A straggler's slot that sits out leaves the same way.
  if (drains_.empty() && resting_.empty()) return false;
  return std::any_of(workers_.begin(), workers_.end(), [&](const Worker& w) {
    return survivor(w) && !w.pending() && (on_draining_host(w) || resting(w.assignment.slot));
  });
}

void Driver::start_drain(const std::string& host, const std::string& reason, bool from_discovery) {
  if (drains_.count(host)) return;
  int live = 0;
  for (auto& w : workers_) {
    if (survivor(w) && w.assignment.slot.host == host) ++live;
  }
  if (live == 0 && discovery_.listed.find(host) < 0) return;  // not the job's: nothing to drain
  ERUN_LOG_INFO("{}: host {} drains ({}): its {} worker{} leave{} the job at the next commit, with nothing rolled "
                "back (--drain-timeout {:g} s)",
                who(rec_.generation), host, reason, live, live == 1 ? "" : "s", live == 1 ? "s" : "",
                seconds(o_.drain_timeout));
  d_.events->emit(ev::HostDraining{.generation = rec_.generation, .host = host, .reason = reason, .workers = live});
  drains_[host] = Drain{reason, clock_.now(), from_discovery};
  apply_drains();
}

void Driver::apply_drains() {
  std::vector<Host> usable;
  for (const Host& h : discovery_.listed.hosts()) {
    if (drains_.count(h.name)) continue;
    Host kept = h;
    kept.draining = false;
    usable.push_back(std::move(kept));
  }
  discovery_.hosts = HostSet(std::move(usable));
  ++discovery_.epoch;
  discovery_.all_local = true;
  for (auto& h : discovery_.hosts.hosts()) {
    bool local;
    launcher_for(h.name, &local);
    discovery_.all_local = discovery_.all_local && local;
  }
}

void Driver::tend_drains(const MembershipSnapshot& m) {
  if (drains_.empty()) return;
  std::set<SlotKey> waiting;
  for (auto& j : m.waiting) waiting.insert(j.slot);
  bool changed = false;
  for (auto it = drains_.begin(); it != drains_.end();) {
    const std::string& host = it->first;
    Drain& d = it->second;
    const bool overdue = clock_.now() - d.since >= o_.drain_timeout;
    int left = 0;
    bool retired_killed = false;
    for (auto& w : workers_) {
      if (!w.alive() || w.assignment.slot.host != host) continue;
      ++left;
      if (w.state == WorkerState::kExcluded || w.state == WorkerState::kStopping) continue;
      if (w.state == WorkerState::kDismissed) continue;  // told to stop
      // Not in a generation yet, or out of its generation at a commit and
      // asking for the next one: its part is done.
      if (w.pending() || waiting.count(w.assignment.slot)) {
        ERUN_LOG_INFO("{}: host {} drains; stopping this worker", who(rec_.generation, host, w.assignment.rank), host);
        w.handle->terminate();
        w.set_state(WorkerState::kDismissed);
      } else if (overdue && !d.overdue) {
        ERUN_LOG_WARN("{}: host {} drains and this worker did not leave at a commit within --drain-timeout {:g} s; "
                      "it leaves as a failure (the survivors restore the last commit): commit more often than "
                      "the notice, or raise --drain-timeout",
                      who(rec_.generation, host, w.assignment.rank), host, seconds(o_.drain_timeout));
        // A member's end is the generation's failure, handled as any; a
        // retiring one's breaks the survivors' collectives, who restore:
        // a failure too, counted here.
        w.handle->kill();
        retired_killed = retired_killed || w.state == WorkerState::kRetiring;
      }
    }
    if (overdue) d.overdue = true;
    if (retired_killed) count_reset("worker failed");
    if (left == 0 && !d.drained) {
      d.drained = true;
      ERUN_LOG_INFO("{}: host {} drained in {:.2f} s", who(rec_.generation), host, seconds(clock_.now() - d.since));
      d_.events->emit(
          ev::HostDrained{.generation = rec_.generation, .host = host, .seconds = seconds(clock_.now() - d.since)});
    }
    // The drain ends once the host's workers are gone and discovery no
    // longer holds it out: a marked host listed without the mark, or a host
    // that left discovery (it may come back later and grow the job again).
    const int at = discovery_.listed.find(host);
    const bool ends = d.from_discovery ? (at < 0 || !discovery_.listed.hosts()[static_cast<size_t>(at)].draining) : at < 0;
    if (left == 0 && ends) {
      ERUN_LOG_INFO("host {}: no longer draining{}", host, at < 0 ? " (discovery dropped it)" : "");
      it = drains_.erase(it);
      changed = true;
    } else {
      ++it;
    }
  }
  if (changed) apply_drains();
}

}  // namespace erun
