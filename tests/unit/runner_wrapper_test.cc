// The supervisor script's text and the control channel's writer, without
// launching workers (launcher_local_test runs the script for real).
#include "runner/worker_wrapper.h"

#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "common/subprocess.h"

namespace erun {
namespace {

WorkerSpec sample() {
  WorkerSpec s;
  s.host = "h";
  s.command = {"python3", "train.py", "--lr", "0.1 it's"};
  s.env = {{"ERUN_RANK", "3"}, {"WEIRD", "a'b\"c$d`e\nf"}};
  s.cwd = "/tmp/my dir";
  s.secret = "TOPSECRET-123";
  s.term_grace = std::chrono::milliseconds(2501);
  return s;
}

TEST(WorkerScript, HoldsEnvCwdAndCommandButNotTheSecret) {
  std::string script = worker_script(sample());
  EXPECT_EQ(script.find("TOPSECRET"), std::string::npos);
  EXPECT_NE(script.find("export ERUN_RANK=3\n"), std::string::npos);
  EXPECT_NE(script.find("export WEIRD='a'\\''b\"c$d`e\nf'\n"), std::string::npos);
  EXPECT_NE(script.find("cd -- '/tmp/my dir'"), std::string::npos);
  EXPECT_NE(script.find("python3 train.py --lr '0.1 it'\\''s'"), std::string::npos);
  EXPECT_NE(script.find("-lt 26 ]"), std::string::npos);  // 2.501 s in tenths, rounded up
}

TEST(WorkerScript, IsValidShellForDashAndBash) {
  std::string script = worker_script(sample());
  for (const char* shell : {"/bin/sh", "/bin/bash"}) {
    if (::access(shell, X_OK) != 0) continue;
    SpawnOptions o;
    o.argv = {shell, "-n", "-c", script};
    auto p = Subprocess::spawn(o);
    ASSERT_TRUE(p.is_ok()) << p.message();
    std::string err;
    EXPECT_TRUE(read_all_until(p->stderr_fd(), err, std::chrono::steady_clock::now() + std::chrono::seconds(20)));
    auto st = p->wait_for(std::chrono::seconds(20));
    ASSERT_TRUE(st);
    EXPECT_TRUE(st->ok()) << shell << ": " << err;
  }
}

TEST(WorkerScript, ValidationNamesTheProblem) {
  auto s = sample();
  EXPECT_TRUE(validate_worker_spec(s).is_ok());
  s.env.push_back({"1BAD", "x"});
  auto st = validate_worker_spec(s);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("1BAD"), std::string::npos);

  s = sample();
  s.secret = "two\nlines";
  EXPECT_FALSE(validate_worker_spec(s).is_ok());
  s = sample();
  s.command.clear();
  EXPECT_FALSE(validate_worker_spec(s).is_ok());
}

TEST(ControlLines, NameTheSignal) {
  EXPECT_EQ(control_line_terminate(), "TERM\n");
  EXPECT_EQ(control_line_kill(), "KILL\n");
  EXPECT_EQ(control_line_signal(SIGKILL), "KILL\n");
  EXPECT_EQ(control_line_signal(SIGINT), "INT\n");
  EXPECT_EQ(control_line_signal(SIGUSR1), "SIG " + std::to_string(SIGUSR1) + "\n");
}

TEST(WriteControl, ClosedReaderIsAFailureNotASignal) {
  ::signal(SIGPIPE, SIG_DFL);  // what a process that forgot to ignore it has
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  EXPECT_TRUE(write_control(fds[1], "TERM\n"));
  ::close(fds[0]);
  EXPECT_FALSE(write_control(fds[1], "KILL\n"));  // would have died of SIGPIPE otherwise
  sigset_t pending;
  sigpending(&pending);
  EXPECT_FALSE(sigismember(&pending, SIGPIPE));
  ::close(fds[1]);
  EXPECT_FALSE(write_control(-1, "x"));
}

}  // namespace
}  // namespace erun
