// ElasticSampler: deterministic permutations, and exactly-once coverage of an
// epoch across arbitrary resizes when ranks take their next_batch() shares.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "erun/erun.hpp"
#include "state_fake_world.h"

namespace erun {
namespace {

std::vector<size_t> epoch_order(size_t n, uint64_t seed, uint64_t epoch, bool shuffle = true) {
  ElasticSampler s(n, seed, shuffle);
  s.set_epoch(epoch);
  s.reset(0, 1);
  return s.indices();
}

TEST(ElasticSampler, PermutationIsDeterministicAndDependsOnSeedAndEpoch) {
  const size_t n = 500;
  std::vector<size_t> a = epoch_order(n, 42, 0);
  EXPECT_EQ(a, epoch_order(n, 42, 0));
  std::vector<size_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(sorted[i], i);
  EXPECT_NE(a, epoch_order(n, 42, 1));
  EXPECT_NE(a, epoch_order(n, 43, 0));
  EXPECT_NE(epoch_order(n, 42, 1), epoch_order(n, 42, 2));
  std::vector<size_t> identity(n);
  for (size_t i = 0; i < n; ++i) identity[i] = i;
  EXPECT_NE(a, identity);
  EXPECT_EQ(epoch_order(n, 42, 3, /*shuffle=*/false), identity);
}

TEST(ElasticSampler, KnownFirstValuesPinTheGenerator) {
  // The order must not change between builds or machines: resumed jobs rely on it.
  // (splitmix64 + Fisher-Yates with rejection sampling; see docs/state.md.)
  EXPECT_EQ(epoch_order(10, 1, 0), (std::vector<size_t>{7, 6, 1, 4, 8, 5, 2, 3, 0, 9}));
}

TEST(ElasticSampler, StridedSplitCoversTheRemainingSamples) {
  ElasticSampler s(103, 9);
  std::vector<size_t> all = epoch_order(103, 9, 0);
  s.record_batch(10);
  std::multiset<size_t> seen;
  for (int r = 0; r < 4; ++r) {
    s.reset(r, 4);
    for (size_t i : s.indices()) seen.insert(i);
  }
  EXPECT_EQ(seen, std::multiset<size_t>(all.begin() + 10, all.end()));
  EXPECT_EQ(s.remaining(), 93u);
}

TEST(ElasticSampler, SetEpochWithTheCurrentEpochKeepsProgress) {
  ElasticSampler s(50, 3);
  s.set_epoch(2);
  s.record_batch(20);
  s.set_epoch(2);
  EXPECT_EQ(s.processed(), 20u);
  s.set_epoch(3);
  EXPECT_EQ(s.processed(), 0u);
  EXPECT_EQ(s.remaining(), 50u);
}

// Random sequences of world sizes (1..8) and batch sizes: every rank takes its
// next_batch share; the union over an epoch is every index exactly once.
TEST(ElasticSampler, EverySampleOnceAcrossRandomResizes) {
  std::mt19937_64 rng(12345);  // only drives the test's choices
  for (int trial = 0; trial < 50; ++trial) {
    const size_t n = 1 + rng() % 700;
    ElasticSampler s(n, rng(), true);
    for (uint64_t epoch = 0; epoch < 2; ++epoch) {
      s.set_epoch(epoch + 1);
      std::vector<int> count(n, 0);
      int size = 1 + static_cast<int>(rng() % 8);
      while (s.remaining() > 0) {
        if (rng() % 3 == 0) size = 1 + static_cast<int>(rng() % 8);
        const size_t batch = 1 + rng() % 40;
        const size_t before = s.remaining();
        size_t taken = 0;
        for (int r = 0; r < size; ++r) {
          s.reset(r, size);
          for (size_t i : s.next_batch(batch)) {
            ++count[i];
            ++taken;
          }
        }
        ASSERT_EQ(taken, std::min(batch, before));
        s.record_batch(batch);
        ASSERT_EQ(s.remaining(), before - taken);
      }
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(count[i], 1) << "trial " << trial << " epoch " << epoch << " index " << i;
      }
    }
  }
}

TEST(ElasticSampler, RegisteredPositionTravelsWithTheState) {
  testing::FakeHub hub(1);
  testing::FakeContext ctx(hub, 0);
  State st(ctx);
  ElasticSampler s(100, 5);
  s.register_with(st);
  s.set_epoch(1);
  s.reset(0, 1);
  s.record_batch(30);
  st.commit();
  std::vector<size_t> at_commit = s.indices();
  s.record_batch(30);
  s.set_epoch(2);
  st.restore();
  EXPECT_EQ(s.epoch(), 1u);
  EXPECT_EQ(s.processed(), 30u);
  EXPECT_EQ(s.indices(), at_commit);
}

}  // namespace
}  // namespace erun
