// erun's guards against silent mistakes, end to end: a worker program that
// calls State::commit() on rank 0 only (tests/programs/mismatch_worker) runs
// under the real erun with the shared-memory communicator. Without the guard
// its numbers were silently corrupted; now every rank stops at once with an
// error naming the ranks and their calls, and the job fails. The same
// program without the bug trains to the right value.
#include <gtest/gtest.h>

#include <chrono>

#include "support/erun_process.h"

namespace erun::testing {
namespace {

using namespace std::chrono_literals;

TEST(ErunGuards, CommitOnRankZeroOnlyEndsTheJobWithTheRanksAndCalls) {
  const auto start = std::chrono::steady_clock::now();
  ErunProcess p({"-np", "3", build_path("tests/programs/mismatch_worker"), "rank0-commit"});
  auto s = p.wait(120s);
  ASSERT_TRUE(s) << p.err();
  EXPECT_NE(s->shell_code(), 0) << p.out() << p.err();
  const std::string want =
      "rank 0 called allreduce(int64 x 3, max); ranks 1, 2 called allreduce(float32 x 1000, average)";
  // Every rank reports it at once (the unit tests check all of them; here
  // the driver may stop the last one before its line is out, so two of
  // three suffice). The driver's root-cause lines repeat one of them.
  const std::string all = p.out() + p.err();
  int reported = 0;
  for (const char* tag : {"[0]<stderr>", "[1]<stderr>", "[2]<stderr>"}) {
    bool found = false;
    for (size_t pos = all.find(tag); pos != std::string::npos; pos = all.find(tag, pos + 1)) {
      const size_t eol = all.find('\n', pos);
      if (all.substr(pos, eol - pos).find(want) != std::string::npos) found = true;
    }
    reported += found ? 1 : 0;
  }
  EXPECT_GE(reported, 2) << "the ranks do not name the calls:\n" << all;
  EXPECT_NE(p.err().find("root cause"), std::string::npos) << p.err();
  EXPECT_EQ(p.out().find("final w"), std::string::npos) << "a rank finished training:\n" << p.out();
  // At the first mismatched call, not at a collective timeout.
  EXPECT_LT(std::chrono::steady_clock::now() - start, 25s);
}

TEST(ErunGuards, AnElasticJobEndsTooInsteadOfRestartingForever) {
  const auto start = std::chrono::steady_clock::now();
  ErunProcess p({"-np", "3", "--min-np", "2", "--max-np", "3", build_path("tests/programs/mismatch_worker"),
                 "rank0-commit"});
  auto s = p.wait(120s);
  ASSERT_TRUE(s) << p.err();
  EXPECT_NE(s->shell_code(), 0) << p.err();
  EXPECT_NE(p.err().find("stopped for an error in the program that a restart would repeat"),
            std::string::npos)
      << p.err();
  EXPECT_EQ(p.err().find("gen 2"), std::string::npos) << "the job was restarted:\n" << p.err();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 25s);
}

TEST(ErunGuards, TheSameProgramWithoutTheBugTrainsToTheRightValue) {
  ErunProcess p({"-np", "3", build_path("tests/programs/mismatch_worker"), "correct"});
  auto s = p.wait(120s);
  ASSERT_TRUE(s) << p.err();
  EXPECT_EQ(s->shell_code(), 0) << p.out() << p.err();
  // The targets are 1, 2, 3: the averaged gradient drives w to 2 on every rank.
  EXPECT_EQ(p.count("final w[0]=2 finite=yes"), 3u) << p.out();
}

}  // namespace
}  // namespace erun::testing
