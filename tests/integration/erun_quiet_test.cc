// What a person sees by default (issue 48, point 9): like mpirun and
// horovodrun, erun says warnings, errors, the ranks' tagged output and the
// closing summary, and nothing else; `--log-level info` (or ERUN_LOG_LEVEL)
// brings back every step, from erun, its agents and the workers' library,
// and -v the debug lines too. The test suite itself runs with
// ERUN_LOG_LEVEL=info (tests/CMakeLists.txt); these tests clear it.
#include <gtest/gtest.h>
#include <signal.h>

#include <sstream>
#include <thread>

#include "support/erun_process.h"
#include "support/process_utils.h"

namespace erun::testing {
namespace {

using namespace std::chrono_literals;

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) {
    if (!l.empty()) out.push_back(l);
  }
  return out;
}

TEST(ErunQuiet, AJobThatSucceedsSaysOnlyItsSummary) {
  ErunProcess p({"-np", "2", "/bin/true"}, {"ERUN_LOG_LEVEL="});
  auto st = p.wait(60s);
  ASSERT_TRUE(st && st->ok()) << p.err();
  const auto said = lines_of(p.err());
  ASSERT_EQ(said.size(), 3u) << p.err();
  EXPECT_EQ(said[0].rfind("erun: job ", 0), 0u) << p.err();
  EXPECT_NE(said[0].find("finished with exit code 0"), std::string::npos) << p.err();
  EXPECT_EQ(p.out(), "");
}

TEST(ErunQuiet, LogLevelInfoBringsBackEveryStepAndTheWorkersSayTheSame) {
  const std::string program = build_path("examples/train_mlp");
  const std::vector<std::string> train = {program, "--samples", "2000", "--epochs", "2", "--batch", "256"};
  for (const std::string level : {"", "info", "debug"}) {
    std::vector<std::string> args = {"-H", "localhost:2", "-np", "2"};
    if (!level.empty()) args.insert(args.end(), {"--log-level", level});
    args.insert(args.end(), {"/bin/sh", "-c", "echo level=$ERUN_LOG_LEVEL; exec \"$0\" \"$@\""});
    args.insert(args.end(), train.begin(), train.end());
    ErunProcess p(args, {"ERUN_LOG_LEVEL="});
    auto st = p.wait(120s);
    ASSERT_TRUE(st && st->ok()) << p.err();
    // The workers (their library) are handed erun's level.
    EXPECT_EQ(p.count("<stdout>:level=" + (level.empty() ? std::string("warn") : level) + "\n"), 2u) << p.out();
    EXPECT_EQ(p.err().find(" erun info: gen 1: all 2 ranks joined") != std::string::npos, !level.empty()) << p.err();
    EXPECT_EQ(p.err().find(" erun debug: ") != std::string::npos, level == "debug") << p.err();
    EXPECT_NE(p.out().find("final accuracy="), std::string::npos) << "the ranks' output is not shown\n" << p.out();
    EXPECT_NE(p.err().find("finished with exit code 0 in"), std::string::npos) << p.err();
  }
}

TEST(ErunQuiet, AFailureIsSaidWithoutTheStepsAroundIt) {
  ErunProcess p({"-np", "2", "/bin/sh", "-c", "exit 3"}, {"ERUN_LOG_LEVEL="});
  auto st = p.wait(60s);
  ASSERT_TRUE(st);
  EXPECT_EQ(st->code, 3) << p.err();
  EXPECT_NE(p.err().find(" erun error: root cause: "), std::string::npos) << p.err();
  EXPECT_EQ(p.err().find(" erun info: "), std::string::npos) << p.err();
}

TEST(ErunQuiet, AnUnknownLevelIsRefusedByName) {
  ErunProcess p({"--log-level", "loud", "-np", "1", "/bin/true"}, {"ERUN_LOG_LEVEL="});
  auto st = p.wait(30s);
  ASSERT_TRUE(st);
  EXPECT_EQ(st->code, 2);
  EXPECT_NE(p.err().find("--log-level loud: expected error, warn, info or debug"), std::string::npos) << p.err();
}

}  // namespace
}  // namespace erun::testing
