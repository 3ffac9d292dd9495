// The GPU communicator's decisions that need no device: device selection,
// the identity a rank sends its peers, the backend choice from them, and the
// choice between shrinking the kept NCCL communicator and a new init.
#include <gtest/gtest.h>

#include "erun/errors.hpp"
#include "worker/gpu_plan.h"

namespace erun::gpu_plan {
namespace {

Identity gpu(const std::string& host, uint8_t id) {
  Identity g;
  g.host = host;
  g.uuid.fill(0xab);
  g.uuid[15] = id;
  g.has_device = true;
  return g;
}

TEST(GpuPlan, DeviceIsLocalRankModuloVisibleDevices) {
  EXPECT_EQ(select_device(0, 8), 0);
  EXPECT_EQ(select_device(5, 8), 5);
  EXPECT_EQ(select_device(9, 8), 1);
  EXPECT_EQ(select_device(3, 1), 0);  // CUDA_VISIBLE_DEVICES set per worker
  EXPECT_EQ(select_device(3, 2), 1);  // four ranks on two GPUs: two per GPU
  try {
    select_device(0, 0);
    FAIL() << "no device must be an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA device"), std::string::npos) << e.what();
  }
  EXPECT_THROW(select_device(-1, 4), Error);
}

TEST(GpuPlan, IdentityRoundTripsAndGarbageIsRefused) {
  Identity a = gpu("node-7.example", 3);
  Identity b = decode(encode(a), 2);
  EXPECT_EQ(b.host, a.host);
  EXPECT_EQ(b.uuid, a.uuid);
  EXPECT_TRUE(b.has_device);
  Identity none;
  none.host = "h";
  EXPECT_FALSE(decode(encode(none), 0).has_device);
  std::vector<char> bad = encode(a);
  bad[0] ^= 1;
  try {
    decode(bad, 5);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 5"), std::string::npos) << e.what();
  }
  EXPECT_THROW(decode(std::vector<char>(3), 1), Error);
}

TEST(GpuPlan, IdentityCarriesTheKeptCommunicator) {
  Identity a = gpu("h", 1);
  a.can_shrink = true;
  a.kept_generation = 1L << 40;
  a.kept_rank = 6;
  a.kept_size = 9;
  Identity b = decode(encode(a), 0);
  EXPECT_TRUE(b.can_shrink);
  EXPECT_EQ(b.kept_generation, 1L << 40);
  EXPECT_EQ(b.kept_rank, 6);
  EXPECT_EQ(b.kept_size, 9);
  EXPECT_EQ(b.host, "h");
  Identity none = decode(encode(gpu("h", 2)), 0);
  EXPECT_FALSE(none.can_shrink);
  EXPECT_EQ(none.kept_generation, -1);
}

// Ranks of a new generation that kept communicator `gen` of `size` ranks as the given old ranks.
std::vector<Identity> kept(long gen, int size, const std::vector<int>& old_ranks) {
  std::vector<Identity> out;
  for (int r : old_ranks) {
    Identity id = gpu("h" + std::to_string(r), 1);
    id.can_shrink = true;
    id.kept_generation = gen;
    id.kept_rank = r;
    id.kept_size = size;
    out.push_back(id);
  }
  return out;
}

TEST(GpuPlan, ShrinkWhenTheGenerationOnlyLostRanks) {
  ShrinkPlan p = plan_shrink(kept(4, 6, {0, 2, 3, 5}));
  EXPECT_TRUE(p.shrink) << p.reason;
  EXPECT_EQ(p.excluded, (std::vector<int>{1, 4}));
  EXPECT_NE(p.reason.find("2 of generation 4's 6 ranks"), std::string::npos) << p.reason;
  p = plan_shrink(kept(4, 2, {1}));
  EXPECT_TRUE(p.shrink) << p.reason;
  EXPECT_EQ(p.excluded, (std::vector<int>{0}));
}

TEST(GpuPlan, InitWhenAShrinkCannotGiveThisGeneration) {
  // Nobody left.
  EXPECT_FALSE(plan_shrink(kept(4, 3, {0, 1, 2})).shrink);
  // A newcomer (kept nothing).
  auto v = kept(4, 4, {0, 1, 3});
  v.push_back(gpu("new", 1));
  v.back().can_shrink = true;
  ShrinkPlan p = plan_shrink(v);
  EXPECT_FALSE(p.shrink);
  EXPECT_NE(p.reason.find("rank 3 kept no NCCL communicator"), std::string::npos) << p.reason;
  // Survivors renumbered out of order: NCCL's order would not be erun's.
  p = plan_shrink(kept(4, 4, {0, 3, 1}));
  EXPECT_FALSE(p.shrink);
  EXPECT_NE(p.reason.find("order"), std::string::npos) << p.reason;
  // Communicators of different generations.
  v = kept(4, 4, {0, 1});
  v[1].kept_generation = 3;
  EXPECT_FALSE(plan_shrink(v).shrink);
  // One NCCL without ncclCommShrink.
  v = kept(4, 4, {0, 1});
  v[0].can_shrink = false;
  p = plan_shrink(v);
  EXPECT_FALSE(p.shrink);
  EXPECT_NE(p.reason.find("rank 0's NCCL"), std::string::npos) << p.reason;
  EXPECT_FALSE(plan_shrink({}).shrink);
}

TEST(GpuPlan, NcclWhenEveryRankHasItsOwnGpu) {
  std::vector<Identity> ranks = {gpu("a", 0), gpu("a", 1), gpu("b", 0), gpu("b", 1)};
  // The same UUID on two hosts is two GPUs (containers may report clones).
  Choice c = choose_backend(ranks, /*nccl_built=*/true, GpuBackend::kAuto);
  EXPECT_EQ(c.backend, GpuBackend::kNccl);
}

TEST(GpuPlan, StagedWhenRanksShareAGpuAndTheReasonNamesThem) {
  std::vector<Identity> ranks = {gpu("a", 0), gpu("a", 1), gpu("a", 0)};
  Choice c = choose_backend(ranks, true, GpuBackend::kAuto);
  EXPECT_EQ(c.backend, GpuBackend::kStaged);
  EXPECT_NE(c.reason.find("ranks 0 and 2 share"), std::string::npos) << c.reason;
  EXPECT_NE(c.reason.find("on a"), std::string::npos) << c.reason;
}

TEST(GpuPlan, StagedWithoutNcclAndWhenRequested) {
  std::vector<Identity> ranks = {gpu("a", 0), gpu("a", 1)};
  EXPECT_EQ(choose_backend(ranks, false, GpuBackend::kAuto).backend, GpuBackend::kStaged);
  EXPECT_EQ(choose_backend(ranks, true, GpuBackend::kStaged).backend, GpuBackend::kStaged);
  EXPECT_EQ(choose_backend({gpu("a", 0)}, true, GpuBackend::kAuto).backend, GpuBackend::kNccl);
}

TEST(GpuPlan, ImpossibleRequestsAreErrorsNamingTheCause) {
  std::vector<Identity> shared = {gpu("a", 0), gpu("a", 0)};
  try {
    choose_backend(shared, true, GpuBackend::kNccl);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ranks 0 and 1 share"), std::string::npos) << e.what();
  }
  EXPECT_THROW(choose_backend({gpu("a", 0)}, false, GpuBackend::kNccl), Error);
  std::vector<Identity> missing = {gpu("a", 0), Identity{"b", {}, false}};
  try {
    choose_backend(missing, true, GpuBackend::kAuto);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 on b has no CUDA device"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace erun::gpu_plan
