// The job's host memory on each host (docs/state.md, "Where a commit
// lives"): its directory, the replicas on spare hosts, and an agent kept on
// every discovered host that holds the job's commits.
#include <algorithm>
#include <set>

#include "common/log.h"
#include "common/strings.h"
#include "runner/driver.h"

namespace erun {

std::string Driver::host_commit_dir(const std::string& host) const {
  // One directory per host, named after it: simulated hosts of one machine
  // (--launcher local, the tests' sshd on 127.0.0.N) keep apart what
  // separate machines would.
  return d_.commit_dir + "-" + host_file_name(host);
}

void Driver::tend_replicas() {
  if (!replicas_) return;
  // Planned again only when the plan cache was (the hosts, the blacklist or
  // the running plan changed): with 20,000 hosts a tick must not list them.
  if (plan_cache_.recomputations() != replicas_planned_at_) {
    replicas_planned_at_ = plan_cache_.recomputations();
    std::vector<std::string> holders, spares;
    std::set<std::string> seen;
    for (auto& r : plan_.ranks) {
      if (seen.insert(r.slot.host).second) holders.push_back(r.slot.host);
    }
    for (auto& h : plan_cache_.usable().hosts()) {
      if (seen.insert(h.name).second) spares.push_back(h.name);
    }
    // A blacklisted host still keeps, and is sent, replicas (after the
    // usable spares): its workers failed, not its memory, which may hold
    // the only other copy when the holders are lost.
    if (hosts_.epoch().blacklisted_now > 0) {
      for (auto& h : discovery_.hosts.hosts()) {
        if (hosts_.is_blacklisted(h.name) && seen.insert(h.name).second) spares.push_back(h.name);
      }
    }
    replicas_->plan(holders, spares);
  }
  replicas_->tick();
}

void Driver::tend_host_memory() {
  if (d_.commit_dir.empty() || memory_.hosts.empty()) return;
  if (phase_ == JobPhase::kStopping || phase_ == JobPhase::kFinishing || phase_ == JobPhase::kDone) return;
  const TimePoint now = clock_.now();
  if (now < memory_.next_tend) return;
  memory_.next_tend = now + std::chrono::seconds(1);
  std::set<std::string> working;
  for (auto& w : workers_) {
    if (!w.exit) working.insert(w.assignment.slot.host);
  }
  for (auto& [host, hold] : memory_.hosts) {
    bool local;
    Launcher& launcher = launcher_for(host, &local);
    if (working.count(host)) {
      // Its workers' agent holds the memory now: the keeper started for it goes.
      if (std::exchange(hold.kept, false)) launcher.unkeep(host, /*forget=*/false);
      hold = MemoryHold{};
      continue;
    }
    // Out of discovery: nothing more is started there; its watchdog keeps
    // the memory for a while (docs/state.md, "Where a commit lives").
    if (launcher.agent_alive(host) || discovery_.hosts.find(host) < 0) {
      hold.missing_since = TimePoint{};
      continue;
    }
    if (hold.missing_since == TimePoint{}) hold.missing_since = now;
    // A host that gets workers again at once needs nothing: give the plan a
    // moment (the dead agent's watchdog waits kCommitAdoptGrace, 10 s).
    if (now - hold.missing_since < std::chrono::seconds(2) || now < hold.next_try) continue;
    ERUN_LOG_WARN("{}: its agent is gone and no worker runs there{}: starting an agent that holds the job's host "
                  "memory there (the newest commits may be only there)",
                  host, hosts_.is_blacklisted(host) ? " (it is blacklisted)" : "");
    hold.kept = launcher.keep(host, host_commit_dir(host), d_.secret);
    hold.backoff = std::min<Duration>(std::max<Duration>(hold.backoff * 2, std::chrono::seconds(5)),
                                      std::chrono::seconds(60));
    hold.next_try = now + hold.backoff;
  }
}

}  // namespace erun
