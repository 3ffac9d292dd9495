// Hostile and broken input end to end, with the real erun binary: a discovery
// script printing a NUL-and-shell-metacharacter line and a 1 MB junk line
// while the job runs (the job goes on with the previous hosts, the error names
// the line, nothing is executed, no raw control byte reaches the log), and
// crash loops (a mistyped program, a training function that always throws)
// that end the job with the program's exit code and a root cause, within a
// bounded time and with no process left behind.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>

#include "support/erun_process.h"
#include "support/process_utils.h"

namespace erun::testing {
namespace {

using namespace std::chrono_literals;

double since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

TEST(ErunHostile, DiscoveryPrintingNulShellAndJunkLinesKeepsThePreviousHosts) {
  TempDir dir;
  std::string marker = dir.file("touched");
  dir.write("hosts", "localhost:2\n");
  // The script prints the file; the test swaps in the hostile output.
  dir.write("discover.sh", "#!/bin/sh\ncat " + dir.file("hosts") + "\n", true);
  std::string prog = dir.file("work.sh");
  dir.write("work.sh", "#!/bin/sh\necho started rank $RANK\nsleep 4\necho done rank $RANK\n", true);
  ErunProcess p({"--host-discovery-script", dir.file("discover.sh"), "--discovery-interval", "0.2", "-np", "2",
                 "--min-np", "1", "--mode", "restart", prog});
  ASSERT_TRUE(p.wait_output("started rank 1", 30s)) << p.err();

  std::string hostile = std::string("127.0.0.9\0';touch${IFS}", 23) + marker + ";':1\n";
  std::string junk(1 << 20, 'j');
  junk[7] = '\x1b';
  {
    std::ofstream f(dir.file("hosts.new"), std::ios::binary);
    f << "localhost:2\n" << hostile << junk << "\n";
  }
  ASSERT_EQ(::rename(dir.file("hosts.new").c_str(), dir.file("hosts").c_str()), 0);
  ASSERT_TRUE(p.wait_output("discovery output line 2", 10s)) << p.err();

  auto s = p.wait(60s);
  ASSERT_TRUE(s) << p.err();
  EXPECT_EQ(s->shell_code(), 0) << p.err();
  EXPECT_EQ(p.count("done rank"), 2u) << p.out();
  std::string err = p.err();
  EXPECT_NE(err.find("\"127.0.0.9\\0';touch${IFS}"), std::string::npos) << err.substr(0, 4000);
  EXPECT_NE(err.find("byte 10 is the control character '\\0'"), std::string::npos) << err.substr(0, 4000);
  EXPECT_NE(err.find("keeping the previous hosts (localhost:2)"), std::string::npos) << err.substr(0, 4000);
  EXPECT_EQ(err.find('\0'), std::string::npos);
  EXPECT_EQ(err.find('\x1b'), std::string::npos);
  EXPECT_LT(err.size(), 64u * 1024) << "the 1 MB line reached the log";
  EXPECT_EQ(p.count("gen 2:"), 0u);  // no relaunch
  struct stat st {};
  EXPECT_NE(::stat(marker.c_str(), &st), 0) << "the hostile line ran a command";

  // The junk line alone, first in the output: also refused, cut in the log.
  {
    std::ofstream f(dir.file("hosts"), std::ios::binary);
    f << junk << "\n";
  }
  ErunProcess q({"--host-discovery-script", dir.file("discover.sh"), "-np", "1", "--min-np", "1", prog});
  auto qs = q.wait(30s);
  ASSERT_TRUE(qs);
  EXPECT_EQ(qs->shell_code(), 1);
  EXPECT_NE(q.err().find("... (1048576 bytes)"), std::string::npos) << q.err().substr(0, 2000);
  EXPECT_NE(q.err().find("byte 8 is the control character '\\x1b'"), std::string::npos) << q.err().substr(0, 2000);
  EXPECT_LT(q.err().size(), 8u * 1024);
}

TEST(ErunHostile, MistypedProgramEndsAsACrashLoopWithExitCode127) {
  TempDir dir;
  dir.write("hosts", "localhost:2\n");
  dir.write("discover.sh", "#!/bin/sh\ncat " + dir.file("hosts") + "\n", true);
  auto t0 = std::chrono::steady_clock::now();
  ErunProcess p({"--host-discovery-script", dir.file("discover.sh"), "-np", "2", "--min-np", "1",
                 "--blacklist-cooldown-range", "1", "2", "./nosuch-program"});
  auto s = p.wait(90s);
  ASSERT_TRUE(s) << "still looping after 90 s\n" << p.err();
  EXPECT_EQ(s->shell_code(), 127) << p.err();
  EXPECT_LT(since(t0), 60);
  EXPECT_EQ(p.count("crash loop: generations 1-3 (3 in a row) all failed with exit code 127"), 1u) << p.err();
  EXPECT_GE(p.count("command not found"), 1u);
  EXPECT_EQ(p.count("root cause: gen 3 localhost"), 1u) << p.err();
  EXPECT_TRUE(wait_no_process("nosuch-program", 10s));
}

TEST(ErunHostile, TrainingFunctionThatAlwaysThrowsEndsAsACrashLoop) {
  TempDir dir;
  dir.write("hosts", "localhost:2\n");
  dir.write("discover.sh", "#!/bin/sh\ncat " + dir.file("hosts") + "\n", true);
  std::string program = build_path("examples/train_mlp");
  auto t0 = std::chrono::steady_clock::now();
  ErunProcess p({"--host-discovery-script", dir.file("discover.sh"), "-np", "2", "--min-np", "1",
                 "--blacklist-cooldown-range", "1", "2", program, "--samples", "2000", "--fail-at-step", "2"});
  auto s = p.wait(120s);
  ASSERT_TRUE(s) << "still looping after 120 s\n" << p.err();
  EXPECT_EQ(s->shell_code(), 1) << p.err();
  EXPECT_LT(since(t0), 90);
  EXPECT_EQ(p.count("crash loop: generations"), 1u) << p.err();
  EXPECT_GE(p.count("--fail-at-step 2: failing on purpose"), 1u) << p.err();
  EXPECT_EQ(p.count("root cause:"), 1u) << p.err();
  std::vector<pid_t> left;
  EXPECT_TRUE(wait_no_process(program, 10s, &left)) << describe_pids(left);
}

}  // namespace
}  // namespace erun::testing
