// DriverRecord: the part of a driver's state that must outlive it, in one
// value: what a new driver takes the job over from (the job record,
// job_record.h, is this plus how to reach the job: its secret, agents and
// command). Driver::record() makes it from the parts that own each field,
// and a takeover gives it back to them (Driver::take_over()); nothing else
// crosses from one driver to the next.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "rendezvous/membership.h"
#include "runner/host_manager.h"

namespace erun {

struct DriverRecord {
  long generation = 0;        // the last published generation: the next one goes on after it
  int resets = 0;             // --reset-limit counts on
  int restarts = 0;           // generations started after the first (TORCHELASTIC_RESTART_COUNT)
  bool in_place = false;      // the workers joined the rendezvous (erun's library): they re-join in place
  std::vector<SlotKey> plan;  // the running plan's slots, rank i at index i
  // The hosts' failures and blacklistings (HostManager::history()), each
  // blacklisting's time left as of the record (to the millisecond).
  std::vector<HostHistory> hosts;
  // The commit replicas' keepers (--commit-replicas): keeper host -> the
  // holder host that pushes to it (CommitReplicas::keepers()).
  std::map<std::string, std::string> keepers;
  bool operator==(const DriverRecord&) const = default;
};

}  // namespace erun
