// DriverRecord: the driver's state that must outlive it, in one value, and
// the running driver's storage of it: the driver keeps its generation,
// counts and plan here, HostManager the hosts' histories and CommitReplicas
// its keepers; what they hold beside (the Plan's ranks, the blacklist now)
// is changed with it or read off it. A new driver starts from the record
// its job record (job_record.h: this plus how to reach the job) carries
// over, and goes on from there.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "rendezvous/membership.h"
#include "runner/hosts/host_manager.h"

namespace erun {

struct DriverRecord {
  long generation = 0;        // the last published generation: the next one goes on after it
  int resets = 0;             // --reset-limit counts on
  int restarts = 0;           // generations started after the first (TORCHELASTIC_RESTART_COUNT)
  long launched = 0;          // worker processes started over the whole job (job_finished's `launched`)
  // A member of the running plan joined the rendezvous (the workers use
  // erun's library: they re-join in place); of the workers, as of the
  // driver's last step.
  bool in_place = false;
  std::vector<SlotKey> plan;  // the running plan's slots, rank i at index i (Driver::plan() holds their ranks)
  HostHistories hosts;        // the hosts' failures and blacklistings (HostManager's)
  // The commit replicas' keepers (--commit-replicas): keeper host -> the
  // holder host that pushes to it (CommitReplicas's).
  std::map<std::string, std::string> keepers;
  bool operator==(const DriverRecord&) const = default;
};

}  // namespace erun
