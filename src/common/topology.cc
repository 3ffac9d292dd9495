#include "common/topology.h"

namespace erun {

std::vector<std::pair<std::string, std::string>> topology_env(const Topology& t) {
  auto s = [](long v) { return std::to_string(v); };
  return {
      {"ERUN_RANK", s(t.rank)},
      {"ERUN_SIZE", s(t.size)},
      {"ERUN_LOCAL_RANK", s(t.local_rank)},
      {"ERUN_LOCAL_SIZE", s(t.local_size)},
      {"ERUN_CROSS_RANK", s(t.cross_rank)},
      {"ERUN_CROSS_SIZE", s(t.cross_size)},
      {"ERUN_GENERATION", s(t.generation)},
      {"RANK", s(t.rank)},
      {"WORLD_SIZE", s(t.size)},
      {"LOCAL_RANK", s(t.local_rank)},
      {"LOCAL_WORLD_SIZE", s(t.local_size)},
      {"ROLE_RANK", s(t.rank)},
      {"ROLE_WORLD_SIZE", s(t.size)},
  };
}

}  // namespace erun
