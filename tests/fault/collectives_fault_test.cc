// Gloo collectives among real processes (fork) over a FileKvStore: a peer that
// is SIGKILLed mid-allreduce makes the others throw CommError at once; a peer
// that is SIGSTOPped makes them throw within the collective timeout. No
// process is left behind.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "collectives/file_store.h"
#include "common/check.h"
#include "collectives/gloo/gloo_communicator.h"

namespace erun {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/erun_coll_fault_XXXXXX";
    ERUN_CHECK(::mkdtemp(tmpl) != nullptr);
    path_ = tmpl;
  }
  ~TempDir() { fs::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Exit codes of a rank process.
constexpr int kCommErrorSeen = 0;
constexpr int kNoError = 10;
constexpr int kOtherError = 11;

// A rank: builds its communicator, writes "<dir>/running.<rank>" after a few
// allreduces, and loops until a CommError, which it timestamps in
// "<dir>/error.<rank>".
[[noreturn]] void rank_main(const std::string& dir, int rank, int size, Duration timeout) {
  int code = kOtherError;
  try {
    FileKvStore store(dir + "/store");
    GlooOptions o;
    o.rank = rank;
    o.size = size;
    o.timeout = timeout;
    o.prefix = "fault";
    auto comm = make_gloo_communicator(store, o);
    std::vector<float> v(1 << 16, 1.0f);
    const auto give_up = std::chrono::steady_clock::now() + 120s;
    code = kNoError;
    for (int i = 0; std::chrono::steady_clock::now() < give_up; ++i) {
      try {
        comm->allreduce(v, ReduceOp::kAverage);
      } catch (const CommError& e) {
        std::ofstream(dir + "/error." + std::to_string(rank)) << now_ns() << "\n" << e.what() << "\n";
        code = kCommErrorSeen;
        break;
      }
      if (i == 20) std::ofstream(dir + "/running." + std::to_string(rank)) << "1";
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    code = kOtherError;
  }
  std::_Exit(code);
}

struct Ranks {
  std::vector<pid_t> pids;
  ~Ranks() {
    for (pid_t p : pids) {
      if (p > 0) {
        ::kill(p, SIGKILL);
        ::waitpid(p, nullptr, 0);
      }
    }
  }
  // Waits for rank r to exit; returns its exit code, or -1 on a signal or timeout.
  int wait(int r, Duration timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      int status = 0;
      pid_t got = ::waitpid(pids[r], &status, WNOHANG);
      if (got == pids[r]) {
        pids[r] = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      if (std::chrono::steady_clock::now() >= deadline) return -1;
      std::this_thread::sleep_for(5ms);
    }
  }
  void kill_and_reap(int r) {
    ::kill(pids[r], SIGKILL);
    ::waitpid(pids[r], nullptr, 0);
    pids[r] = -1;
  }
};

Ranks start_ranks(const std::string& dir, int size, Duration timeout) {
  Ranks ranks;
  std::fflush(nullptr);
  for (int r = 0; r < size; ++r) {
    pid_t pid = ::fork();
    ERUN_CHECK(pid >= 0);
    if (pid == 0) rank_main(dir, r, size, timeout);
    ranks.pids.push_back(pid);
  }
  return ranks;
}

bool wait_for_file(const std::string& path, Duration timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!fs::exists(path)) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

double detection_seconds(const std::string& dir, int rank, int64_t since_ns) {
  std::ifstream in(dir + "/error." + std::to_string(rank));
  int64_t at = 0;
  in >> at;
  return (at - since_ns) / 1e9;
}

void expect_all_gone(const std::vector<pid_t>& original) {
  for (pid_t p : original) EXPECT_NE(::kill(p, 0), 0) << "process " << p << " is still there";
}

TEST(CollectivesFault, KilledPeerFailsTheOthersQuickly) {
  TempDir dir;
  const int size = 3, victim = 2;
  const Duration timeout = 20s;
  Ranks ranks = start_ranks(dir.path(), size, timeout);
  const auto original = ranks.pids;
  ASSERT_TRUE(wait_for_file(dir.path() + "/running." + std::to_string(victim), 60s)) << "ranks never got going";
  const int64_t killed_at = now_ns();
  ranks.kill_and_reap(victim);
  for (int r = 0; r < size; ++r) {
    if (r == victim) continue;
    ASSERT_EQ(ranks.wait(r, 60s), kCommErrorSeen) << "rank " << r;
    double took = detection_seconds(dir.path(), r, killed_at);
    std::printf("rank %d saw the SIGKILLed peer after %.3f s (timeout 20 s)\n", r, took);
    EXPECT_LT(took, 5.0) << "a dead peer must be seen well before the 20 s timeout";
  }
  expect_all_gone(original);
}

TEST(CollectivesFault, StoppedPeerFailsTheOthersWithinTheTimeout) {
  TempDir dir;
  const int size = 3, victim = 1;
  const Duration timeout = 2s;
  Ranks ranks = start_ranks(dir.path(), size, timeout);
  const auto original = ranks.pids;
  ASSERT_TRUE(wait_for_file(dir.path() + "/running." + std::to_string(victim), 60s)) << "ranks never got going";
  const int64_t stopped_at = now_ns();
  ::kill(ranks.pids[victim], SIGSTOP);
  for (int r = 0; r < size; ++r) {
    if (r == victim) continue;
    ASSERT_EQ(ranks.wait(r, 60s), kCommErrorSeen) << "rank " << r;
    double took = detection_seconds(dir.path(), r, stopped_at);
    std::printf("rank %d saw the SIGSTOPped peer after %.3f s (timeout 2 s)\n", r, took);
    EXPECT_LT(took, 2.0 + 8.0) << "a hung peer must be seen within the timeout plus a margin";
  }
  ranks.kill_and_reap(victim);
  expect_all_gone(original);
}

TEST(CollectivesFault, ProcessesAgreeThroughTheFileStore) {
  TempDir dir;
  const int size = 4;
  Ranks ranks;
  std::fflush(nullptr);
  for (int r = 0; r < size; ++r) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int code = 1;
      try {
        FileKvStore store(dir.path() + "/store");
        GlooOptions o;
        o.rank = r;
        o.size = size;
        o.timeout = 30s;
        auto comm = make_gloo_communicator(store, o);
        int64_t sum = comm->allreduce_value<int64_t>(r + 1, ReduceOp::kSum);
        auto all = comm->allgatherv(&r, r % 2 ? sizeof(r) : 0);
        code = (sum == 10 && all[1].size() == sizeof(int) && all[0].empty()) ? 0 : 2;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
      }
      std::_Exit(code);
    }
    ranks.pids.push_back(pid);
  }
  for (int r = 0; r < size; ++r) EXPECT_EQ(ranks.wait(r, 60s), 0) << "rank " << r;
}

}  // namespace
}  // namespace erun
