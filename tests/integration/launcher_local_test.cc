// The local launcher and the erun agent with real processes: env, cwd,
// secret delivery, exit statuses, stop with grace, one agent per host, and no
// process left behind whichever of erun's own processes goes away (the
// agent, its watchdog, erun itself) or falls silent.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <algorithm>
#include <fstream>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/strings.h"
#include "runner/launch/launcher.h"
#include "support/erun_process.h"
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

  static AgentLaunchOptions agent_options() {
    AgentLaunchOptions o;
    o.agent_path = testing::erun_binary();
    o.heartbeat_timeout = 3s;
    return o;
  }

  // The worker's pid once its agent reported it.
  static pid_t worker_pid(WorkerHandle& h) {
    auto deadline = std::chrono::steady_clock::now() + 20s;
    while (h.pid() == 0 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(5ms);
    return static_cast<pid_t>(h.pid());
  }

  std::unique_ptr<Launcher> launcher_ = make_local_launcher(agent_options());
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
  EXPECT_EQ(st->code, 127);

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
  std::optional<pid_t> worker = worker_pid(*h);
  ASSERT_GT(*worker, 0);
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
  auto start = std::chrono::steady_clock::now();
  h.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  for (pid_t p : read_pids(pids)) EXPECT_TRUE(wait_pid_gone(p, 10s)) << p;
  std::vector<pid_t> left;
  EXPECT_TRUE(wait_no_process(marker_, 10s, &left)) << describe_pids(left);
}

TEST_F(LocalLauncherTest, WorkersOfOneHostShareOneAgent) {
  auto a = launch(spec("sleep 300"));
  auto b = launch(spec("sleep 300"));
  auto s = spec("sleep 300");
  s.host = "127.0.0.2";  // another (simulated) host: another agent
  auto c = launch(s);
  ASSERT_TRUE(a && b && c);
  pid_t pa = worker_pid(*a), pb = worker_pid(*b), pc = worker_pid(*c);
  ASSERT_GT(pa, 0);
  ASSERT_GT(pb, 0);
  ASSERT_GT(pc, 0);
  EXPECT_EQ(testing::parent_of(pa), testing::parent_of(pb));
  EXPECT_NE(testing::parent_of(pa), testing::parent_of(pc));
  EXPECT_NE(testing::parent_of(pa), ::getpid());
  a->kill();
  b->kill();
  c->kill();
  EXPECT_TRUE(wait(*a) && wait(*b) && wait(*c));
}

TEST_F(LocalLauncherTest, NoEnvValueInAnyCommandLine) {
  std::string flag = dir_ + "/started";
  auto s = spec("echo started > " + shell_quote(flag) + "; sleep 30");
  std::string value = "env-value-" + marker_ + "-unique";
  std::reverse(value.begin(), value.end());  // the marker itself rides in argv
  s.env = {{"ERUN_TEST_VALUE", value}};
  auto h = launch(s);
  ASSERT_TRUE(h);
  ASSERT_TRUE(wait_file_lines(flag, 1, 20s));
  EXPECT_TRUE(pids_with_cmdline(value).empty()) << describe_pids(pids_with_cmdline(value));
  std::string environ = read_file(fmt::format("/proc/{}/environ", worker_pid(*h)));
  EXPECT_NE(environ.find("ERUN_TEST_VALUE=" + value), std::string::npos);
  h->kill();
  ASSERT_TRUE(wait(*h));
}

TEST_F(LocalLauncherTest, KilledAgentFailsItsWorkersAt255AndLeavesNoProcess) {
  std::string pids = dir_ + "/pids";
  auto s = spec("trap '' TERM; sleep 300 & echo $! >> " + pids + "; echo $$ >> " + pids + "; wait");
  auto h = launch(s);
  ASSERT_TRUE(h);
  ASSERT_TRUE(wait_file_lines(pids, 2, 20s));
  pid_t agent = testing::parent_of(worker_pid(*h));
  ASSERT_GT(agent, 1);
  ::kill(agent, SIGKILL);
  auto st = wait(*h, 5s);
  ASSERT_TRUE(st);
  EXPECT_EQ(st->code, 255) << st->describe();
  for (pid_t p : read_pids(pids)) EXPECT_TRUE(wait_pid_gone(p, 10s)) << p;
  // The host gets a new agent for the next worker.
  auto again = launch(spec("exit 4"));
  ASSERT_TRUE(again);
  st = wait(*again);
  ASSERT_TRUE(st);
  EXPECT_EQ(st->code, 4);
}

TEST_F(LocalLauncherTest, SilentAgentIsLostWithinTheHeartbeatTimeout) {
  std::string pids = dir_ + "/pids";
  auto h = launch(spec("sleep 300 & echo $! >> " + pids + "; echo $$ >> " + pids + "; wait"));
  ASSERT_TRUE(h);
  ASSERT_TRUE(wait_file_lines(pids, 2, 20s));
  pid_t agent = testing::parent_of(worker_pid(*h));
  ASSERT_GT(agent, 1);
  auto start = std::chrono::steady_clock::now();
  ::kill(agent, SIGSTOP);
  auto st = wait(*h, 10s);
  auto took = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(st);
  EXPECT_EQ(st->code, 255) << st->describe();
  EXPECT_GE(took, 2500ms);  // --heartbeat-timeout 3 s here
  EXPECT_LT(took, 4500ms);
  for (pid_t p : read_pids(pids)) EXPECT_TRUE(wait_pid_gone(p, 10s)) << p;
}

// Kills one of erun's own processes on the host, then SIGKILLs a forked
// "erun": no worker may be left, whichever part went first.
class PartKillTest : public LocalLauncherTest, public ::testing::WithParamInterface<const char*> {};

TEST_P(PartKillTest, NoWorkerOutlivesErun) {
  std::string part = GetParam();
  std::string pids = dir_ + "/pids";
  std::string report = dir_ + "/report";
  auto s = spec("trap '' TERM; sleep 300 & echo $! >> " + pids + "; echo $$ >> " + pids + "; wait");
  s.term_grace = 1s;
  int to_erun[2];
  ASSERT_EQ(::pipe(to_erun), 0);
  pid_t fake_erun = ::fork();
  ASSERT_GE(fake_erun, 0);
  if (fake_erun == 0) {
    ::close(to_erun[1]);
    auto launcher = make_local_launcher(agent_options());
    auto h = launcher->launch(s);
    if (!h.is_ok()) ::_exit(1);
    // Report the worker's status, if it ends, into `report`.
    while (true) {
      if (auto st = (*h)->poll()) {
        std::ofstream(report) << st->shell_code() << "\n";
        while (true) ::pause();
      }
      ::usleep(10000);
    }
  }
  ::close(to_erun[0]);
  ::close(to_erun[1]);
  ASSERT_TRUE(wait_file_lines(pids, 2, 20s));
  auto worker = read_pids(pids).back();
  pid_t agent = testing::parent_of(worker);
  ASSERT_GT(agent, 1);
  if (part == "agent") {
    ::kill(agent, SIGKILL);
    ASSERT_TRUE(wait_file_lines(report, 1, 10s));
    EXPECT_EQ(trim(read_file(report)), "255");
  } else if (part == "watchdog") {
    // The agent's other child: the watchdog, in its own session.
    pid_t watchdog = 0;
    for (pid_t p : pids_with_cmdline("--agent")) {
      if (p != agent && testing::parent_of(p) == agent) watchdog = p;
    }
    ASSERT_GT(watchdog, 0);
    ::kill(watchdog, SIGKILL);
    std::this_thread::sleep_for(300ms);  // the agent starts another one
    EXPECT_TRUE(pid_alive(worker));      // and keeps its workers
  }
  ::kill(fake_erun, SIGKILL);
  int status;
  ::waitpid(fake_erun, &status, 0);
  for (pid_t p : read_pids(pids)) EXPECT_TRUE(wait_pid_gone(p, 15s)) << part << " " << p;
  std::vector<pid_t> left;
  EXPECT_TRUE(wait_no_process(marker_, 15s, &left)) << describe_pids(left);
}

INSTANTIATE_TEST_SUITE_P(Parts, PartKillTest, ::testing::Values("none", "agent", "watchdog"));

TEST_F(LocalLauncherTest, ErunDyingLeavesNoProcess) {
  // A forked "erun" launches a worker and is SIGKILLed: the agent sees EOF on
  // its channel and stops the worker and its children.
  std::string pids = dir_ + "/pids";
  auto s = spec("sleep 300 & echo $! >> " + pids + "; echo $$ >> " + pids + "; wait");
  pid_t fake_erun = ::fork();
  ASSERT_GE(fake_erun, 0);
  if (fake_erun == 0) {
    auto launcher = make_local_launcher(agent_options());
    auto h = launcher->launch(s);
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

TEST_F(LocalLauncherTest, CommandLineIsTheAgentWithoutTheWorker) {
  auto s = spec("true");
  s.env = {{"FOO", "bar-" + marker_}};
  auto argv = launcher_->command_line(s);
  ASSERT_GE(argv.size(), 2u);
  EXPECT_EQ(argv[0], testing::erun_binary());
  EXPECT_EQ(argv[1], "--agent");
  for (auto& w : argv) {
    EXPECT_EQ(w.find(s.secret), std::string::npos);
    EXPECT_EQ(w.find(marker_), std::string::npos);
  }
}

TEST_F(LocalLauncherTest, MissingAgentBinaryFailsTheWorkerAt255) {
  AgentLaunchOptions o = agent_options();
  o.agent_path = dir_ + "/no-such-erun";
  auto launcher = make_local_launcher(o);
  auto h = launcher->launch(spec("true"));
  if (!h.is_ok()) {
    EXPECT_NE(h.message().find("no-such-erun"), std::string::npos) << h.message();
    return;
  }
  auto st = wait(**h);
  ASSERT_TRUE(st);
  EXPECT_EQ(st->code, 255);
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
