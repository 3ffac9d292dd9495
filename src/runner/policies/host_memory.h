// The job's host memory (docs/state.md, "Where a commit lives"): every
// discovered host that holds the job's commits keeps a live agent. A host
// whose agent was lost and that runs no worker now (it is blacklisted, or
// waits for a place) gets an agent that only holds the memory (KEEP),
// before the dead agent's watchdog gives the memory up; once the host runs
// workers again, their agent holds it and the keeper goes.
#pragma once

#include <functional>
#include <map>
#include <string>

#include "runner/policies/policy.h"

namespace erun {

class HostMemoryKeeper {
 public:
  // A host got a worker of the job: it holds the job's host memory from now on.
  void holds(const std::string& host) { hosts_.try_emplace(host); }
  // tend() has something to look at now (at most once a second).
  bool due(TimePoint now) const { return !hosts_.empty() && now >= next_tend_; }
  // Each turn (at most once a second): KeepMemory for each discovered host
  // that holds the memory, runs no worker and has no live agent
  // (`agent_alive`), tried again with a backoff; UnkeepMemory where a kept
  // host runs workers again. `blacklisted` is for the log line.
  Actions tend(const JobSnapshot& s, const std::function<bool(const std::string&)>& agent_alive,
               const std::function<bool(const std::string&)>& blacklisted);
  // Whether the KeepMemory for `host` started an agent there.
  void kept(const std::string& host, bool started);
  // `host` left the job (discovery dropped it and its agent was released):
  // it holds nothing of the job's any more.
  void forget(const std::string& host) { hosts_.erase(host); }

 private:
  struct Hold {
    TimePoint missing_since{};  // its agent was first seen gone (zero: it has one)
    TimePoint next_try{};
    Duration backoff{};
    bool kept = false;  // a keeper agent was started there
  };
  std::map<std::string, Hold> hosts_;  // hosts that ran workers of the job
  TimePoint next_tend_{};
};

}  // namespace erun
