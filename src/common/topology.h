// Topology: where one rank sits in one generation of the job: its rank in the
// world, on its host (local) and among the hosts (cross, as Horovod defines
// it: for a host's first rank, the host's index and the number of hosts), and
// the generation these numbers hold for. The one type the rendezvous'
// assignment, the worker's Context, the hierarchical communicator's options
// and the worker environment share, so that these fields are never copied one
// by one. WorkerInfo (include/erun/erun.hpp) is the public view of it.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace erun {

struct Topology {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  int cross_rank = 0;
  int cross_size = 1;
  long generation = 0;
  bool operator==(const Topology&) const = default;
};

// The variables a worker process of this topology starts with: erun's own
// (ERUN_RANK, ERUN_SIZE, ERUN_LOCAL_RANK, ERUN_LOCAL_SIZE, ERUN_CROSS_RANK,
// ERUN_CROSS_SIZE, ERUN_GENERATION) and the names torchrun-style programs read
// (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, ROLE_RANK, ROLE_WORLD_SIZE).
// Not GROUP_RANK: torchrun's node index is not the cross rank where hosts
// have unequal slots, and only the driver, which has the plan, knows it.
std::vector<std::pair<std::string, std::string>> topology_env(const Topology& t);

}  // namespace erun
