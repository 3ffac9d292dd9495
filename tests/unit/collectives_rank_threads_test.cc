// The ranks-as-threads harness itself (support/rank_threads.h): every rank
// runs, the first exception comes back to the caller, a failing rank's peers
// are released at once, and a hung rank fails the test at the deadline
// instead of hanging it.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>

#include "support/rank_threads.h"

namespace erun {
namespace {

using namespace std::chrono_literals;

TEST(RankThreads, RunsEveryRankAndRethrowsTheFirstException) {
  std::atomic<int> ran{0};
  testing::run_ranks(4, [&](int) { ran++; });
  EXPECT_EQ(ran.load(), 4);
  EXPECT_THROW(testing::run_ranks(3, [](int rank) {
                 if (rank == 1) throw std::runtime_error("rank 1 failed");
               }),
               std::runtime_error);
}

TEST(RankThreads, AFailingRankAbortsItsCommunicatorSoThePeersDoNotWait) {
  auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(testing::run_comms(testing::shm_backend(), 3,
                                  [](int rank, Communicator& comm) {
                                    if (rank == 2) throw std::runtime_error("rank 2 gives up");
                                    comm.barrier();  // rank 2 never comes: CommError once it aborts
                                  }),
               std::exception);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 20s);  // not the 60 s timeout
}

std::atomic<bool> g_release{false};

// Rank 1 never joins the barrier until the deadline hook releases it; the
// harness then aborts the communicators (rank 0's barrier throws) and fails
// the test.
void hang_until_the_deadline() {
  g_release = false;
  testing::RunOptions o;
  o.deadline = 500ms;
  o.on_deadline = [] { g_release = true; };
  EXPECT_THROW(testing::run_comms(
                   testing::shm_backend(), 2,
                   [](int rank, Communicator& comm) {
                     if (rank == 0) {
                       comm.barrier();
                       return;
                     }
                     while (!g_release) std::this_thread::sleep_for(5ms);
                   },
                   o),
               CommError);
}

TEST(RankThreads, AHungRankFailsTheTestAtTheDeadline) {
  auto start = std::chrono::steady_clock::now();
  EXPECT_NONFATAL_FAILURE(hang_until_the_deadline(), "ran past the deadline");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 20s);
}

}  // namespace
}  // namespace erun
