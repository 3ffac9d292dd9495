// The watchdog's line protocol (agent/watchdog.h): lines in, the groups and
// directories it would stop and remove out.
#include "agent/watchdog.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <string>

#include "agent/protocol.h"

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

TEST(AgentWatchdogTest, NotesAnEndOnPurposeAndAChannelLetGo) {
  WatchdogState s;
  s.feed("H\no\n");
  EXPECT_TRUE(s.channel_dropped);
  EXPECT_FALSE(s.ended_on_purpose);
  s.feed("O\nE\n");
  EXPECT_TRUE(s.ended_on_purpose);
}

// What the driver reads on the channel it handed the watchdog, until the
// watchdog and this test have let go of it (5 s at most).
std::string read_to_end(int fd) {
  std::string out;
  char buf[256];
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

// A real watchdog (this process plays its agent): handed the driver's
// channel, it writes ENDED there when its agent's channel ends without "E",
// and nothing when it ends with one.
TEST(AgentWatchdogTest, WritesEndedOnTheDriversChannelOnlyWhenTheAgentDiesWithoutAWord) {
  for (bool on_purpose : {false, true}) {
    int driver[2];
    ASSERT_EQ(::pipe2(driver, O_CLOEXEC), 0);
    const int wd = spawn_watchdog(0);
    ASSERT_GE(wd, 0);
    ASSERT_TRUE(send_channel_to_watchdog(wd, driver[1]));
    ::close(driver[1]);  // the watchdog's copy is the only writer now
    if (on_purpose) {
      ASSERT_EQ(::write(wd, "E\n", 2), 2);
    }
    ::close(wd);  // the agent's end: its death, or its exit after "E"
    const std::string got = read_to_end(driver[0]);
    ::close(driver[0]);
    if (on_purpose) {
      EXPECT_EQ(got, "") << "an end on purpose tells the driver nothing";
    } else {
      EXPECT_EQ(got, encode(Ended{0})) << "no OOM kill in this process's cgroup";
    }
  }
}

// What the agent tells a watchdog as it starts it is in the channel before
// the watchdog runs: an agent SIGKILLed right after the start (here: its
// end closed without another word) still has its workers' group stopped
// and its relay directory removed.
TEST(AgentWatchdogTest, AnAgentLostRightAfterStartingItsWatchdogLeavesNothing) {
  char dir_template[] = "/tmp/erun-watchdog-test-XXXXXX";
  ASSERT_NE(::mkdtemp(dir_template), nullptr);
  const std::string relay_dir = dir_template;
  const pid_t worker = ::fork();
  ASSERT_GE(worker, 0);
  if (worker == 0) {
    ::setpgid(0, 0);
    ::execlp("sleep", "sleep", "60", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::setpgid(worker, worker);
  const int wd = spawn_watchdog(0, "A " + std::to_string(worker) + " 100\nD " + relay_dir + "\n");
  ASSERT_GE(wd, 0);
  ::close(wd);
  int status = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  pid_t got = 0;
  while (got == 0 && std::chrono::steady_clock::now() < until) {
    got = ::waitpid(worker, &status, WNOHANG);
    if (got == 0) ::usleep(10'000);
  }
  if (got == 0) ::kill(worker, SIGKILL);
  ASSERT_EQ(got, worker) << "the worker's group was not stopped";
  EXPECT_TRUE(WIFSIGNALED(status)) << status;
  while (::access(relay_dir.c_str(), F_OK) == 0 && std::chrono::steady_clock::now() < until) ::usleep(10'000);
  EXPECT_NE(::access(relay_dir.c_str(), F_OK), 0) << relay_dir << " outlived its agent";
  ::rmdir(relay_dir.c_str());
}

}  // namespace
}  // namespace erun::agent
