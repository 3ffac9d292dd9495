// The job's host memory on each host (docs/state.md, "Where a commit
// lives"): its directory and the replicas on spare hosts (the agents kept
// on hosts that hold the job's commits: runner/policies/host_memory.h).
#include <algorithm>
#include <set>

#include "common/log.h"
#include "common/strings.h"
#include "runner/driver.h"

namespace erun {

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

}  // namespace erun
