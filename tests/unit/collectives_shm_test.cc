// ShmCommunicator with ranks as threads (MemoryKvStore) and as forked
// processes (FileKvStore): every operation, type and reduction against a
// serial reference, world sizes 1 to 4, default and tiny staging buffers (many
// pipeline steps); a SIGKILLed peer, a SIGSTOPped peer, abort(), and no
// segment left in /dev/shm.
#include <gtest/gtest.h>

#include <sstream>
#include <signal.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <thread>

#include "support/collective_checks.h"
#include "support/rank_threads.h"
#include "store/file_store.h"
#include "collectives/shm/shm_communicator.h"
#include "store/memory_store.h"
#include "support/erun_process.h"

namespace erun {
namespace {

using namespace std::chrono_literals;
using testing::combine;
using testing::input;
using testing::reference;
using testing::TempDir;
namespace fs = std::filesystem;

// Segments of this test process (and its children) carry this tag.
std::string test_tag() { return "shmtest" + std::to_string(::getpid()); }
std::string g_tag;

std::set<std::string> our_segments() {
  std::set<std::string> out;
  for (auto& e : fs::directory_iterator("/dev/shm")) {
    auto name = e.path().filename().string();
    if (name.find(g_tag) != std::string::npos) out.insert(name);
  }
  return out;
}

// After all tests of this process: nothing of ours left in /dev/shm.
class NoLeakedSegments : public ::testing::Environment {
 public:
  void SetUp() override { g_tag = test_tag(); }
  void TearDown() override {
    auto left = our_segments();
    std::printf("/dev/shm entries of this test run left: %zu\n", left.size());
    for (auto& n : left) ADD_FAILURE() << "leaked shared memory segment /dev/shm/" << n;
  }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new NoLeakedSegments);

struct Staging {
  const char* name;
  size_t step_bytes;
  size_t small_bytes;
};
const Staging kDefault{"default", size_t{1} << 20, size_t{32} << 10};
const Staging kTiny{"tiny", 4096, 128};

ShmOptions options(int rank, int size, Duration timeout = 60s, Staging st = kDefault) {
  ShmOptions o;
  o.rank = rank;
  o.size = size;
  o.timeout = timeout;
  o.segment_tag = g_tag;
  o.step_bytes = st.step_bytes;
  o.small_bytes = st.small_bytes;
  return o;
}

// Runs fn(rank, comm) on `size` threads; returns every rank's error text.
std::string run_threads(int size, const std::function<std::string(int, Communicator&)>& fn, Staging st = kDefault,
                        Duration timeout = 60s) {
  auto backend = testing::backend("shm", [&](KvStore& store, int rank, int n) -> std::unique_ptr<Communicator> {
    return make_shm_communicator(store, options(rank, n, timeout, st));
  });
  return testing::run_comms_errors(backend, size, fn);
}

bool wait_child(pid_t pid, int* status, Duration timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    pid_t got = ::waitpid(pid, status, WNOHANG);
    if (got == pid) return true;
    std::this_thread::sleep_for(5ms);
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, status, 0);
  return false;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}


// Forks `size` ranks over a FileKvStore; each runs fn and reports its error
// text through a file. Returns all errors (empty when every rank passed).
std::string run_processes(int size, const std::function<std::string(int, Communicator&)>& fn,
                          Staging st = kDefault) {
  TempDir dir;
  std::vector<pid_t> pids;
  for (int r = 0; r < size; ++r) {
    pid_t pid = ::fork();
    if (pid == 0) {
      std::string err;
      try {
        FileKvStore store(dir.path());
        auto comm = make_shm_communicator(store, options(r, size, 60s, st));
        err = fn(r, *comm);
      } catch (const std::exception& e) {
        err = e.what();
      }
      dir.write("err" + std::to_string(r), err);
      std::_Exit(err.empty() ? 0 : 1);
    }
    pids.push_back(pid);
  }
  std::string errors;
  for (int r = 0; r < size; ++r) {
    int status = 0;
    if (!wait_child(pids[r], &status, 120s)) errors += "rank " + std::to_string(r) + " hung\n";
    auto err = read_file(dir.path() + "/err" + std::to_string(r));
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) errors += "rank " + std::to_string(r) + ": " + err + "\n";
  }
  return errors;
}

// testing::input is periodic in i (period kPeriod), so references are tables.
constexpr size_t kPeriod = 15 * 11 * 251;


template <typename T>
std::vector<T> reference_table(int size, ReduceOp op) {
  std::vector<T> t(kPeriod);
  for (size_t i = 0; i < kPeriod; ++i) {
    T acc = input<T>(0, i);
    for (int r = 1; r < size; ++r) acc = combine(acc, input<T>(r, i), op);
    if (op == ReduceOp::kAverage) acc = static_cast<T>(acc / static_cast<T>(size));
    t[i] = acc;
  }
  return t;
}

const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct};
const size_t kCounts[] = {0, 1, 7, 1000, (size_t{1} << 20) + 3};

template <typename T>
std::string check_allreduce(int rank, Communicator& comm, const std::vector<size_t>& counts) {
  std::vector<T> in(kPeriod);
  for (size_t i = 0; i < kPeriod; ++i) in[i] = input<T>(rank, i);
  for (ReduceOp op : kOps) {
    auto ref = reference_table<T>(comm.size(), op);
    for (size_t n : counts) {
      std::vector<T> v(n);
      for (size_t i = 0; i < n; ++i) v[i] = in[i % kPeriod];
      comm.allreduce(v.data(), n, data_type_of<T>(), op);
      for (size_t i = 0; i < n; ++i) {
        if (v[i] != ref[i % kPeriod]) {
          return std::string(to_string(data_type_of<T>())) + " " + to_string(op) + " n=" + std::to_string(n) +
                 ": first mismatch at " + std::to_string(i) + ": got " + std::to_string(+v[i]) + ", want " +
                 std::to_string(+ref[i % kPeriod]);
        }
      }
    }
  }
  return "";
}

std::string check_all_types(int rank, Communicator& comm, const std::vector<size_t>& counts) {
  std::string e = check_allreduce<float>(rank, comm, counts);
  if (e.empty()) e = check_allreduce<double>(rank, comm, counts);
  if (e.empty()) e = check_allreduce<int32_t>(rank, comm, counts);
  if (e.empty()) e = check_allreduce<int64_t>(rank, comm, counts);
  if (e.empty()) e = check_allreduce<uint8_t>(rank, comm, counts);
  return e;
}

const std::vector<size_t> kByteSizes = {0, 1, 7, 1000, 40000, (size_t{5} << 20) + 3};

std::string check_broadcast(int rank, Communicator& comm) {
  for (int root = 0; root < comm.size(); ++root) {
    for (size_t n : kByteSizes) {
      std::vector<char> buf(n);
      for (size_t i = 0; i < n; ++i) buf[i] = static_cast<char>(rank == root ? (i * 3 + root) : 0x55);
      comm.broadcast(buf.data(), n, root);
      for (size_t i = 0; i < n; ++i) {
        if (buf[i] != static_cast<char>(i * 3 + root)) {
          return "broadcast root " + std::to_string(root) + " n " + std::to_string(n) + " wrong at " + std::to_string(i);
        }
      }
    }
  }
  return "";
}

std::string check_allgather(int rank, Communicator& comm) {
  for (size_t n : kByteSizes) {
    if (n > (size_t{3} << 20)) n = (size_t{3} << 20) + 1;
    std::vector<char> in(n), out(n * comm.size(), 0x7f);
    for (size_t i = 0; i < n; ++i) in[i] = static_cast<char>(rank * 31 + i);
    comm.allgather(in.data(), out.data(), n);
    for (int r = 0; r < comm.size(); ++r) {
      for (size_t i = 0; i < n; ++i) {
        if (out[r * n + i] != static_cast<char>(r * 31 + i)) {
          return "allgather n " + std::to_string(n) + " wrong for rank " + std::to_string(r) + " at " + std::to_string(i);
        }
      }
    }
  }
  return "";
}

size_t allgatherv_bytes(int r, int round) {
  switch (round) {
    case 3: return r == 1 ? (size_t{3} << 20) + 5 : r * 100;  // one large, others small
    case 4: return (r + 1) * 70000;
    default: return testing::uneven_bytes(r, round);  // rounds 0 to 2
  }
}

std::string check_allgatherv(int rank, Communicator& comm) {
  for (int round = 0; round < 5; ++round) {
    std::vector<char> in(allgatherv_bytes(rank, round));
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<char>(rank + 5 * i);
    auto all = comm.allgatherv(in.data(), in.size());
    if (all.size() != static_cast<size_t>(comm.size())) return "allgatherv: wrong number of ranks";
    for (int r = 0; r < comm.size(); ++r) {
      if (all[r].size() != allgatherv_bytes(r, round)) return "allgatherv: wrong size for rank " + std::to_string(r);
      for (size_t i = 0; i < all[r].size(); ++i) {
        if (all[r][i] != static_cast<char>(r + 5 * i)) return "allgatherv: wrong byte from rank " + std::to_string(r);
      }
    }
  }
  return "";
}

// The same random mix of operations and sizes on every rank: checks that no
// operation overwrites staging memory a peer is still reading.
std::string check_mixed_sequence(int rank, Communicator& comm) {
  std::mt19937 rng(1234);
  const int n = comm.size();
  for (int it = 0; it < 150; ++it) {
    int kind = static_cast<int>(rng() % 4);
    size_t len = rng() % 3 == 0 ? 20000 + rng() % 300000 : rng() % 3000;
    int tag = static_cast<int>(rng() % 100);
    if (kind == 0) {
      std::vector<int32_t> v(len, rank + tag);
      comm.allreduce(v, ReduceOp::kSum);
      for (auto x : v) {
        if (x != n * tag + n * (n - 1) / 2) return "mixed allreduce wrong at iteration " + std::to_string(it);
      }
    } else if (kind == 1) {
      int root = tag % n;
      std::vector<char> v(len, static_cast<char>(rank == root ? tag : -1));
      comm.broadcast(v.data(), v.size(), root);
      for (char c : v) {
        if (c != static_cast<char>(tag)) return "mixed broadcast wrong at iteration " + std::to_string(it);
      }
    } else if (kind == 2) {
      std::vector<char> in(len % 70000, static_cast<char>(rank + tag)), out(in.size() * n);
      comm.allgather(in.data(), out.data(), in.size());
      for (size_t i = 0; i < out.size(); ++i) {
        if (out[i] != static_cast<char>(i / in.size() + tag)) return "mixed allgather wrong at " + std::to_string(it);
      }
    } else {
      comm.barrier();
    }
  }
  return "";
}

struct World {
  int size;
  Staging staging;
};

class ShmThreads : public ::testing::TestWithParam<World> {};

TEST_P(ShmThreads, AllreduceEveryTypeAndOpMatchesSerialReference) {
  std::vector<size_t> counts(std::begin(kCounts), std::end(kCounts));
  // Tiny staging: tens of pipeline steps without thousands of them.
  if (GetParam().staging.step_bytes == kTiny.step_bytes) counts.back() = 20003;
  EXPECT_EQ(run_threads(GetParam().size, [&](int r, Communicator& c) { return check_all_types(r, c, counts); },
                        GetParam().staging),
            "");
}

TEST_P(ShmThreads, BroadcastFromEveryRoot) {
  EXPECT_EQ(run_threads(GetParam().size, check_broadcast, GetParam().staging), "");
}

TEST_P(ShmThreads, AllgatherPlacesEachRankAtItsOffset) {
  EXPECT_EQ(run_threads(GetParam().size, check_allgather, GetParam().staging), "");
}

TEST_P(ShmThreads, AllgathervWithDifferentSizesIncludingZero) {
  EXPECT_EQ(run_threads(GetParam().size, check_allgatherv, GetParam().staging), "");
}

TEST_P(ShmThreads, MixedSequenceOfOperations) {
  EXPECT_EQ(run_threads(GetParam().size, check_mixed_sequence, GetParam().staging), "");
}

TEST_P(ShmThreads, BarrierHoldsEveryRankUntilAllArrive) {
  std::atomic<int> arrived{0};
  EXPECT_EQ(run_threads(GetParam().size,
                        [&](int, Communicator& comm) -> std::string {
                          for (int round = 1; round <= 20; ++round) {
                            arrived++;
                            comm.barrier();
                            if (arrived.load() < round * comm.size()) return "barrier released early";
                            comm.barrier();
                          }
                          return "";
                        },
                        GetParam().staging),
            "");
}

INSTANTIATE_TEST_SUITE_P(Worlds, ShmThreads,
                         ::testing::Values(World{1, kDefault}, World{2, kDefault}, World{3, kDefault},
                                           World{4, kDefault}, World{2, kTiny}, World{3, kTiny}, World{4, kTiny}),
                         [](const auto& info) {
                           return "world" + std::to_string(info.param.size) + "_" + info.param.staging.name;
                         });

class ShmProcesses : public ::testing::TestWithParam<int> {};

TEST_P(ShmProcesses, EveryOperationMatchesSerialReference) {
  std::vector<size_t> counts(std::begin(kCounts), std::end(kCounts));
  EXPECT_EQ(run_processes(GetParam(),
                          [&](int r, Communicator& c) {
                            std::string e = check_all_types(r, c, counts);
                            if (e.empty()) e = check_broadcast(r, c);
                            if (e.empty()) e = check_allgather(r, c);
                            if (e.empty()) e = check_allgatherv(r, c);
                            if (e.empty()) e = check_mixed_sequence(r, c);
                            return e;
                          }),
            "");
}

INSTANTIATE_TEST_SUITE_P(Sizes, ShmProcesses, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

TEST(ShmCommunicator, HalfPrecisionOnCpuIsRejected) {
  EXPECT_EQ(run_threads(2,
                        [](int, Communicator& comm) {
                          testing::check_half_precision_rejected(comm);
                          return std::string();
                        }),
            "");
}

TEST(ShmCommunicator, SegmentNameIsGoneOnceEveryoneMappedIt) {
  MemoryKvStore store;
  std::vector<std::unique_ptr<Communicator>> comms(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] { comms[r] = make_shm_communicator(store, options(r, 3)); });
  }
  for (auto& t : threads) t.join();
  EXPECT_TRUE(our_segments().empty());
  // Still works through the mappings alone.
  threads.clear();
  std::atomic<int> good{0};
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] { good += comms[r]->allreduce_value<int64_t>(r, ReduceOp::kSum) == 3; });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(good.load(), 3);
}

TEST(ShmCommunicator, ConstructionTimesOutWhenAPeerNeverComesAndLeavesNothing) {
  MemoryKvStore store;
  auto start = std::chrono::steady_clock::now();
  try {
    make_shm_communicator(store, options(0, 2, 500ms));
    ADD_FAILURE() << "no CommError";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("ranks 1 did not map"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 20s);
  EXPECT_TRUE(our_segments().empty());
  // A non-zero rank without a rank 0 times out on the store.
  MemoryKvStore empty;
  EXPECT_THROW(make_shm_communicator(empty, options(1, 2, 300ms)), CommError);
}

// Ranks 0 and 1 of 3 map the segment; rank 2 never comes (it left for the
// next generation before it saw the segment's name). Once `cancelled` turns
// true, both give up with the reason instead of waiting out the timeout, and
// the segment is gone.
TEST(ShmCommunicator, ConstructionGivesUpWhenCancelled) {
  MemoryKvStore store;
  std::atomic<bool> replaced{false};
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      ShmOptions o = options(r, 3, 60s);
      o.cancelled = [&] { return replaced.load(); };
      try {
        make_shm_communicator(store, o);
        errors[r] = "no CommError";
      } catch (const CommError& e) {
        errors[r] = e.what();
      }
    });
  }
  std::this_thread::sleep_for(200ms);
  replaced = true;
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("a new generation was announced"), std::string::npos) << "rank " << r << ": " << errors[r];
  }
  EXPECT_TRUE(our_segments().empty());
}

// What an allreduce that must fail threw: its message, and whom it blamed.
struct Blame {
  std::string msg;
  int rank = -2;  // never a CommError's
  PeerFate fate = PeerFate::kUnknown;
};

Blame failed_allreduce(Communicator& comm) {
  std::vector<float> v(1000, 1.0f);
  try {
    comm.allreduce(v, ReduceOp::kSum);
  } catch (const CommError& e) {
    return {e.what(), e.failed_rank(), e.fate()};
  }
  ADD_FAILURE() << "no CommError";
  return {};
}

TEST(ShmCommunicator, APeerMarkedOutsideIsNotBlamedAtTheTimeoutAndAnUnmarkedOneIs) {
  for (bool marked : {true, false}) {
    SCOPED_TRACE(marked ? "marked outside" : "mark cleared");
    MemoryKvStore store;
    std::atomic<bool> gave_up{false};
    std::thread peer([&] {
      auto comm = make_shm_communicator(store, options(1, 2, 500ms));
      {
        // Busy elsewhere, and for the second round back before the deadline
        // but still not arriving (a hang in shared memory).
        OutsideMark mark(*comm);
        while (marked && !gave_up) std::this_thread::sleep_for(5ms);
      }
      while (!gave_up) std::this_thread::sleep_for(5ms);
    });
    ShmOptions o = options(0, 2, 500ms);
    o.outside_work = "the test's other step";
    auto comm = make_shm_communicator(store, o);
    const Blame b = failed_allreduce(*comm);
    if (marked) {
      EXPECT_EQ(b.rank, -1) << b.msg;
      EXPECT_EQ(b.fate, PeerFate::kUnknown) << b.msg;
      EXPECT_NE(b.msg.find("rank 1 did not arrive within the timeout: it is busy in the test's other step"),
                std::string::npos)
          << b.msg;
    } else {
      EXPECT_EQ(b.rank, 1) << b.msg;
      EXPECT_EQ(b.fate, PeerFate::kAlive) << b.msg;
    }
    gave_up = true;
    peer.join();
  }
}

// A host leader whose cross-host step fails leaves its mark by an exception:
// its peers must learn at once that it gave up, never blame it as alive but
// not arriving (CI saw a follower whose deadline passed between the mark's
// clearing and the leader's abort name the healthy leader, which was killed).
TEST(ShmCommunicator, APeerWhoseOutsideWorkFailsIsNotBlamed) {
  MemoryKvStore store;
  std::atomic<bool> made{false}, gave_up{false};
  std::thread peer([&] {
    auto comm = make_shm_communicator(store, options(1, 2, 5s));
    while (!made) std::this_thread::sleep_for(1ms);  // rank 0 is past making its own
    try {
      OutsideMark mark(*comm);
      std::this_thread::sleep_for(100ms);
      throw std::runtime_error("the cross-host step timed out");
    } catch (const std::runtime_error&) {
    }
    while (!gave_up) std::this_thread::sleep_for(5ms);
  });
  auto comm = make_shm_communicator(store, options(0, 2, 5s));
  made = true;
  const Blame b = failed_allreduce(*comm);
  EXPECT_EQ(b.rank, -1) << b.msg;
  EXPECT_EQ(b.fate, PeerFate::kUnknown) << b.msg;
  EXPECT_NE(b.msg.find("rank 1 aborted the communicator"), std::string::npos) << b.msg;
  gave_up = true;
  peer.join();
}

TEST(ShmCommunicator, OperationTimesOutAndNamesOpAndRank) {
  MemoryKvStore store;
  std::string error;
  std::atomic<bool> gave_up{false};
  std::thread peer([&] {
    auto comm = make_shm_communicator(store, options(1, 2, 500ms));
    // Never joins the allreduce (nor any other call: that would be a
    // mismatch); stays until rank 0 gave up.
    while (!gave_up) std::this_thread::sleep_for(5ms);
  });
  auto comm = make_shm_communicator(store, options(0, 2, 500ms));
  auto start = std::chrono::steady_clock::now();
  std::vector<float> v(1000, 1.0f);
  try {
    comm->allreduce(v, ReduceOp::kSum);
    comm->allreduce(v, ReduceOp::kSum);
    ADD_FAILURE() << "no CommError";
  } catch (const CommError& e) {
    error = e.what();
  }
  auto took = std::chrono::steady_clock::now() - start;
  gave_up = true;
  peer.join();
  EXPECT_GE(took, 400ms);
  EXPECT_LT(took, 10s);
  EXPECT_NE(error.find("allreduce"), std::string::npos) << error;
  EXPECT_NE(error.find("rank 1 did not arrive"), std::string::npos) << error;
  // Broken from now on, without waiting.
  start = std::chrono::steady_clock::now();
  EXPECT_THROW(comm->barrier(), CommError);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 100ms);
}

TEST(ShmCommunicator, AbortFromAnotherThreadFailsEveryRankPromptly) {
  MemoryKvStore store;
  constexpr int kSize = 3;
  std::vector<std::unique_ptr<Communicator>> comms(kSize);
  std::vector<std::thread> threads;
  for (int r = 0; r < kSize; ++r) {
    threads.emplace_back([&, r] { comms[r] = make_shm_communicator(store, options(r, kSize, 60s)); });
  }
  for (auto& t : threads) t.join();
  threads.clear();
  std::atomic<int> errors{0};
  auto start = std::chrono::steady_clock::now();
  // Ranks 0 and 1 wait for rank 2, which never calls; rank 2's comm is aborted.
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        comms[r]->barrier();
      } catch (const CommError& e) {
        if (std::string(e.what()).find("rank 2 aborted") != std::string::npos) errors++;
      }
    });
  }
  std::this_thread::sleep_for(50ms);  // let them block (not needed for correctness)
  comms[2]->abort();
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors.load(), 2);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  EXPECT_THROW(comms[2]->barrier(), CommError);
}

// Three ranks as processes loop over allreduce; the parent SIGKILLs or
// SIGSTOPs rank 2 and measures how long the survivors take to get CommError.
struct FailureOutcome {
  std::vector<double> seconds;  // per survivor, from the signal to its CommError
  std::vector<std::string> messages;
  std::vector<int> failed_ranks;  // CommError::failed_rank() of each survivor
  std::vector<PeerFate> fates;
};

FailureOutcome inject_failure(int signal, Duration timeout) {
  constexpr int kSize = 3;
  TempDir dir;
  std::vector<pid_t> pids;
  for (int r = 0; r < kSize; ++r) {
    pid_t pid = ::fork();
    if (pid == 0) {
      int code = 3;
      try {
        FileKvStore store(dir.path());
        auto comm = make_shm_communicator(store, options(r, kSize, timeout));
        std::vector<float> v((size_t{4} << 20) / sizeof(float), 1.0f);
        for (int i = 0; i < 3; ++i) comm->allreduce(v, ReduceOp::kSum);
        dir.write("ready" + std::to_string(r), "1");
        auto end = std::chrono::steady_clock::now() + 60s;
        try {
          while (std::chrono::steady_clock::now() < end) comm->allreduce(v, ReduceOp::kSum);
          code = 2;
        } catch (const CommError& e) {
          auto ns = std::chrono::steady_clock::now().time_since_epoch().count();
          dir.write("done" + std::to_string(r), std::to_string(ns) + "\n" +
                                                                 std::to_string(e.failed_rank()) + " " +
                                                                 std::to_string(static_cast<int>(e.fate())) + "\n" +
                                                                 e.what());
          code = 0;
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
      }
      std::_Exit(code);
    }
    pids.push_back(pid);
  }
  auto deadline = std::chrono::steady_clock::now() + 60s;
  auto all_ready = [&] {
    for (int r = 0; r < kSize; ++r) {
      if (!fs::exists(dir.path() + "/ready" + std::to_string(r))) return false;
    }
    return true;
  };
  while (!all_ready() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(5ms);
  EXPECT_TRUE(all_ready());
  const auto t0 = std::chrono::steady_clock::now().time_since_epoch().count();
  ::kill(pids[2], signal);
  FailureOutcome out;
  for (int r = 0; r < 2; ++r) {
    int status = 0;
    EXPECT_TRUE(wait_child(pids[r], &status, 60s)) << "rank " << r << " hung";
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank " << r << " status " << status;
    auto text = read_file(dir.path() + "/done" + std::to_string(r));
    auto nl = text.find('\n');
    if (nl == std::string::npos) continue;
    out.seconds.push_back(static_cast<double>(std::stoll(text.substr(0, nl)) - t0) / 1e9);
    auto nl2 = text.find('\n', nl + 1);
    std::istringstream who(text.substr(nl + 1, nl2 - nl - 1));
    int failed = -2, fate = -1;
    who >> failed >> fate;
    out.failed_ranks.push_back(failed);
    out.fates.push_back(static_cast<PeerFate>(fate));
    out.messages.push_back(text.substr(nl2 + 1));
  }
  // Only now reap rank 2: until here it was a zombie, which must count as dead.
  ::kill(pids[2], SIGKILL);
  int status = 0;
  wait_child(pids[2], &status, 30s);
  return out;
}

TEST(ShmCommunicator, SigkilledPeerGivesCommErrorWithinMilliseconds) {
  auto out = inject_failure(SIGKILL, 60s);
  ASSERT_EQ(out.seconds.size(), 2u);
  for (size_t i = 0; i < out.seconds.size(); ++i) {
    std::printf("survivor %zu: CommError %.1f ms after SIGKILL: %s\n", i, out.seconds[i] * 1e3, out.messages[i].c_str());
    EXPECT_LT(out.seconds[i], 3.0);  // ~ms when idle; generous for a loaded machine
    EXPECT_NE(out.messages[i].find("rank 2"), std::string::npos) << out.messages[i];
    EXPECT_NE(out.messages[i].find("died"), std::string::npos) << out.messages[i];
    // Both survivors name the rank, the one that saw it and the one told through the segment.
    EXPECT_EQ(out.failed_ranks[i], 2);
    EXPECT_EQ(out.fates[i], PeerFate::kDead);
  }
}

TEST(ShmCommunicator, SigstoppedPeerGivesCommErrorAtTheTimeout) {
  auto out = inject_failure(SIGSTOP, 2s);
  ASSERT_EQ(out.seconds.size(), 2u);
  for (size_t i = 0; i < out.seconds.size(); ++i) {
    std::printf("survivor %zu: CommError %.1f ms after SIGSTOP: %s\n", i, out.seconds[i] * 1e3, out.messages[i].c_str());
    // The deadline counts from the start of the operation the stop interrupted.
    EXPECT_GT(out.seconds[i], 1.0);
    EXPECT_LT(out.seconds[i], 15.0);
    EXPECT_NE(out.messages[i].find("rank 2"), std::string::npos) << out.messages[i];
    EXPECT_EQ(out.failed_ranks[i], 2);
    EXPECT_EQ(out.fates[i], PeerFate::kAlive);  // stopped, not gone: the driver must kill it
  }
}

TEST(ShmCommunicator, ASegmentOthersCouldReadIsRefused) {
  MemoryKvStore store;
  const std::string name = "/erun-" + g_tag + "-planted";
  int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::fchmod(fd, 0644), 0);
  ASSERT_EQ(::ftruncate(fd, 1 << 16), 0);
  ::close(fd);
  std::string record = name + " 0";
  store.set("segment", std::vector<char>(record.begin(), record.end()));
  try {
    make_shm_communicator(store, options(1, 2, 2s));
    ADD_FAILURE() << "a planted segment was accepted";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("not private to this user"), std::string::npos) << e.what();
  }
  ::shm_unlink(name.c_str());
}

// Runs `calls[rank]` on every rank (threads, or forked processes when
// `processes`) and expects a CollectiveMismatch on every rank whose message
// contains each of `want`, well before the timeout.
void expect_mismatch(const std::vector<std::function<void(Communicator&)>>& calls,
                     const std::vector<std::string>& want, bool processes = false, Staging st = kDefault) {
  const int size = static_cast<int>(calls.size());
  auto fn = [&](int rank, Communicator& comm) -> std::string {
    comm.barrier();  // a matched call first
    try {
      calls[rank](comm);
    } catch (const CollectiveMismatch& e) {
      std::string msg = e.what();
      for (const auto& w : want) {
        if (msg.find(w) == std::string::npos) return "message lacks '" + w + "': " + msg;
      }
      // The communicator stays unusable afterwards.
      try {
        comm.barrier();
        return "barrier after a mismatch succeeded";
      } catch (const CommError&) {
        return "";
      }
    } catch (const CommError& e) {
      return std::string("CommError instead of CollectiveMismatch: ") + e.what();
    }
    return "no error";
  };
  auto start = std::chrono::steady_clock::now();
  std::string errors = processes ? run_processes(size, fn, st) : run_threads(size, fn, st, 60s);
  EXPECT_EQ(errors, "");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 20s);  // found at once, not at the 60 s timeout
}

// State::commit() on rank 0 only: its host-update allreduce meets the others'
// gradient allreduce.
TEST(ShmMismatch, CollectiveCalledByOneRankOnly) {
  auto grad = [](Communicator& c) {
    std::vector<float> g(1000, 1.f);
    c.allreduce(g, ReduceOp::kSum);
  };
  auto commit = [](Communicator& c) {
    std::vector<int64_t> v(3, 0);
    c.allreduce(v, ReduceOp::kMax);
  };
  expect_mismatch({commit, grad, grad},
                  {"rank 0 called allreduce(int64 x 3, max); ranks 1, 2 called allreduce(float32 x 1000, sum)",
                   "mismatched collectives", "register it in the State"});
}

TEST(ShmMismatch, DifferentKindsNameEveryCall) {
  auto ar = [](Communicator& c) {
    std::vector<float> g(1000, 1.f);
    c.allreduce(g, ReduceOp::kSum);
  };
  auto bc = [](Communicator& c) {
    std::vector<char> b(4096);
    c.broadcast(b.data(), b.size(), 0);
  };
  auto ag = [](Communicator& c) {
    int64_t v = 1, out[4];
    c.allgather(&v, out, sizeof(v));
  };
  expect_mismatch({ar, ar, bc, ag},
                  {"ranks 0, 1 called allreduce(float32 x 1000, sum); rank 2 called broadcast(4096 bytes, root 0); "
                   "rank 3 called allgather(8 bytes per rank)"});
}

TEST(ShmMismatch, DifferentCountsTypesOpsAndRootsOnThePipelinedPaths) {
  auto ar = [](size_t n, ReduceOp op) {
    return [n, op](Communicator& c) {
      std::vector<float> g(n, 1.f);
      c.allreduce(g, op);
    };
  };
  // Large enough for the pipelined path on the tiny staging.
  expect_mismatch({ar(100000, ReduceOp::kSum), ar(100001, ReduceOp::kSum)},
                  {"rank 0 called allreduce(float32 x 100000, sum); rank 1 called allreduce(float32 x 100001, sum)"},
                  false, kTiny);
  expect_mismatch({ar(5000, ReduceOp::kSum), ar(5000, ReduceOp::kAverage)}, {"x 5000, average"}, false, kTiny);
  auto f64 = [](Communicator& c) {
    std::vector<double> g(10, 1.0);
    c.allreduce(g, ReduceOp::kSum);
  };
  expect_mismatch({ar(10, ReduceOp::kSum), f64}, {"rank 1 called allreduce(float64 x 10, sum)"});
  auto bc = [](int root) {
    return [root](Communicator& c) {
      std::vector<char> b(1 << 20);
      c.broadcast(b.data(), b.size(), root);
    };
  };
  expect_mismatch({bc(0), bc(1), bc(0)}, {"ranks 0, 2 called broadcast(1048576 bytes, root 0); rank 1 called "
                                          "broadcast(1048576 bytes, root 1)"});
}

TEST(ShmMismatch, ProcessesSeeItToo) {
  auto grad = [](Communicator& c) {
    std::vector<float> g(1 << 18, 1.f);
    c.allreduce(g, ReduceOp::kSum);
  };
  auto bar = [](Communicator& c) { c.barrier(); };
  expect_mismatch({grad, grad, bar}, {"ranks 0, 1 called allreduce(float32 x 262144, sum); rank 2 called barrier"},
                  /*processes=*/true);
}

// Matched sequences of every kind, with sizes that differ only where the
// operation allows it (allgatherv), raise nothing: covered by the tests above
// (MixedSequenceOfOperations, AllgathervWithDifferentSizesIncludingZero).

}  // namespace
}  // namespace erun
