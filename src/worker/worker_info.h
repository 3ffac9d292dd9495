// The public WorkerInfo (include/erun/erun.hpp) of a Topology: the one place
// where its fields are copied from the internal type.
#pragma once

#include <string>

#include "common/topology.h"
#include "erun/erun.hpp"

namespace erun {

inline WorkerInfo worker_info(const Topology& t, std::string host) {
  WorkerInfo i;
  i.rank = t.rank;
  i.size = t.size;
  i.local_rank = t.local_rank;
  i.local_size = t.local_size;
  i.cross_rank = t.cross_rank;
  i.cross_size = t.cross_size;
  i.generation = t.generation;
  i.host = std::move(host);
  return i;
}

}  // namespace erun
