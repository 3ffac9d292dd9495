// topology_env: every field of a Topology reaches the worker under erun's name
// and the torchrun-style name, each from its own field (values chosen distinct
// so that a crossed field shows).
#include <gtest/gtest.h>

#include <map>

#include "common/topology.h"

namespace erun {
namespace {

TEST(Topology, EnvNamesEveryFieldOnce) {
  Topology t;
  t.rank = 5;
  t.size = 12;
  t.local_rank = 1;
  t.local_size = 3;
  t.cross_rank = 2;
  t.cross_size = 4;
  t.generation = 77;
  std::map<std::string, std::string> env;
  for (auto& [k, v] : topology_env(t)) EXPECT_TRUE(env.emplace(k, v).second) << k << " twice";
  const std::map<std::string, std::string> want = {
      {"ERUN_RANK", "5"},        {"ERUN_SIZE", "12"},      {"ERUN_LOCAL_RANK", "1"}, {"ERUN_LOCAL_SIZE", "3"},
      {"ERUN_CROSS_RANK", "2"},  {"ERUN_CROSS_SIZE", "4"}, {"ERUN_GENERATION", "77"}, {"RANK", "5"},
      {"WORLD_SIZE", "12"},      {"LOCAL_RANK", "1"},      {"LOCAL_WORLD_SIZE", "3"},
      {"ROLE_RANK", "5"},        {"ROLE_WORLD_SIZE", "12"},
  };
  EXPECT_EQ(env, want);
}

TEST(Topology, EqualityCoversTheGeneration) {
  Topology a, b;
  EXPECT_EQ(a, b);
  b.generation = 1;
  EXPECT_NE(a, b);
}

}  // namespace
}  // namespace erun
