// OomWatch (common/oom.h): which file holds a process's OOM kill count, on
// cgroup v1, v2 and a hybrid of both, and whether the count rose since the
// watch. The cgroup trees here are temp directories named by made-up mounts;
// the real kernel's OOM kills are tried by tests/integration/erun_oom_test.cc.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "common/oom.h"
#include "support/erun_process.h"

namespace erun::testing {
namespace {

TEST(OomWatch, ReadsTheOomKillCountOfBothFormats) {
  // v1's memory.oom_control, v2's memory.events.
  EXPECT_EQ(OomWatch::parse_count("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n"), 3u);
  EXPECT_EQ(OomWatch::parse_count("low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\noom_group_kill 0\n"), 2u);
  EXPECT_FALSE(OomWatch::parse_count("oom_kill_disable 0\nunder_oom 0\n"));  // a kernel older than 4.13
  EXPECT_FALSE(OomWatch::parse_count("oom_kill x\n"));
  EXPECT_FALSE(OomWatch::parse_count(""));
}

class OomWatchTree : public ::testing::Test {
 protected:
  void counter(const std::string& relative, const std::string& text) {
    std::filesystem::create_directories(dir_.file(relative).substr(0, dir_.file(relative).rfind('/')));
    dir_.write(relative, text);
  }
  TempDir dir_;
};

TEST_F(OomWatchTree, AV1MemoryHierarchyWinsOverTheHybridsUnifiedTree) {
  counter("v1/job/step/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n");
  const std::string mounts = "cgroup2 " + dir_.file("unified") + " cgroup2 rw 0 0\n" + "cgroup " + dir_.file("cpu") +
                             " cgroup rw,cpu 0 0\n" + "cgroup " + dir_.file("v1") + " cgroup rw,relatime,memory 0 0\n";
  const std::string cgroup = "9:name=systemd:/\n4:memory:/job/step\n1:cpu:/\n0::/\n";
  OomWatch w = OomWatch::of(cgroup, mounts);
  EXPECT_EQ(w.counter_file(), dir_.file("v1/job/step/memory.oom_control"));
  EXPECT_FALSE(w.fired());
  counter("v1/job/step/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n");
  EXPECT_TRUE(w.fired());
}

TEST_F(OomWatchTree, AV2CgroupUsesItsMemoryEvents) {
  counter("v2/slurm/job_7/step_0/memory.events", "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n");
  OomWatch w = OomWatch::of("0::/slurm/job_7/step_0\n", "cgroup2 " + dir_.file("v2") + " cgroup2 rw,nosuid 0 0\n");
  EXPECT_EQ(w.counter_file(), dir_.file("v2/slurm/job_7/step_0/memory.events"));
  EXPECT_FALSE(w.fired());
  counter("v2/slurm/job_7/step_0/memory.events", "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n");
  EXPECT_TRUE(w.fired());
}

TEST_F(OomWatchTree, NoMemoryControllerIsAnEmptyWatchThatNeverFires) {
  // v2's root has no memory.events; a hybrid without v1's memory hierarchy
  // has only the unified tree, without the controller.
  EXPECT_TRUE(OomWatch::of("0::/\n", "cgroup2 " + dir_.file("v2") + " cgroup2 rw 0 0\n").counter_file().empty());
  EXPECT_TRUE(OomWatch::of("4:memory:/a\n", "cgroup2 " + dir_.file("v2") + " cgroup2 rw 0 0\n").counter_file().empty());
  EXPECT_TRUE(OomWatch::of("", "").counter_file().empty());
  EXPECT_FALSE(OomWatch().fired());
  // A counter file that goes away (the cgroup removed) does not fire.
  counter("v2/a/memory.events", "oom_kill 0\n");
  OomWatch w = OomWatch::of("0::/a\n", "cgroup2 " + dir_.file("v2") + " cgroup2 rw 0 0\n");
  ASSERT_FALSE(w.counter_file().empty());
  std::filesystem::remove(w.counter_file());
  EXPECT_FALSE(w.fired());
}

TEST(OomWatch, ALiveProcessOfThisMachineIsWatchedWhereItHasAMemoryCgroup) {
  OomWatch w = OomWatch::of(::getpid());
  if (w.counter_file().empty()) GTEST_SKIP() << "no memory cgroup with an OOM kill count here";
  EXPECT_EQ(::access(w.counter_file().c_str(), R_OK), 0) << w.counter_file();
  EXPECT_TRUE(OomWatch::of(999999999).counter_file().empty());  // no such process
}

}  // namespace
}  // namespace erun::testing
