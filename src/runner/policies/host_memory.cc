#include "runner/policies/host_memory.h"

#include <algorithm>
#include <set>
#include <utility>

#include "common/log.h"

namespace erun {

void HostMemoryKeeper::kept(const std::string& host, bool started) {
  auto it = hosts_.find(host);
  if (it != hosts_.end()) it->second.kept = started;
}

Actions HostMemoryKeeper::tend(const JobSnapshot& s, const std::function<bool(const std::string&)>& agent_alive,
                               const std::function<bool(const std::string&)>& blacklisted) {
  if (hosts_.empty() || s.now < next_tend_) return {};
  next_tend_ = s.now + std::chrono::seconds(1);
  const std::set<std::string> working = s.working_hosts();
  Actions out;
  for (auto& [host, hold] : hosts_) {
    if (working.count(host)) {
      // Its workers' agent holds the memory now: the keeper started for it goes.
      if (hold.kept) out.push_back(act::UnkeepMemory{host});
      hold = Hold{};
      continue;
    }
    // Out of discovery (or draining): nothing more is started there; its watchdog keeps
    // the memory for a while (docs/state.md, "Where a commit lives").
    if (agent_alive(host) || !s.usable(host)) {
      hold.missing_since = TimePoint{};
      continue;
    }
    if (hold.missing_since == TimePoint{}) hold.missing_since = s.now;
    // A host that gets workers again at once needs nothing: give the plan a
    // moment (the dead agent's watchdog waits kCommitAdoptGrace, 10 s).
    if (s.now - hold.missing_since < std::chrono::seconds(2) || s.now < hold.next_try) continue;
    ERUN_LOG_WARN("{}: its agent is gone and no worker runs there{}: starting an agent that holds the job's host "
                  "memory there (the newest commits may be only there)",
                  host, blacklisted(host) ? " (it is blacklisted)" : "");
    out.push_back(act::KeepMemory{host});
    hold.backoff = std::min<Duration>(std::max<Duration>(hold.backoff * 2, std::chrono::seconds(5)),
                                      std::chrono::seconds(60));
    hold.next_try = s.now + hold.backoff;
  }
  return out;
}

}  // namespace erun
