// The watchdog's line protocol (agent/watchdog.h): lines in, the groups and
// directories it would stop and remove out.
#include "agent/watchdog.h"

#include <gtest/gtest.h>

namespace erun::agent {
namespace {

TEST(AgentWatchdogTest, AddsAndRemovesGroups) {
  WatchdogState s;
  s.feed("A 100 5000\nA 200 250\nH\nR 100\n");
  EXPECT_EQ(s.groups, (std::map<pid_t, long>{{200, 250}}));
  s.feed("A 200 900\n");
  EXPECT_EQ(s.groups, (std::map<pid_t, long>{{200, 900}}));
}

TEST(AgentWatchdogTest, KeepsAPartialLineForTheNextRead) {
  WatchdogState s;
  s.feed("A 12");
  EXPECT_TRUE(s.groups.empty());
  s.feed("3 40\nR");
  EXPECT_EQ(s.groups, (std::map<pid_t, long>{{123, 40}}));
  s.feed(" 123\n");
  EXPECT_TRUE(s.groups.empty());
  EXPECT_TRUE(s.partial.empty());
}

TEST(AgentWatchdogTest, IgnoresMalformedLinesAndGroupsZeroAndOne) {
  WatchdogState s;
  s.feed("A 0 10\nA 1 10\nA -5 10\nA 7\nA 7 10 3\nA x 10\nA 7 y\nX 7 10\n\nR\nR 7 8\n");
  EXPECT_TRUE(s.groups.empty());
  s.feed("A 7 10\nR x\nR 8\n");
  EXPECT_EQ(s.groups, (std::map<pid_t, long>{{7, 10}}));
}

TEST(AgentWatchdogTest, TakesAbsoluteDirectoriesOnly) {
  WatchdogState s;
  s.feed("D relative\nC relative\nD\nC \n");
  EXPECT_TRUE(s.relay_dir.empty());
  EXPECT_TRUE(s.commit_dir.empty());
  s.feed("D /tmp/erun-relay.x\nC /dev/shm/erun-job a\n");
  EXPECT_EQ(s.relay_dir, "/tmp/erun-relay.x");
  EXPECT_EQ(s.commit_dir, "/dev/shm/erun-job a");
  s.feed("D /tmp/other\n");
  EXPECT_EQ(s.relay_dir, "/tmp/other");
  EXPECT_TRUE(s.groups.empty());
}

TEST(AgentWatchdogTest, KeepsCommitsThroughTheDriversGraceUntilADriverIsBack) {
  WatchdogState s;
  EXPECT_EQ(s.keep_commits_until, std::chrono::steady_clock::time_point{});
  const auto before = std::chrono::steady_clock::now();
  s.feed("G 60000\n");
  EXPECT_GE(s.keep_commits_until, before + std::chrono::seconds(60));
  EXPECT_LE(s.keep_commits_until, std::chrono::steady_clock::now() + std::chrono::seconds(60));
  s.feed("G -5\nG x\nG\n");  // malformed: unchanged
  EXPECT_GE(s.keep_commits_until, before + std::chrono::seconds(60));
  s.feed("G 0\n");
  EXPECT_EQ(s.keep_commits_until, std::chrono::steady_clock::time_point{});
  EXPECT_TRUE(s.groups.empty());
}

}  // namespace
}  // namespace erun::agent
