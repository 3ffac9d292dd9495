// Subprocess's options for the agent's workers: its own session, the
// announcement line, errors written on the child's stderr, PATH from the
// child's environment, and no inherited descriptor above 2.
#include "common/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include <gtest/gtest.h>

namespace erun {
namespace {

std::string read_rest(int fd) {
  std::string out;
  EXPECT_TRUE(read_all_until(fd, out, std::chrono::steady_clock::now() + std::chrono::seconds(10)));
  return out;
}

TEST(SubprocessTest, ANewSessionIsLedByTheChildAndAnnouncedFirst) {
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", "exec cat"};
  o.pipe_stdin = true;
  o.new_session = true;
  o.announce = SpawnOptions::Announce{fds[1], "A ", " 250\n"};
  auto p = Subprocess::spawn(o);
  ASSERT_TRUE(p) << p.message();
  ::close(fds[1]);
  EXPECT_EQ(::getsid(p->pid()), p->pid());
  EXPECT_EQ(read_rest(fds[0]), "A " + std::to_string(p->pid()) + " 250\n");
  ::close(fds[0]);
  p->close_stdin();
  EXPECT_TRUE(p->wait_for(std::chrono::seconds(10)).has_value());
}

// Spawns `o` with errors on stderr; expects `said` there and kCannotStart.
void expect_cannot_start(SpawnOptions o, const std::string& said) {
  o.errors_on_stderr = SpawnOptions::ErrorsOnStderr{"no cwd here\n", "cannot run it: "};
  auto p = Subprocess::spawn(o);
  ASSERT_TRUE(p) << p.message();
  EXPECT_EQ(read_rest(p->stderr_fd()), said);
  auto st = p->wait_for(std::chrono::seconds(10));
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->code, kCannotStart);
}

TEST(SubprocessTest, ErrorsOnStderrReportACwdThatCannotBeEntered) {
  SpawnOptions o;
  o.argv = {"/bin/true"};
  o.cwd = "/nonexistent/erun-subprocess-test";
  expect_cannot_start(o, "no cwd here\n");
}

TEST(SubprocessTest, ErrorsOnStderrReportAProgramThatCannotRun) {
  SpawnOptions o;
  o.argv = {"erun-no-such-program-xyz"};
  expect_cannot_start(o, std::string("cannot run it: ") + std::strerror(ENOENT) + "\n");
}

TEST(SubprocessTest, WithoutErrorsOnStderrSpawnReturnsTheError) {
  SpawnOptions o;
  o.argv = {"erun-no-such-program-xyz"};
  auto p = Subprocess::spawn(o);
  EXPECT_FALSE(p);
}

TEST(SubprocessTest, PathFromEnvLooksTheProgramUpInTheChildsPath) {
  SpawnOptions o;
  o.argv = {"sh", "-c", "echo ok"};
  o.env = std::vector<std::string>{"PATH=/bin:/usr/bin"};
  o.path_from_env = true;
  auto p = Subprocess::spawn(o);
  ASSERT_TRUE(p) << p.message();
  EXPECT_EQ(read_rest(p->stdout_fd()), "ok\n");
}

TEST(SubprocessTest, CloseOtherFdsLeavesNoInheritedDescriptor) {
  int inherited = ::open("/dev/null", O_RDONLY);  // not close-on-exec
  ASSERT_GE(inherited, 3);
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", "ls /proc/self/fd"};
  o.close_other_fds = true;
  auto p = Subprocess::spawn(o);
  ::close(inherited);
  ASSERT_TRUE(p) << p.message();
  // ls's own descriptor for /proc/self/fd is 3.
  EXPECT_EQ(read_rest(p->stdout_fd()), "0\n1\n2\n3\n");
}

TEST(SubprocessTest, ReleaseHandsTheChildOver) {
  SpawnOptions o;
  o.argv = {"/bin/sleep", "30"};
  pid_t pid;
  {
    auto p = Subprocess::spawn(o);
    ASSERT_TRUE(p) << p.message();
    pid = p->release();
  }
  EXPECT_EQ(::kill(pid, 0), 0);  // not killed by the destructor
  ::kill(-pid, SIGKILL);
  int st;
  EXPECT_EQ(::waitpid(pid, &st, 0), pid);
}

}  // namespace
}  // namespace erun
