// LocalLauncher and the worker supervisor with real processes: env, cwd,
// secret delivery, exit statuses, stop with grace, and no process left behind
// whichever way erun's side goes away.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/strings.h"
#include "runner/launcher.h"
#include "runner/worker_wrapper.h"
#include "support/process_utils.h"

namespace erun {
namespace {

using namespace std::chrono_literals;
using testing::describe_pids;
using testing::pid_alive;
using testing::pids_with_cmdline;
using testing::read_file;
using testing::wait_file_lines;
using testing::wait_no_process;
using testing::wait_pid_gone;

class LocalLauncherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/erun-launch-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    static std::atomic<int> counter{0};
    marker_ = fmt::format("erun-marker-{}-{}", ::getpid(), counter++);
  }
  void TearDown() override {
    std::vector<pid_t> left;
    EXPECT_TRUE(wait_no_process(marker_, 10s, &left)) << describe_pids(left);
    for (pid_t p : left) ::kill(p, SIGKILL);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  // A worker running `script` under /bin/sh; the marker rides in its argv.
  WorkerSpec spec(const std::string& script) {
    WorkerSpec s;
    s.host = "localhost";
    s.command = {"/bin/sh", "-c", script, marker_};
    s.cwd = dir_;
    s.secret = "s3cr3t-" + marker_;
    s.term_grace = 1s;
    return s;
  }

  std::unique_ptr<WorkerHandle> launch(const WorkerSpec& s) {
    auto h = launcher_->launch(s);
    EXPECT_TRUE(h.is_ok()) << h.message();
    return h.is_ok() ? std::move(h).value() : nullptr;
  }

  static std::string read_stdout(WorkerHandle& h) {
    int fd = h.take_stdout();
    std::string out;
    EXPECT_TRUE(read_all_until(fd, out, std::chrono::steady_clock::now() + 20s));
    ::close(fd);
    return out;
  }

  static std::optional<ExitStatus> wait(WorkerHandle& h, Duration timeout = 20s) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (auto s = h.poll()) return s;
      std::this_thread::sleep_for(5ms);
    }
    return std::nullopt;
  }

  std::vector<pid_t> read_pids(const std::string& file) {
    std::vector<pid_t> pids;
    for (auto& line : split(read_file(file), '\n')) {
      long p;
      if (parse_int(trim(line), p)) pids.push_back(static_cast<pid_t>(p));
    }
    return pids;
  }

  std::unique_ptr<Launcher> launcher_ = make_local_launcher();
  std::string dir_;
  std::string marker_;
};

TEST_F(LocalLauncherTest, EnvCwdAndSecretReachTheWorker) {
  auto s = spec("printf '%s|%s|%s|%s\\n' \"$FOO\" \"$BAR\" \"$(pwd)\" \"$ERUN_SECRET\"");
  s.env = {{"FOO", "a b'c \"$HOME\" `x`"}, {"BAR", ""}};
  auto h = launch(s);
  ASSERT_TRUE(h);
  EXPECT_EQ(read_stdout(*h), fmt::format("a b'c \"$HOME\" `x`||{}|{}\n", dir_, s.secret));
  auto st = wait(*h);
  ASSERT_TRUE(st);
  EXPECT_TRUE(st->ok()) << st->describe();
}

TEST_F(LocalLauncherTest, StdinIsEmptyAndSignalsAreNotIgnored) {
  // Non-interactive shells ignore SIGINT in background jobs; the worker must not.
  auto h = launch(spec("cat; grep -E '^SigIgn' /proc/self/status"));
  ASSERT_TRUE(h);
  EXPECT_EQ(read_stdout(*h), "SigIgn:\t0000000000000000\n");
  ASSERT_TRUE(wait(*h));
}

TEST_F(LocalLauncherTest, ExitCodeAndSignalArePropagated) {
  auto h = launch(spec("exit 7"));
  ASSERT_TRUE(h);
  auto st = wait(*h);
  ASSERT_TRUE(st);
  EXPECT_EQ(st->code, 7);
  EXPECT_EQ(st->signal, 0);

  auto h2 = launch(spec("kill -USR1 $$"));
  ASSERT_TRUE(h2);
  st = wait(*h2);
  ASSERT_TRUE(st);
  EXPECT_EQ(st->shell_code(), 128 + SIGUSR1) << st->describe();
}

TEST_F(LocalLauncherTest, MissingCwdOrProgramIsAClearError) {
  auto s = spec("true");
  s.cwd = dir_ + "/does-not-exist";
  auto h = launch(s);
  ASSERT_TRUE(h);
  int err_fd = h->take_stderr();
  std::string err;
  EXPECT_TRUE(read_all_until(err_fd, err, std::chrono::steady_clock::now() + 20s));
  ::close(err_fd);
  EXPECT_NE(err.find("cannot enter the working directory"), std::string::npos) << err;
  EXPECT_NE(err.find("does-not-exist"), std::string::npos) << err;
  auto st = wait(*h);
  ASSERT_TRUE(st);
  EXPECT_EQ(st->code, kWrapperSetupFailed);

  auto s2 = spec("true");
  s2.command = {"/no/such/program-" + marker_};
  auto h2 = launch(s2);
  ASSERT_TRUE(h2);
  st = wait(*h2);
  ASSERT_TRUE(st);
  EXPECT_EQ(st->code, 127);
}

TEST_F(LocalLauncherTest, InvalidEnvNameIsRejected) {
  auto s = spec("true");
  s.env = {{"BAD NAME", "x"}};
  auto h = launcher_->launch(s);
  ASSERT_FALSE(h.is_ok());
  EXPECT_NE(h.message().find("BAD NAME"), std::string::npos);
}

TEST_F(LocalLauncherTest, SecretIsInTheEnvironmentButNeverInAnyCommandLine) {
  std::string flag = dir_ + "/started";
  auto s = spec("echo started > " + shell_quote(flag) + "; sleep 30");
  auto h = launch(s);
  ASSERT_TRUE(h);
  ASSERT_TRUE(wait_file_lines(flag, 1, 20s));
  EXPECT_TRUE(pids_with_cmdline(s.secret).empty()) << describe_pids(pids_with_cmdline(s.secret));

  // The worker leads its own session and holds the secret in its environment.
  auto worker = find_supervised_worker(static_cast<pid_t>(h->pid()));
  ASSERT_TRUE(worker);
  std::string stat = read_file(fmt::format("/proc/{}/stat", *worker));
  auto fields = split(stat.substr(stat.rfind(')') + 2), ' ');
  ASSERT_GE(fields.size(), 4u);
  EXPECT_EQ(fields[2], std::to_string(*worker));  // pgrp
  EXPECT_EQ(fields[3], std::to_string(*worker));  // session
  std::string environ = read_file(fmt::format("/proc/{}/environ", *worker));
  EXPECT_NE(environ.find("ERUN_SECRET=" + s.secret), std::string::npos);
  h->kill();
  ASSERT_TRUE(wait(*h));
}

TEST_F(LocalLauncherTest, TerminateStopsTheWorkerAndItsChildren) {
  std::string pids = dir_ + "/pids";
  auto h = launch(spec("sleep 300 & echo $! >> " + pids + "; sleep 300 & echo $! >> " + pids +
                       "; echo $$ >> " + pids + "; wait"));
  ASSERT_TRUE(h);
  ASSERT_TRUE(wait_file_lines(pids, 3, 20s));
  h->terminate();
  auto st = wait(*h);
  ASSERT_TRUE(st);
  EXPECT_EQ(st->shell_code(), 128 + SIGTERM) << st->describe();
  for (pid_t p : read_pids(pids)) EXPECT_TRUE(wait_pid_gone(p, 10s)) << p;
}

TEST_F(LocalLauncherTest, WorkerIgnoringSigtermIsKilledAfterTheGrace) {
  std::string ready = dir_ + "/ready";
  auto s = spec("trap '' TERM; echo $$ > " + ready + "; while :; do sleep 0.05; done");
  s.term_grace = 1500ms;
  auto h = launch(s);
  ASSERT_TRUE(h);
  ASSERT_TRUE(wait_file_lines(ready, 1, 20s));
  auto start = std::chrono::steady_clock::now();
  h->terminate();
  auto st = wait(*h);
  ASSERT_TRUE(st);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 1400ms);
  EXPECT_EQ(st->shell_code(), 128 + SIGKILL) << st->describe();
}

TEST_F(LocalLauncherTest, KillDoesNotWaitForTheGrace) {
  std::string ready = dir_ + "/ready";
  auto s = spec("trap '' TERM; echo $$ > " + ready + "; while :; do sleep 0.05; done");
  s.term_grace = 60s;
  auto h = launch(s);
  ASSERT_TRUE(h);
  ASSERT_TRUE(wait_file_lines(ready, 1, 20s));
  h->kill();
  auto st = wait(*h, 15s);
  ASSERT_TRUE(st);
  EXPECT_TRUE(st->signal == SIGKILL || st->code == 128 + SIGKILL) << st->describe();
}

TEST_F(LocalLauncherTest, SignalIsForwardedToTheWorkerGroup) {
  std::string ready = dir_ + "/ready";
  auto h = launch(spec("trap 'echo got-int; exit 5' INT; echo $$ > " + ready +
                       "; while :; do sleep 0.05; done"));
  ASSERT_TRUE(h);
  ASSERT_TRUE(wait_file_lines(ready, 1, 20s));
  h->signal(SIGINT);
  EXPECT_EQ(read_stdout(*h), "got-int\n");
  auto st = wait(*h);
  ASSERT_TRUE(st);
  EXPECT_EQ(st->code, 5);
}

TEST_F(LocalLauncherTest, StrayChildrenDieWhenTheWorkerExits) {
  std::string pids = dir_ + "/pids";
  auto h = launch(spec("sleep 300 > /dev/null 2>&1 & echo $! > " + pids + "; exit 3"));
  ASSERT_TRUE(h);
  auto st = wait(*h);
  ASSERT_TRUE(st);
  EXPECT_EQ(st->code, 3);
  auto children = read_pids(pids);
  ASSERT_EQ(children.size(), 1u);
  EXPECT_TRUE(wait_pid_gone(children[0], 10s));
}

TEST_F(LocalLauncherTest, DestroyingTheHandleLeavesNoProcess) {
  std::string pids = dir_ + "/pids";
  auto s = spec("trap '' TERM; sleep 300 & echo $! >> " + pids + "; (trap '' TERM; sleep 301) & echo $! >> " +
                pids + "; echo $$ >> " + pids + "; wait");
  s.term_grace = 60s;
  auto h = launch(s);
  ASSERT_TRUE(h);
  ASSERT_TRUE(wait_file_lines(pids, 3, 20s));
  long wrapper = h->pid();
  auto start = std::chrono::steady_clock::now();
  h.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  EXPECT_FALSE(pid_alive(static_cast<pid_t>(wrapper)));
  for (pid_t p : read_pids(pids)) EXPECT_TRUE(wait_pid_gone(p, 10s)) << p;
  std::vector<pid_t> left;
  EXPECT_TRUE(wait_no_process(marker_, 10s, &left)) << describe_pids(left);
}

TEST_F(LocalLauncherTest, ClosingTheControlChannelStopsEverything) {
  std::string pids = dir_ + "/pids";
  auto h = launch(spec("sleep 300 & echo $! >> " + pids + "; echo $$ >> " + pids + "; wait"));
  ASSERT_TRUE(h);
  ASSERT_TRUE(wait_file_lines(pids, 2, 20s));
  auto* supervised = dynamic_cast<SupervisedWorker*>(h.get());
  ASSERT_NE(supervised, nullptr);
  supervised->close_control();
  auto st = wait(*h);
  ASSERT_TRUE(st);
  EXPECT_EQ(st->shell_code(), 128 + SIGTERM) << st->describe();
  for (pid_t p : read_pids(pids)) EXPECT_TRUE(wait_pid_gone(p, 10s)) << p;
}

TEST_F(LocalLauncherTest, ErunDyingLeavesNoProcess) {
  // A forked "erun" launches a worker and is SIGKILLed: the supervisor sees
  // EOF on its control channel and stops the worker and its children.
  std::string pids = dir_ + "/pids";
  auto s = spec("sleep 300 & echo $! >> " + pids + "; echo $$ >> " + pids + "; wait");
  pid_t fake_erun = ::fork();
  ASSERT_GE(fake_erun, 0);
  if (fake_erun == 0) {
    auto h = make_local_launcher()->launch(s);
    if (!h.is_ok()) ::_exit(1);
    while (true) ::pause();
  }
  ASSERT_TRUE(wait_file_lines(pids, 2, 20s));
  ::kill(fake_erun, SIGKILL);
  int status;
  ::waitpid(fake_erun, &status, 0);
  for (pid_t p : read_pids(pids)) EXPECT_TRUE(wait_pid_gone(p, 15s)) << p;
  std::vector<pid_t> left;
  EXPECT_TRUE(wait_no_process(marker_, 15s, &left)) << describe_pids(left);
}

TEST_F(LocalLauncherTest, EarlyTerminateIsNotLost) {
  // TERM sent right after launch, before the worker reported its pid.
  auto s = spec("sleep 300");
  for (int i = 0; i < 3; ++i) {
    auto h = launch(s);
    ASSERT_TRUE(h);
    h->terminate();
    auto st = wait(*h);
    ASSERT_TRUE(st);
    EXPECT_EQ(st->shell_code(), 128 + SIGTERM) << st->describe();
  }
}

TEST_F(LocalLauncherTest, CommandLineIsTheSupervisorWithoutTheSecret) {
  auto s = spec("true");
  auto argv = launcher_->command_line(s);
  ASSERT_EQ(argv.size(), 3u);
  EXPECT_EQ(argv[0], "/bin/sh");
  EXPECT_EQ(argv[1], "-c");
  EXPECT_EQ(argv[2].find(s.secret), std::string::npos);
  EXPECT_NE(argv[2].find(marker_), std::string::npos);
}

TEST(IsLocalHost, NamesThisMachineOnly) {
  EXPECT_TRUE(is_local_host("localhost"));
  EXPECT_TRUE(is_local_host("127.0.0.1"));
  EXPECT_TRUE(is_local_host("::1"));
  char name[256] = {};
  ASSERT_EQ(::gethostname(name, sizeof name - 1), 0);
  EXPECT_TRUE(is_local_host(name));
  EXPECT_FALSE(is_local_host("127.0.0.2"));
  EXPECT_FALSE(is_local_host("some-other-host.example"));
}

}  // namespace
}  // namespace erun
