// erun end to end through its per-host agents (simulated hosts 127.0.0.2 and
// 127.0.0.3 under --launcher local, each with its own agent): a frozen
// agent's host is failed within --heartbeat-timeout and the job goes on
// without it; a killed agent is that host's failure (exit code 255) and a
// SIGKILLed erun afterwards leaves nothing behind; and no worker's
// environment value shows in any command line.
#include <gtest/gtest.h>

#include <thread>
#include <signal.h>

#include <algorithm>
#include <fstream>

#include "support/erun_process.h"
#include "support/process_utils.h"

namespace erun::testing {
namespace {

using namespace std::chrono_literals;

class ErunAgent : public ::testing::Test {
 protected:
  void SetUp() override { worker_ = build_path("examples/restart_worker"); }

  std::vector<std::string> args(std::vector<std::string> extra, int epochs) {
    std::vector<std::string> a = {"--launcher", "local", "--term-grace", "1"};
    a.insert(a.end(), extra.begin(), extra.end());
    a.insert(a.end(), {worker_, "--checkpoint", dir_.path(), "--epochs", std::to_string(epochs),
                       "--steps-per-epoch", "4", "--step-ms", "100"});
    return a;
  }

  // The restart_worker processes whose ERUN_HOSTNAME is `host`.
  std::vector<pid_t> workers_on(const std::string& host) {
    std::vector<pid_t> out;
    for (pid_t pid : pids_with_cmdline("restart_worker --checkpoint " + dir_.path())) {
      std::string env = read_file("/proc/" + std::to_string(pid) + "/environ");
      std::replace(env.begin(), env.end(), '\0', '\n');
      if (("\n" + env).find("\nERUN_HOSTNAME=" + host + "\n") != std::string::npos) out.push_back(pid);
    }
    return out;
  }

  std::vector<pid_t> wait_workers_on(const std::string& host, Duration timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      auto w = workers_on(host);
      if (!w.empty()) return w;
      std::this_thread::sleep_for(50ms);
    }
    return {};
  }

  // An agent and its helpers: its children that run erun --agent too, forked
  // without exec (the watchdog, always; the persister, the commit replica
  // keeper and pushers, when they run; a worker between fork and exec).
  static std::vector<pid_t> with_helpers(pid_t agent) {
    std::vector<pid_t> out = {agent};
    for (pid_t w : children_of(agent)) {
      if (cmdline_of(w).find(" --agent") != std::string::npos) out.push_back(w);
    }
    return out;
  }

  void expect_no_worker_left() {
    std::vector<pid_t> left;
    EXPECT_TRUE(wait_no_process(dir_.path(), 20s, &left)) << describe_pids(left);
    for (pid_t p : left) ::kill(p, SIGKILL);
  }

  std::string worker_;
  TempDir dir_;
};

TEST_F(ErunAgent, FrozenAgentsHostIsFailedWithinTheHeartbeatTimeoutAndTheJobGoesOn) {
  ErunProcess p(args({"-np", "3", "--min-np", "2", "-H", "127.0.0.2:2,127.0.0.3:1", "--heartbeat-timeout", "2",
                      "--blacklist-after", "1", "--blacklist-cooldown-range", "600", "600"},
                     30));
  ASSERT_TRUE(p.wait_output("rank 2/3", 60s)) << p.out() << p.err();
  auto victims = wait_workers_on("127.0.0.3", 10s);
  ASSERT_EQ(victims.size(), 1u) << p.err();
  pid_t agent = parent_of(victims[0]);
  ASSERT_GT(agent, 1);
  ASSERT_NE(agent, static_cast<pid_t>(p.pid()));
  auto start = std::chrono::steady_clock::now();
  ::kill(agent, SIGSTOP);
  ASSERT_TRUE(p.wait_output("agent on 127.0.0.3 lost", 10s)) << p.err();
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, 1500ms);
  EXPECT_LT(took, 3500ms) << p.err();
  // The frozen agent was SIGKILLed; its watchdog ended the worker.
  EXPECT_TRUE(wait_pid_gone(victims[0], 10s));
  auto s = p.wait(180s);
  ASSERT_TRUE(s) << p.err();
  EXPECT_EQ(s->shell_code(), 0) << p.err();
  EXPECT_NE(p.out().find("done epochs=30"), std::string::npos) << p.out();
  EXPECT_NE(p.err().find("127.0.0.3 rank 2: failed with exit code 255"), std::string::npos) << p.err();
  expect_no_worker_left();
}

TEST_F(ErunAgent, KilledAgentIsItsHostsFailureAndSigkilledErunLeavesNothing) {
  std::string value = "agent-test-value-" + std::to_string(::getpid());
  std::reverse(value.begin(), value.end());
  ErunProcess p(args({"-np", "3", "--min-np", "2", "-H", "127.0.0.2:2,127.0.0.3:1", "--blacklist-after", "1",
                      "--blacklist-cooldown-range", "600", "600", "-x", "ERUN_AGENT_TEST=" + value},
                     1000));
  ASSERT_TRUE(p.wait_output("rank 2/3", 60s)) << p.out() << p.err();
  // No worker env value in any process's argv (erun's own -x excepted).
  for (pid_t pid : pids_with_cmdline(value)) EXPECT_EQ(pid, static_cast<pid_t>(p.pid())) << describe_pids({pid});
  auto victims = wait_workers_on("127.0.0.3", 10s);
  ASSERT_EQ(victims.size(), 1u);
  // Every agent of this job and its helpers must be gone at the end (found
  // by parent, as other tests' agents may run beside): the killed agent's
  // watchdog outlives it, holding the host's commits for a new agent to adopt
  // for up to kCommitAdoptGrace (10 s).
  std::vector<pid_t> agents = with_helpers(parent_of(victims[0]));
  ASSERT_GE(agents.size(), 2u) << "no watchdog: " << describe_pids(agents);
  ::kill(agents[0], SIGKILL);
  ASSERT_TRUE(p.wait_output("127.0.0.3 rank 2: failed with exit code 255", 10s)) << p.err();
  EXPECT_TRUE(wait_pid_gone(victims[0], 10s));
  ASSERT_TRUE(p.wait_output("2 ranks", 60s)) << p.err();
  ASSERT_FALSE(wait_workers_on("127.0.0.2", 20s).empty()) << p.err();
  // The blacklisted host gets an agent again, one that runs no worker: it
  // holds the host's memory (the job's commits) and keeps a replica of the
  // running host's (docs/state.md, "Where a commit lives").
  std::vector<pid_t> now;
  for (auto deadline = std::chrono::steady_clock::now() + 15s; std::chrono::steady_clock::now() < deadline;) {
    now.clear();
    for (pid_t a : children_of(p.pid())) {
      if (cmdline_of(a).find(" --agent") != std::string::npos) now.push_back(a);
    }
    if (now.size() == 2) break;
    std::this_thread::sleep_for(100ms);
  }
  ASSERT_EQ(now.size(), 2u) << describe_pids(children_of(p.pid())) << p.err();
  EXPECT_TRUE(wait_workers_on("127.0.0.3", 1s).empty()) << "a worker on the blacklisted host";
  for (pid_t a : now) {
    auto aw = with_helpers(a);
    ASSERT_GE(aw.size(), 2u) << "no watchdog: " << describe_pids(aw);
    agents.insert(agents.end(), aw.begin(), aw.end());
  }
  p.signal(SIGKILL);
  ASSERT_TRUE(p.wait(10s));
  expect_no_worker_left();
  std::vector<pid_t> left;
  for (pid_t a : agents) {
    if (!wait_pid_gone(a, 15s)) left.push_back(a);
  }
  EXPECT_TRUE(left.empty()) << describe_pids(left);
  // No shell noise ("Killed", "Terminated") in what the user saw.
  EXPECT_EQ(p.out().find("Killed"), std::string::npos) << p.out();
  EXPECT_EQ(p.out().find("Terminated"), std::string::npos) << p.out();
}

}  // namespace
}  // namespace erun::testing
