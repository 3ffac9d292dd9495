// Hosts that left discovery keep no agent of the job (docs/design.md,
// "Policies"). An agent lives as long as its connection to erun: without
// this, a host that discovery stopped listing kept its agent, its watchdog
// and the job's host memory until the job ended, and erun a thread and
// three descriptors for it; with host names that change (pod IPs,
// autoscaled nodes) that grew without bound. Once a host that discovery
// dropped runs no live worker of the job (its workers were dismissed or
// ended) and keeps no commit replica, its agent is released (SHUTDOWN). A
// host listed again gets a new agent with its next worker.
#pragma once

#include <functional>
#include <set>
#include <string>

#include "runner/policies/policy.h"

namespace erun {

class DepartedHosts {
 public:
  // Discovery's list went from `before` to `after` (the driver tells every
  // change): the hosts it dropped are departed; a host listed again is not.
  // O(hosts).
  void listed(const HostSet& before, const HostSet& after);
  // Departed hosts not released yet.
  size_t pending() const { return hosts_.size(); }
  // tend() has something to look at now (at most once a second).
  bool due(TimePoint now) const { return !hosts_.empty() && now >= next_tend_; }
  // ReleaseAgent for each departed host that runs no live worker of the job
  // and keeps no commit replica (`keeps(host)`); a released host is
  // forgotten until discovery drops it again.
  Actions tend(const JobSnapshot& s, const std::function<bool(const std::string&)>& keeps);

 private:
  std::set<std::string> hosts_;  // dropped by discovery, agent not released yet
  TimePoint next_tend_{};
};

}  // namespace erun
