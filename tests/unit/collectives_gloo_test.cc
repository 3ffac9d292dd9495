// GlooCommunicator with ranks as threads over a MemoryKvStore: every operation,
// type and reduction against a serial reference, world sizes 1 to 4; timeouts
// and abort().
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <mutex>
#include <numeric>
#include <thread>

#include "support/collective_checks.h"
#include "support/rank_threads.h"
#include "collectives/gloo/gloo_communicator.h"
#include "store/memory_store.h"

namespace erun {
namespace {

using namespace std::chrono_literals;

GlooOptions options(int rank, int size, Duration timeout = 60s) {
  GlooOptions o;
  o.rank = rank;
  o.size = size;
  o.timeout = timeout;
  return o;
}

// Runs fn(rank, comm) on `size` threads, each with its own communicator, and
// rethrows the first exception a rank raised.
void run_ranks(int size, const std::function<void(int, Communicator&)>& fn, Duration timeout = 60s) {
  auto backend = testing::backend("gloo", [timeout](KvStore& store, int rank, int n) {
    return make_gloo_communicator(store, options(rank, n, timeout));
  });
  testing::run_comms(backend, size, fn);
}

// Ranks 0 and 1 of a world of two, connected (each made on its own thread,
// as connecting needs both); the tests then use rank 0 alone.
struct TwoRanks {
  std::unique_ptr<Communicator> c0, c1;
};
TwoRanks connect_two(KvStore& store, const GlooOptions& o0, const GlooOptions& o1) {
  TwoRanks t;
  std::thread other([&] { t.c1 = make_gloo_communicator(store, o1); });
  t.c0 = make_gloo_communicator(store, o0);
  other.join();
  return t;
}

class GlooWorld : public ::testing::TestWithParam<int> {};

TEST_P(GlooWorld, AllreduceEveryTypeAndOpMatchesSerialReference) {
  run_ranks(GetParam(), [](int rank, Communicator& comm) {
    testing::check_allreduce_every_cpu_type(rank, comm, {0, 1, 7, 1000});
  });
}

// The ring's steps over 1 to 4 ranks: blocks of every size, empty ones
// (the chunk split's short tail, one rank holding all), every type and op.
TEST_P(GlooWorld, ReduceScatterGivesEachRankItsBlock) {
  run_ranks(GetParam(), [](int rank, Communicator& comm) {
    testing::check_reduce_scatter<float>(rank, comm, {0, 1, 5, 1001});
    testing::check_reduce_scatter<int64_t>(rank, comm, {3, 4096});
    testing::check_reduce_scatter<uint8_t>(rank, comm, {7});
  });
}

TEST_P(GlooWorld, LargeFloatSum) {
  const size_t n = (8u << 20) / sizeof(float);  // 8 MiB
  run_ranks(GetParam(), [&](int rank, Communicator& comm) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>((i % 1024) * (rank + 1));
    comm.allreduce(v, ReduceOp::kSum);
    const int s = comm.size();
    const float factor = static_cast<float>(s * (s + 1) / 2);
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) bad += v[i] != static_cast<float>(i % 1024) * factor;
    EXPECT_EQ(bad, 0u) << "rank " << rank;
  });
}

TEST_P(GlooWorld, AllreduceValueHelpers) {
  run_ranks(GetParam(), [](int rank, Communicator& comm) {
    EXPECT_EQ(comm.allreduce_value<int64_t>(rank + 1, ReduceOp::kSum), comm.size() * (comm.size() + 1) / 2);
    EXPECT_EQ(comm.allreduce_value<int32_t>(rank, ReduceOp::kMax), comm.size() - 1);
    EXPECT_DOUBLE_EQ(comm.allreduce_value<double>(rank, ReduceOp::kAverage), (comm.size() - 1) / 2.0);
    // Integer average truncates toward zero.
    EXPECT_EQ(comm.allreduce_value<int32_t>(rank == 0 ? 1 : 0, ReduceOp::kAverage), comm.size() == 1 ? 1 : 0);
  });
}

TEST_P(GlooWorld, BroadcastFromEveryRoot) {
  run_ranks(GetParam(), [](int rank, Communicator& comm) {
    testing::check_broadcast_from_every_root(rank, comm, {0, 1, 7, 1000});
  });
}

TEST_P(GlooWorld, AllgatherPlacesEachRankAtItsOffset) {
  run_ranks(GetParam(), [](int rank, Communicator& comm) { testing::check_allgather(rank, comm, {0, 1, 7, 1000}); });
}

TEST_P(GlooWorld, AllgathervWithDifferentSizesIncludingZero) {
  run_ranks(GetParam(), [](int rank, Communicator& comm) {
    testing::check_allgatherv(rank, comm, 4, testing::uneven_bytes);
  });
}

TEST_P(GlooWorld, BarrierHoldsEveryRankUntilAllArrive) {
  std::atomic<int> arrived{0};
  run_ranks(GetParam(), [&](int rank, Communicator& comm) { testing::check_barrier(rank, comm, arrived, 3); });
}

INSTANTIATE_TEST_SUITE_P(Sizes, GlooWorld, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

TEST(GlooCommunicator, HalfPrecisionOnCpuIsRejected) {
  run_ranks(1, [](int, Communicator& comm) { testing::check_half_precision_rejected(comm); });
}

TEST(GlooCommunicator, ConstructionTimesOutWhenAPeerNeverComes) {
  MemoryKvStore store;
  auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(make_gloo_communicator(store, options(0, 2, 500ms)), CommError);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 20s);
}

TEST(GlooCommunicator, OperationTimesOutAndNamesOpAndRank) {
  MemoryKvStore store;
  auto [c0, c1] = connect_two(store, options(0, 2, 1s), options(1, 2, 1s));
  std::vector<float> v(10, 1.0f);
  auto start = std::chrono::steady_clock::now();
  try {
    c0->allreduce(v, ReduceOp::kSum);  // rank 1 never joins
    FAIL() << "allreduce without the peer returned";
  } catch (const CommError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("allreduce"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 0"), std::string::npos) << msg;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 20s);
  // After a failure the communicator only throws.
  EXPECT_THROW(c0->barrier(), CommError);
}

// The reduce-scatter is gloo point to point: its waits keep the operation's
// timeout (1 s here), not the pairs' connect timeout (60 s).
TEST(GlooCommunicator, ReduceScatterTimesOutWithTheOperationsTimeout) {
  MemoryKvStore store;
  auto opts = [](int rank) {
    GlooOptions o = options(rank, 2, 1s);
    o.connect_timeout = 60s;
    return o;
  };
  auto [c0, c1] = connect_two(store, opts(0), opts(1));
  std::vector<float> in(1000, 1.0f), out(500);
  auto start = std::chrono::steady_clock::now();
  try {
    c0->reduce_scatter(in.data(), out.data(), {500, 500}, DataType::kFloat32, ReduceOp::kSum);  // rank 1 never comes
    FAIL() << "reduce_scatter without the peer returned";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("reduce_scatter"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  EXPECT_THROW(c0->barrier(), CommError);
}

TEST(GlooCommunicator, AbortWakesABlockedReduceScatter) {
  MemoryKvStore store;
  auto [c0, c1] = connect_two(store, options(0, 2, 60s), options(1, 2, 60s));
  std::vector<double> in(4000, 1.0), out(2000);
  std::thread aborter([&] {
    std::this_thread::sleep_for(200ms);  // rank 1 is not in it: rank 0 blocks
    c0->abort();
  });
  auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(c0->reduce_scatter(in.data(), out.data(), {2000, 2000}, DataType::kFloat64, ReduceOp::kSum),
               CommError);
  aborter.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s) << "abort() did not wake the blocked reduce_scatter";
}

TEST(GlooCommunicator, AbortWakesABlockedOperationAndThePeer) {
  MemoryKvStore store;
  auto [c0, c1] = connect_two(store, options(0, 2, 60s), options(1, 2, 60s));
  std::vector<float> v(1000, 1.0f);
  std::atomic<bool> started{false};
  std::thread aborter([&] {
    while (!started) std::this_thread::yield();
    std::this_thread::sleep_for(200ms);  // let allreduce block (rank 1 is not in it)
    c0->abort();
  });
  auto start = std::chrono::steady_clock::now();
  started = true;
  EXPECT_THROW(c0->allreduce(v, ReduceOp::kSum), CommError);
  auto blocked_for = std::chrono::steady_clock::now() - start;
  aborter.join();
  EXPECT_LT(blocked_for, 10s) << "abort() did not wake the blocked allreduce";
  EXPECT_THROW(c0->allreduce(v, ReduceOp::kSum), CommError);
  // The peer learns at once: its sockets were shut down.
  start = std::chrono::steady_clock::now();
  EXPECT_THROW(c1->allreduce(v, ReduceOp::kSum), CommError);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
}

}  // namespace
}  // namespace erun
