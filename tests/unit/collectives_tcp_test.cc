// TcpCommunicator with ranks as threads over a MemoryKvStore, each rank on its
// own loopback address (127.0.0.2, .3, ...) so that every byte crosses TCP:
// every operation, type and reduction against the serial reference (both the
// direct and the ring algorithms; reduce_scatter over uneven splits), world
// sizes 1 to 4; abort() and timeouts;
// and the attacks the transport must survive: strangers on the pair port
// (silent, garbage, wrong secret, another generation), a peer with the wrong
// secret, frames that are corrupted, from another generation or out of
// sequence (rejected before a byte reaches the caller's buffer), and ranks
// that call different collectives (the error names both ranks and both calls).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>

#include "collectives/tcp/tcp_communicator.h"
#include "store/file_store.h"
#include "store/memory_store.h"
#include "common/codec.h"
#include "common/handshake.h"
#include "support/collective_checks.h"
#include "support/rank_threads.h"
#include "support/erun_process.h"

namespace erun {
namespace {

using namespace std::chrono_literals;

constexpr const char* kSecret = "tcp-test-secret-0123456789abcdef";
constexpr const char* kJob = "job-tcp-test";

std::string address_of(int rank) { return "127.0.0." + std::to_string(2 + rank); }

TcpOptions options(int rank, int size, Duration timeout = 60s) {
  TcpOptions o;
  o.rank = rank;
  o.size = size;
  o.timeout = timeout;
  o.address = address_of(rank);
  o.job_id = kJob;
  o.secret = kSecret;
  o.generation = 3;
  return o;
}

// Runs fn(rank, comm) on `size` threads and rethrows the first exception.
void run_ranks(int size, const std::function<void(int, Communicator&)>& fn,
               const std::function<TcpOptions(int)>& opts = {}, MemoryKvStore* shared = nullptr) {
  auto backend = testing::backend("tcp", [&](KvStore& store, int rank, int n) {
    return make_tcp_communicator(store, opts ? opts(rank) : options(rank, n));
  });
  testing::run_comms(backend, size, fn, {}, shared);
}

using testing::check_allreduce_of;
using testing::kAllOps;

// 0 and 1 element, an odd count, a direct-exchange size and sizes past the
// ring threshold (with blocks that do not divide evenly), up to 2 MiB.
template <typename T>
void check_allreduce(int rank, Communicator& comm) {
  testing::check_allreduce<T>(rank, comm, {0, 1, 7, 1000, 70001, 300007}, 2u << 20);
}

class TcpWorld : public ::testing::TestWithParam<int> {};

TEST_P(TcpWorld, AllreduceEveryTypeAndOpMatchesSerialReference) {
  run_ranks(GetParam(), [](int rank, Communicator& comm) {
    testing::check_allreduce_every_cpu_type(rank, comm, {0, 1, 7, 1000, 70001, 300007}, 2u << 20);
  });
}

// 16 MiB goes around the ring; 1 MiB and a bit (with 3 to 8 ranks) is a
// direct reduce-scatter and allgather. Either way every rank ends with the
// same bits.
TEST_P(TcpWorld, LargeFloatSumIsBitwiseEqualOnEveryRank) {
  for (size_t n : {size_t{(1u << 20) / sizeof(float) + 3}, size_t{(16u << 20) / sizeof(float)}}) {
    std::vector<std::vector<float>> results(GetParam());
    run_ranks(GetParam(), [&](int rank, Communicator& comm) {
      std::vector<float> v(n);
      for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>((i % 1024) * (rank + 1)) * 0.1f;
      comm.allreduce(v, ReduceOp::kSum);
      results[rank] = std::move(v);
    });
    for (int r = 1; r < GetParam(); ++r) {
      EXPECT_EQ(std::memcmp(results[0].data(), results[r].data(), n * sizeof(float)), 0) << "rank " << r << " n=" << n;
    }
    const int s = GetParam();
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) {
      bad += std::abs(results[0][i] - static_cast<float>(i % 1024) * 0.1f * s * (s + 1) / 2) > 1e-2f * (i % 1024 + 1);
    }
    EXPECT_EQ(bad, 0u) << "n=" << n;
  }
}

// The medium allreduce (direct reduce-scatter and allgather) with more ranks
// than the parameterised worlds, blocks that do not divide evenly, every
// reduction of two types.
TEST(TcpCommunicator, MediumAllreduceWithEightRanksMatchesTheReference) {
  run_ranks(8, [](int rank, Communicator& comm) {
    for (ReduceOp op : kAllOps) {
      check_allreduce_of<float>(rank, comm, op, 300007);
      check_allreduce_of<int64_t>(rank, comm, op, 100003);
    }
  });
}

// Blocks of over 4 MiB that do not divide evenly: the ring's sends go out on
// the sender thread while the caller receives and reduces.
TEST_P(TcpWorld, RingOnTheSenderThreadMatchesTheReference) {
  if (GetParam() < 2) GTEST_SKIP() << "no ring with one rank";
  run_ranks(GetParam(), [&](int rank, Communicator& comm) {
    auto check = [&](auto tag, ReduceOp op) {
      using T = decltype(tag);
      check_allreduce_of<T>(rank, comm, op, comm.size() * ((5u << 20) / sizeof(T)) + 3);
    };
    check(int32_t{}, ReduceOp::kSum);
    check(int64_t{}, ReduceOp::kMax);
    check(double{}, ReduceOp::kMin);
    check(float{}, ReduceOp::kAverage);
  });
}

// Reduce-scatter over the even, torch.chunk and one-rank splits (ranks that
// get nothing), every op: every type at direct sizes (with 3 and 4 ranks
// up to 4 MiB), then the ring: 6 MiB (blocks under 4 MiB: sends and
// receives on one thread) and blocks over 4 MiB (the sender thread).
TEST_P(TcpWorld, ReduceScatterEveryTypeAndOpMatchesSerialReference) {
  run_ranks(GetParam(), [](int rank, Communicator& comm) {
    testing::check_reduce_scatter<float>(rank, comm, {0, 1, 7, 70001, 300007});
    testing::check_reduce_scatter<double>(rank, comm, {1, 70001, 300007});
    testing::check_reduce_scatter<int32_t>(rank, comm, {7, 300007});
    testing::check_reduce_scatter<int64_t>(rank, comm, {7, 300007});
    testing::check_reduce_scatter<uint8_t>(rank, comm, {7, 300007});
  });
}

TEST_P(TcpWorld, ReduceScatterRingMatchesSerialReference) {
  if (GetParam() < 2) GTEST_SKIP() << "no ring with one rank";
  run_ranks(GetParam(), [](int rank, Communicator& comm) {
    const size_t n = static_cast<size_t>(comm.size());
    testing::check_reduce_scatter<int64_t>(rank, comm, {(6u << 20) / sizeof(int64_t) + 1});
    testing::check_reduce_scatter<float>(rank, comm, {n * ((5u << 20) / sizeof(float)) + 3});
  });
}

TEST_P(TcpWorld, BroadcastFromEveryRootDirectAndScattered) {
  run_ranks(GetParam(), [](int rank, Communicator& comm) {
    testing::check_broadcast_from_every_root(rank, comm, {0, 1, 1000, (3u << 20) + 5});
  });
}

TEST_P(TcpWorld, AllgatherPlacesEachRankAtItsOffset) {
  run_ranks(GetParam(), [](int rank, Communicator& comm) {
    testing::check_allgather(rank, comm, {0, 1, 1000, (1u << 20) + 3});
  });
}

TEST_P(TcpWorld, AllgathervWithDifferentSizesIncludingZeroAndLarge) {
  run_ranks(GetParam(), [](int rank, Communicator& comm) {
    testing::check_allgatherv(rank, comm, 5, [](int r, int round) -> size_t {
      return round == 4 ? (r + 1) * 300001 : testing::uneven_bytes(r, round);  // 4: the ring path
    });
  });
}

TEST_P(TcpWorld, BarrierHoldsEveryRankUntilAllArrive) {
  std::atomic<int> arrived{0};
  run_ranks(GetParam(), [&](int rank, Communicator& comm) { testing::check_barrier(rank, comm, arrived, 3); });
}

INSTANTIATE_TEST_SUITE_P(Sizes, TcpWorld, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

TEST(TcpCommunicator, HalfPrecisionIsRejected) {
  run_ranks(1, [](int, Communicator& comm) { testing::check_half_precision_rejected(comm); });
}

TEST(TcpCommunicator, WildcardAddressAndMissingSecretAreRefused) {
  MemoryKvStore store;
  TcpOptions o = options(0, 2);
  o.address = "0.0.0.0";
  EXPECT_THROW(make_tcp_communicator(store, o), std::invalid_argument);
  o = options(0, 2);
  o.secret.clear();
  EXPECT_THROW(make_tcp_communicator(store, o), std::invalid_argument);
}

TEST(TcpCommunicator, ConstructionTimesOutWhenAPeerNeverComes) {
  MemoryKvStore store;
  auto start = std::chrono::steady_clock::now();
  try {
    make_tcp_communicator(store, options(0, 2, 500ms));
    FAIL() << "formed a mesh without its peer";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("rank(s) 1"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

TEST(TcpCommunicator, CancelledGivesUpFormingAtOnce) {
  MemoryKvStore store;
  TcpOptions o = options(0, 2, 60s);
  std::atomic<bool> cancel{false};
  o.cancelled = [&] { return cancel.load(); };
  std::thread t([&] {
    std::this_thread::sleep_for(200ms);
    cancel = true;
  });
  auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(make_tcp_communicator(store, o), CommError);
  t.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

std::pair<std::unique_ptr<Communicator>, std::unique_ptr<Communicator>> pair_of(MemoryKvStore& store, Duration timeout) {
  std::unique_ptr<Communicator> c0, c1;
  std::thread t([&] { c1 = make_tcp_communicator(store, options(1, 2, timeout)); });
  c0 = make_tcp_communicator(store, options(0, 2, timeout));
  t.join();
  return {std::move(c0), std::move(c1)};
}

TEST(TcpCommunicator, OperationTimesOutAndNamesOpAndRanks) {
  MemoryKvStore store;
  auto [c0, c1] = pair_of(store, 1s);
  std::vector<float> v(10, 1.0f);
  auto start = std::chrono::steady_clock::now();
  try {
    c0->allreduce(v, ReduceOp::kSum);  // rank 1 never joins
    FAIL() << "allreduce without the peer returned";
  } catch (const CommError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("allreduce"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("receiving from rank 1"), std::string::npos) << msg;
    // The driver learns which rank it waited on, and that it could not see it.
    EXPECT_EQ(e.failed_rank(), 1) << msg;
    EXPECT_EQ(e.fate(), PeerFate::kSilent) << msg;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  EXPECT_THROW(c0->barrier(), CommError);
}

TEST(TcpCommunicator, AbortWakesABlockedOperationAndThePeer) {
  MemoryKvStore store;
  auto [c0, c1] = pair_of(store, 60s);
  std::vector<float> v(1000, 1.0f);
  std::thread aborter([&] {
    std::this_thread::sleep_for(200ms);
    c0->abort();
  });
  auto start = std::chrono::steady_clock::now();
  try {
    c0->allreduce(v, ReduceOp::kSum);
    ADD_FAILURE() << "the aborted allreduce returned";
  } catch (const CommError& e) {
    EXPECT_EQ(e.failed_rank(), -1) << "an abort blames no peer: " << e.what();
  }
  aborter.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s) << "abort() did not wake the blocked allreduce";
  EXPECT_THROW(c0->allreduce(v, ReduceOp::kSum), CommError);
  // The peer may still complete the collective whose frame rank 0 had sent
  // before it aborted; the next one fails at once (its sockets were shut).
  start = std::chrono::steady_clock::now();
  try {
    c1->allreduce(v, ReduceOp::kSum);
    c1->allreduce(v, ReduceOp::kSum);
    ADD_FAILURE() << "the peer's allreduces succeeded after rank 0 aborted";
  } catch (const CommError& e) {
    // Rank 0 closed its connection: named, as a peer it could not see.
    EXPECT_EQ(e.failed_rank(), 0) << e.what();
    EXPECT_EQ(e.fate(), PeerFate::kSilent) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s) << "the peer did not learn of the abort at once";
}

// Threads of this process now (the ring's sender thread is one).
size_t thread_count() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& t : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

// thread_count() once it is `expected`, or after 5 s: a joined thread can
// stay in /proc/self/task for a moment after pthread_join returns (the
// kernel clears its tid before it reaps it), longer on a loaded machine.
size_t thread_count_settled_at(size_t expected) {
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  size_t n = thread_count();
  while (n != expected && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
    n = thread_count();
  }
  return n;
}

// A ring allreduce large enough that its sends fill the socket buffers of a
// peer that does not read: the sender thread blocks writing while the caller
// blocks receiving, and abort() must wake both at once; destroying the
// communicator then leaves no thread behind.
TEST(TcpCommunicator, AbortWakesARingAllreduceBlockedSendingAndReceiving) {
  const size_t threads_before = thread_count();
  MemoryKvStore store;
  auto [c0, c1] = pair_of(store, 60s);
  std::vector<float> v(8u << 20, 1.0f);  // 32 MiB: blocks of 16 MiB
  std::thread aborter([&] {
    std::this_thread::sleep_for(300ms);
    c0->abort();
  });
  auto start = std::chrono::steady_clock::now();
  try {
    c0->allreduce(v, ReduceOp::kSum);  // rank 1 never joins
    ADD_FAILURE() << "the ring allreduce returned without its peer";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("aborted"), std::string::npos) << e.what();
  }
  aborter.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s) << "abort() did not wake the blocked ring allreduce";
  EXPECT_GT(thread_count(), threads_before) << "the ring's sender thread never started";
  c0.reset();
  c1.reset();
  EXPECT_EQ(thread_count_settled_at(threads_before), threads_before) << "a communicator left a thread behind";
}

// A large ring uses the sender thread from 4 MiB blocks when the machine has
// a CPU per rank, from 16 MiB blocks when its ranks outnumber its CPUs; the
// result is the same either way.
TEST(TcpCommunicator, SenderThreadFromLargerBlocksWhenRanksOutnumberCpus) {
  struct Case {
    int machine_ranks;
    size_t bytes;
    bool thread;
  };
  const size_t threads_before = thread_count();
  for (const Case& k : {Case{1, 16u << 20, true}, Case{1 << 20, 16u << 20, false}, Case{1 << 20, 32u << 20, true}}) {
    const int machine_ranks = k.machine_ranks;
    MemoryKvStore store;
    std::unique_ptr<Communicator> c0, c1;
    auto opts = [&](int r) {
      TcpOptions o = options(r, 2);
      o.machine_ranks = machine_ranks;
      return o;
    };
    std::thread t([&] { c1 = make_tcp_communicator(store, opts(1)); });
    c0 = make_tcp_communicator(store, opts(0));
    t.join();
    const size_t n = k.bytes / sizeof(float);  // blocks of bytes / 2
    std::vector<float> v0(n, 1.0f), v1(n, 2.0f);
    std::thread peer([&] { c1->allreduce(v1, ReduceOp::kSum); });
    c0->allreduce(v0, ReduceOp::kSum);
    peer.join();
    const std::string what = fmt::format("machine_ranks {}, {} MiB", machine_ranks, k.bytes >> 20);
    EXPECT_EQ(std::count(v0.begin(), v0.end(), 3.0f), static_cast<long>(n)) << what;
    EXPECT_EQ(v0, v1) << what;
    const size_t expected = threads_before + (k.thread ? 2 : 0);
    EXPECT_EQ(thread_count_settled_at(expected), expected) << what << ": one sender thread per communicator, or none";
    c0.reset();
    c1.reset();
    EXPECT_EQ(thread_count_settled_at(threads_before), threads_before) << what << ": a thread left behind";
  }
}

TEST(TcpCommunicator, RingAllreduceTimesOutWhenThePeerStopsReading) {
  MemoryKvStore store;
  auto [c0, c1] = pair_of(store, 1s);
  std::vector<float> v(8u << 20, 1.0f);
  auto start = std::chrono::steady_clock::now();
  try {
    c0->allreduce(v, ReduceOp::kSum);
    ADD_FAILURE() << "the ring allreduce returned without its peer";
  } catch (const CommError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("timed out after 1.0 s"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 6s);
  // The communicator is broken from then on, without waiting again.
  start = std::chrono::steady_clock::now();
  EXPECT_THROW(c0->allreduce(v, ReduceOp::kSum), CommError);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);
}

// Rank 1 in a child process that runs ring allreduces until it is signalled;
// rank 0 here does the same and signals it mid-stream. Returns how long rank
// 0's failing allreduce took after the signal, and its error.
std::pair<Duration, std::string> signal_ring_peer(int sig, Duration timeout) {
  testing::TempDir dir;
  constexpr size_t kFloats = 4u << 20;  // 16 MiB: the ring with its sender thread
  std::fflush(nullptr);
  pid_t child = ::fork();
  if (child == 0) {
    try {
      FileKvStore store(dir.path());
      auto comm = make_tcp_communicator(store, options(1, 2, 60s));
      std::vector<float> v(kFloats, 1.0f);
      while (true) comm->allreduce(v, ReduceOp::kSum);
    } catch (...) {
    }
    std::_Exit(0);
  }
  FileKvStore store(dir.path());
  std::pair<Duration, std::string> result{Duration::zero(), "no error"};
  {
    auto comm = make_tcp_communicator(store, options(0, 2, timeout));
    std::vector<float> v(kFloats, 1.0f);
    for (int i = 0; i < 3; ++i) comm->allreduce(v, ReduceOp::kSum);
    std::atomic<bool> sent{false};
    std::chrono::steady_clock::time_point signalled;
    std::thread killer([&] {
      std::this_thread::sleep_for(50ms);
      signalled = std::chrono::steady_clock::now();
      ::kill(child, sig);
      sent = true;
    });
    try {
      for (int i = 0; i < 100000; ++i) comm->allreduce(v, ReduceOp::kSum);
    } catch (const CommError& e) {
      result = {std::chrono::steady_clock::now() - signalled, e.what()};
    }
    killer.join();
    EXPECT_TRUE(sent.load());
  }
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  return result;
}

TEST(TcpCommunicator, PeerSigkilledMidRingFailsTheCollectiveAtOnce) {
  const size_t threads_before = thread_count();
  auto [took, error] = signal_ring_peer(SIGKILL, 30s);
  EXPECT_NE(error.find("rank 1"), std::string::npos) << error;
  EXPECT_LT(took, 5s) << "a dead peer's closed socket must end the collective, not its 30 s deadline: " << error;
  EXPECT_EQ(thread_count_settled_at(threads_before), threads_before) << "the communicator left a thread behind";
}

TEST(TcpCommunicator, PeerSigstoppedMidRingFailsTheCollectiveAtItsDeadline) {
  const size_t threads_before = thread_count();
  auto [took, error] = signal_ring_peer(SIGSTOP, 2s);
  EXPECT_NE(error.find("timed out after 2.0 s"), std::string::npos) << error;
  EXPECT_NE(error.find("rank 1"), std::string::npos) << error;
  EXPECT_LT(took, 7s) << "the collective outlived its 2 s deadline: " << error;
  EXPECT_EQ(thread_count_settled_at(threads_before), threads_before) << "the communicator left a thread behind";
}

// Three ranks in a ring, rank 0 (a child) SIGSTOPped mid-stream. Rank 1 (this
// process) receives from rank 0 and sends to rank 2 (another child, alive):
// its sender thread is idle when the deadline comes, and must not blame rank
// 2; the error names rank 0, silent, for the driver's rule.
TEST(TcpCommunicator, FrozenLeftNeighbourIsNamedNotTheHealthyRightOne) {
  testing::TempDir dir;
  constexpr size_t kFloats = 4u << 20;  // 16 MiB over 3 ranks: the ring with its sender thread
  std::fflush(nullptr);
  std::vector<pid_t> children;
  for (int r : {0, 2}) {
    pid_t child = ::fork();
    if (child == 0) {
      try {
        FileKvStore store(dir.path());
        auto comm = make_tcp_communicator(store, options(r, 3, 2s));
        std::vector<float> v(kFloats, 1.0f);
        while (true) comm->allreduce(v, ReduceOp::kSum);
      } catch (...) {
      }
      std::_Exit(0);
    }
    children.push_back(child);
  }
  int named = -2;
  PeerFate fate = PeerFate::kUnknown;
  std::string error = "no error";
  {
    FileKvStore store(dir.path());
    auto comm = make_tcp_communicator(store, options(1, 3, 2s));
    std::vector<float> v(kFloats, 1.0f);
    for (int i = 0; i < 2; ++i) comm->allreduce(v, ReduceOp::kSum);
    std::thread stopper([&] {
      std::this_thread::sleep_for(50ms);
      ::kill(children[0], SIGSTOP);
    });
    try {
      for (int i = 0; i < 100000; ++i) comm->allreduce(v, ReduceOp::kSum);
    } catch (const CommError& e) {
      named = e.failed_rank();
      fate = e.fate();
      error = e.what();
    }
    stopper.join();
  }
  for (pid_t c : children) {
    ::kill(c, SIGKILL);
    int status = 0;
    ::waitpid(c, &status, 0);
  }
  EXPECT_EQ(named, 0) << error;
  EXPECT_EQ(fate, PeerFate::kSilent) << error;
}

TEST(TcpCommunicator, MismatchedCollectivesNameBothRanksAndCalls) {
  MemoryKvStore store;
  auto [c0, c1] = pair_of(store, 10s);
  std::string e0, e1;
  std::thread t([&] {
    std::vector<char> b(40);
    try {
      c1->broadcast(b.data(), b.size(), 0);
    } catch (const CommError& e) {
      e1 = e.what();
    }
  });
  std::vector<float> v(10, 1.0f);
  try {
    c0->allreduce(v, ReduceOp::kSum);
  } catch (const CommError& e) {
    e0 = e.what();
  }
  t.join();
  // Whichever rank reads the other's frame first reports the mismatch.
  const std::string both = e0 + " | " + e1;
  EXPECT_NE(both.find("collective mismatch"), std::string::npos) << both;
  EXPECT_NE(both.find("allreduce(10 x float32, sum)"), std::string::npos) << both;
  EXPECT_NE(both.find("broadcast(40 bytes, root 0)"), std::string::npos) << both;
  EXPECT_FALSE(e0.empty());
  EXPECT_FALSE(e1.empty());
}

TEST(TcpCommunicator, MismatchedCountsAreAnError) {
  MemoryKvStore store;
  auto [c0, c1] = pair_of(store, 10s);
  std::string e0, e1;
  std::thread t([&] {
    std::vector<int32_t> v(11, 1);
    try {
      c1->allreduce(v, ReduceOp::kMax);
    } catch (const CommError& e) {
      e1 = e.what();
    }
  });
  std::vector<int32_t> v(10, 1);
  try {
    c0->allreduce(v, ReduceOp::kMax);
  } catch (const CommError& e) {
    e0 = e.what();
  }
  t.join();
  EXPECT_NE(e0.find("rank 0 called #1 allreduce(10 x int32, max) but rank 1 called #1 allreduce(11 x int32, max)"),
            std::string::npos) << e0;
  EXPECT_NE(e1.find("rank 1 called #1 allreduce(11 x int32, max) but rank 0 called #1 allreduce(10 x int32, max)"),
            std::string::npos) << e1;
  EXPECT_EQ(v, std::vector<int32_t>(10, 1)) << "a mismatched frame must not be reduced into the buffer";
}

// The same total split two ways is a mismatch of the call, named on both
// ranks, and nothing reaches the output.
TEST(TcpCommunicator, ReduceScatterWithAnotherSplitIsAMismatch) {
  MemoryKvStore store;
  auto [c0, c1] = pair_of(store, 10s);
  std::string e0, e1;
  std::vector<float> in(10, 1.0f), out0(6, 7.0f), out1(5, 7.0f);
  std::thread t([&] {
    try {
      c1->reduce_scatter(in.data(), out1.data(), {5, 5}, DataType::kFloat32, ReduceOp::kSum);
    } catch (const CommError& e) {
      e1 = e.what();
    }
  });
  try {
    c0->reduce_scatter(in.data(), out0.data(), {6, 4}, DataType::kFloat32, ReduceOp::kSum);
  } catch (const CommError& e) {
    e0 = e.what();
  }
  t.join();
  for (const std::string& e : {e0, e1}) {
    EXPECT_NE(e.find("collective mismatch"), std::string::npos) << e;
    EXPECT_NE(e.find("reduce_scatter(10 x float32, sum, split 0x"), std::string::npos) << e;
  }
  EXPECT_EQ(out0, std::vector<float>(6, 7.0f)) << "a mismatched frame must not be reduced into the output";
  EXPECT_EQ(out1, std::vector<float>(5, 7.0f)) << "a mismatched frame must not be reduced into the output";
}

// A ring reduce-scatter (blocks of 16 MiB) whose peer never calls: it times
// out naming the peer, as the allreduce does, and abort() wakes it at once.
TEST(TcpCommunicator, RingReduceScatterTimesOutOrIsAborted) {
  const std::vector<size_t> counts{4u << 20, 4u << 20};
  std::vector<float> in(8u << 20, 1.0f), out(4u << 20);
  {
    MemoryKvStore store;
    auto [c0, c1] = pair_of(store, 1s);
    auto start = std::chrono::steady_clock::now();
    try {
      c0->reduce_scatter(in.data(), out.data(), counts, DataType::kFloat32, ReduceOp::kSum);
      ADD_FAILURE() << "the ring reduce-scatter returned without its peer";
    } catch (const CommError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("reduce_scatter (collective #1): timed out after 1.0 s"), std::string::npos) << msg;
      EXPECT_EQ(e.failed_rank(), 1) << msg;
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, 6s);
    start = std::chrono::steady_clock::now();
    EXPECT_THROW(c0->reduce_scatter(in.data(), out.data(), counts, DataType::kFloat32, ReduceOp::kSum), CommError);
    EXPECT_LT(std::chrono::steady_clock::now() - start, 1s) << "a failed communicator must not wait again";
  }
  MemoryKvStore store;
  auto [c0, c1] = pair_of(store, 60s);
  std::thread aborter([&] {
    std::this_thread::sleep_for(300ms);
    c0->abort();
  });
  const auto start = std::chrono::steady_clock::now();
  try {
    c0->reduce_scatter(in.data(), out.data(), counts, DataType::kFloat32, ReduceOp::kSum);
    ADD_FAILURE() << "the ring reduce-scatter returned without its peer";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("aborted"), std::string::npos) << e.what();
  }
  aborter.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s) << "abort() did not wake the ring reduce-scatter";
}

// ---- a hand-made peer, speaking the documented wire format ----------------

int connect_to(const std::string& addr) {
  auto colon = addr.rfind(':');
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(std::stoi(addr.substr(colon + 1))));
  ::inet_pton(AF_INET, addr.substr(0, colon).c_str(), &sa.sin_addr);
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    ::close(fd);
    return -1;
  }
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

std::string read_n(int fd, size_t n) {
  std::string out(n, '\0');
  size_t off = 0;
  while (off < n) {
    ssize_t r = ::recv(fd, out.data() + off, n - off, 0);
    if (r <= 0) return out.substr(0, off);
    off += static_cast<size_t>(r);
  }
  return out;
}

void write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

PayloadWriter head(uint16_t type) {
  PayloadWriter w;
  w.u32(0x31504545).u32(1u | (static_cast<uint32_t>(type) << 16));
  return w;
}

std::string proof(const std::string& label, const std::string& secret, const std::string& job, int64_t gen,
                  int connector, int acceptor, const std::string& cn, const std::string& an) {
  PayloadWriter w;
  w.fixed(label).bytes(job).i64(gen).i32(connector).i32(acceptor).fixed(cn).fixed(an);
  return handshake::hmac_sha256(secret, w.str());
}

// Connects to rank `to` at addr as rank `from` and runs the handshake with the
// given secret and generation; returns the socket when accepted, else -1.
int fake_peer(const std::string& addr, int from, int to, const std::string& secret, int64_t gen) {
  int fd = connect_to(addr);
  if (fd < 0) return -1;
  std::string nonce = handshake::random_bytes(32);
  auto hello = head(1);
  hello.u64(handshake::job_hash(kJob)).i64(gen).i32(from).i32(to).fixed(nonce);
  write_all(fd, hello.str());
  std::string ch = read_n(fd, 72);
  if (ch.size() != 72) {
    ::close(fd);
    return -1;
  }
  std::string an = ch.substr(8, 32);
  auto auth = head(3);
  auth.fixed(proof("erun-pair-connector-v1", secret, kJob, gen, from, to, nonce, an));
  write_all(fd, auth.str());
  if (read_n(fd, 8).size() != 8) {
    ::close(fd);
    return -1;
  }
  return fd;
}

struct Header {
  uint32_t magic = 0x46504545;
  uint8_t version = 1, op = 1, dtype = 0, reduce = 0;
  uint32_t generation = 3;
  int32_t from = 1;
  uint64_t seq = 1, count = 0, offset = 0, length = 0;
  int32_t root = 0;
  uint32_t check = 0;
};
static_assert(sizeof(Header) == 56);

uint32_t fnv(const Header& h) {
  uint32_t x = 2166136261u;
  auto* b = reinterpret_cast<const unsigned char*>(&h);
  for (size_t i = 0; i < offsetof(Header, check); ++i) x = (x ^ b[i]) * 16777619u;
  return x;
}

std::string frame(Header h, const std::string& payload, bool fix_check = true) {
  h.length = payload.size();
  if (fix_check) h.check = fnv(h);
  return std::string(reinterpret_cast<const char*>(&h), sizeof(h)) + payload;
}

// Rank 0 of a 2-rank mesh whose rank 1 is the test itself.
struct AgainstFake {
  MemoryKvStore store;
  std::unique_ptr<Communicator> comm;
  int fd = -1;
  AgainstFake() {
    std::thread t([&] {
      auto v = store.get("addr/0", 10s);
      fd = fake_peer(std::string(v.begin(), v.end()), 1, 0, kSecret, 3);
    });
    TcpOptions o = options(0, 2, 3s);
    comm = make_tcp_communicator(store, o);
    t.join();
  }
  ~AgainstFake() {
    if (fd >= 0) ::close(fd);
  }
};

TEST(TcpCommunicator, TheFakePeerSpeaksTheProtocol) {
  // The control for the tests below: a correct frame is reduced.
  AgainstFake f;
  ASSERT_GE(f.fd, 0);
  Header h;
  h.count = 4;
  h.dtype = static_cast<uint8_t>(DataType::kFloat32);
  std::vector<float> theirs{1, 2, 3, 4};
  write_all(f.fd, frame(h, std::string(reinterpret_cast<char*>(theirs.data()), 16)));
  std::vector<float> v{10, 20, 30, 40};
  f.comm->allreduce(v, ReduceOp::kSum);
  EXPECT_EQ(v, (std::vector<float>{11, 22, 33, 44}));
}

void expect_rejected(Header h, bool fix_check, const std::string& want) {
  AgainstFake f;
  ASSERT_GE(f.fd, 0);
  h.count = 4;
  std::vector<float> theirs{1e6, 1e6, 1e6, 1e6};
  write_all(f.fd, frame(h, std::string(reinterpret_cast<char*>(theirs.data()), 16), fix_check));
  std::vector<float> v{10, 20, 30, 40};
  try {
    f.comm->allreduce(v, ReduceOp::kSum);
    FAIL() << "accepted a bad frame";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
  EXPECT_EQ(v, (std::vector<float>{10, 20, 30, 40})) << "a rejected frame reached the caller's buffer";
}

TEST(TcpCommunicator, CorruptedHeaderIsRejected) {
  Header h;
  h.magic = 0xdeadbeef;
  expect_rejected(h, true, "corrupted frame header from rank 1");
  Header g;
  g.count = 4;
  g.check = fnv(g) ^ 1;  // a flipped bit
  expect_rejected(g, false, "corrupted frame header");
}

TEST(TcpCommunicator, FrameFromAnotherGenerationIsRejected) {
  Header h;
  h.generation = 2;
  expect_rejected(h, true, "claims generation 2");
}

TEST(TcpCommunicator, OutOfSequenceFrameIsRejected) {
  Header h;
  h.seq = 7;
  expect_rejected(h, true, "rank 1 called #7 allreduce");
}

TEST(TcpCommunicator, WrongLengthIsRejected) {
  AgainstFake f;
  ASSERT_GE(f.fd, 0);
  Header h;
  h.count = 4;
  write_all(f.fd, frame(h, std::string(12, 'x')));
  std::vector<float> v{10, 20, 30, 40};
  EXPECT_THROW(f.comm->allreduce(v, ReduceOp::kSum), CommError);
  EXPECT_EQ(v, (std::vector<float>{10, 20, 30, 40}));
}

// Strangers on the pair port while the mesh forms: none of them takes rank 1's
// place, the real rank 1 gets in, and the results are right.
TEST(TcpCommunicator, StrangersOnThePairPortAreClosedAndTheJobGoesOn) {
  MemoryKvStore store;
  std::vector<int> held;
  std::atomic<bool> attacked{false};
  int wrong_secret = -2, old_generation = -2, wrong_rank = -2;
  std::string garbage_reply = "unset";
  std::thread attacker([&] {
    auto v = store.get("addr/0", 10s);
    std::string addr(v.begin(), v.end());
    for (int i = 0; i < 20; ++i) held.push_back(connect_to(addr));  // silent, held open
    int g = connect_to(addr);
    write_all(g, std::string(64, '\x41'));
    garbage_reply = read_n(g, 1);  // closed on us: empty
    ::close(g);
    wrong_secret = fake_peer(addr, 1, 0, "not-the-secret", 3);
    old_generation = fake_peer(addr, 1, 0, kSecret, 2);
    wrong_rank = fake_peer(addr, 0, 0, kSecret, 3);
    attacked = true;
  });
  run_ranks(2, [&](int rank, Communicator& comm) {
    if (rank == 1) {
      while (!attacked) std::this_thread::sleep_for(5ms);
    }
    check_allreduce<float>(rank, comm);
    comm.barrier();
  }, [&](int r) {
    if (r == 1) {
      // rank 1 arrives after the attack
      auto o = options(1, 2);
      while (!attacked) std::this_thread::sleep_for(5ms);
      return o;
    }
    return options(0, 2);
  }, &store);
  attacker.join();
  EXPECT_EQ(garbage_reply, "");
  EXPECT_EQ(wrong_secret, -1);
  EXPECT_EQ(old_generation, -1);
  EXPECT_EQ(wrong_rank, -1);
  for (int fd : held) {
    if (fd >= 0) ::close(fd);
  }
}

TEST(TcpCommunicator, PeerWithAnotherSecretCannotJoin) {
  MemoryKvStore store;
  std::string e1;
  std::thread t([&] {
    TcpOptions o = options(1, 2, 2s);
    o.secret = "a-different-secret";
    try {
      make_tcp_communicator(store, o);
    } catch (const CommError& e) {
      e1 = e.what();
    }
  });
  EXPECT_THROW(make_tcp_communicator(store, options(0, 2, 2s)), CommError);
  t.join();
  EXPECT_NE(e1.find("did not prove the job secret"), std::string::npos) << e1;
}

}  // namespace
}  // namespace erun
