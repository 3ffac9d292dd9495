// Each of erun's own processes on a REMOTE host, killed mid-training over the
// real sshd fixture (127.0.0.2, .3 and .4 act as hosts; in-place mode,
// examples/train_mlp). On a host, one SSH connection carries
//   sshd's session process -> the erun agent (exec'd by the login shell)
//                                 -> its watchdog (forked, own session)
//                                 -> each worker (own session)
// and every one of them but sshd's holds the connection's SSH_CONNECTION in
// its environment, which is how the test finds them (and finds what is left).
// Each worker also leaves a helper process in its session (as a data loader
// would), which only erun's stopping of the session ends: the worker itself
// ends on its own once its agent's relay and pipes are gone.
// Killing a part must leave no process of that host's job running, report
// the host's rank as failed with the right exit code (255 when the agent or
// its connection is lost, signal 15 when a SIGTERMed agent stopped its worker
// and said so, the worker's own signal when only a worker died),
// and the job must carry on in place to exactly the model of an undisturbed
// run. Last, parts killed on two hosts and then erun SIGKILLed: nothing of
// the job is left on any address, and sshd holds no session.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <regex>
#include <thread>

#include "support/erun_process.h"
#include "support/process_utils.h"
#include "support/sshd.h"

namespace erun::testing {
namespace {

using namespace std::chrono_literals;

// erun's processes on one remote host, as found through /proc.
struct RemoteParts {
  pid_t sshd = 0;      // sshd's process for the connection (the agent's parent)
  pid_t agent = 0;
  pid_t watchdog = 0;  // the agent's child that runs erun's own binary
  std::vector<pid_t> workers;
  std::vector<pid_t> helpers;  // the workers' `sleep`s
  std::vector<pid_t> all;  // everything with the connection's SSH_CONNECTION

  std::string describe() const {
    return "sshd " + std::to_string(sshd) + ", agent " + std::to_string(agent) + ", watchdog " +
           std::to_string(watchdog) + ", workers " + std::to_string(workers.size()) + ", helpers " +
           std::to_string(helpers.size()) + "; all:\n" +
           describe_pids(all);
  }
};

class ErunRemoteParts : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    server_ = SshServer::start({"127.0.0.2", "127.0.0.3", "127.0.0.4"}).release();
    if (!server_->ok()) return;
    const std::string out = uninterrupted_training_output();
    reference_ = new std::string(train_checksum(out));
    ASSERT_FALSE(reference_->empty()) << out;
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
    delete reference_;
    reference_ = nullptr;
  }
  void SetUp() override {
    ERUN_REQUIRE_SSHD(server_);
    ASSERT_TRUE(reference_);
    program_ = build_path("examples/train_mlp");
  }

  // erun over the fixture's sshd, in place; a failed host stays out for the
  // rest of the run (--blacklist-after 1), so the survivors finish alone.
  // Each worker starts its helper (`sleep`) first.
  // --drain-timeout 0: a SIGTERM to an agent is its host's failure, as every
  // other part's end here (with a drain it is a notice: erun_drain_test).
  std::vector<std::string> args(const std::string& hosts, int np) {
    auto a = server_->erun_args();
    a.insert(a.end(), {"--drain-timeout", "0", "--term-grace", "2", "--heartbeat-timeout", "2", "-np", std::to_string(np), "--min-np", "2",
                       "-H", hosts, "--blacklist-after", "1", "--blacklist-cooldown-range", "600", "600", "sh", "-c",
                       "sleep 86400 & exec \"$0\" \"$@\"", program_});
    a.insert(a.end(), kTrainMlpArgs.begin(), kTrainMlpArgs.end());
    return a;
  }

  // The SSH_CONNECTION suffix of every connection to `host` on this server.
  std::string connection_to(const std::string& host) const {
    return " " + host + " " + std::to_string(server_->port()) + "\n";
  }

  RemoteParts parts_on(const std::string& host) const {
    RemoteParts r;
    r.all = pids_with_environ(connection_to(host));
    const std::string agent_cmd = erun_binary() + " --agent ";
    for (pid_t pid : r.all) {
      std::string cmd = cmdline_of(pid);
      if (cmd.rfind(program_ + " ", 0) == 0) {
        r.workers.push_back(pid);
      } else if (cmd == "sleep 86400 ") {
        r.helpers.push_back(pid);
      } else if (cmd.rfind(agent_cmd, 0) == 0) {
        // The agent's parent is sshd's; the watchdog's is the agent.
        if (cmdline_of(parent_of(pid)).rfind(agent_cmd, 0) == 0) {
          r.watchdog = pid;
        } else {
          r.agent = pid;
          r.sshd = parent_of(pid);
        }
      }
    }
    return r;
  }

  // Waits until `host` has an agent, its watchdog and `workers` workers.
  RemoteParts wait_parts_on(const std::string& host, size_t workers, Duration timeout) const {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      RemoteParts r = parts_on(host);
      if ((r.agent > 0 && r.watchdog > 0 && r.workers.size() == workers && r.helpers.size() == workers) ||
          std::chrono::steady_clock::now() >= deadline) {
        return r;
      }
      std::this_thread::sleep_for(50ms);
    }
  }

  // Every process of any connection to this server (agents, watchdogs,
  // workers), local ssh clients using its key, and sshd's per-connection
  // processes (the listener's children): none may be left.
  std::vector<pid_t> anything_left() const {
    auto left = pids_with_environ(" " + std::to_string(server_->port()) + "\n");
    for (pid_t pid : pids_with_cmdline(server_->identity_file())) left.push_back(pid);
    for (pid_t listener : pids_with_cmdline(server_->dir() + "/sshd_config")) {
      for (pid_t pid : pids_with_cmdline("sshd")) {
        if (parent_of(pid) == listener) left.push_back(pid);
      }
    }
    for (pid_t pid : pids_with_cmdline(program_)) {
      if (std::find(left.begin(), left.end(), pid) == left.end()) left.push_back(pid);
    }
    return left;
  }

  void expect_nothing_left() const {
    auto deadline = std::chrono::steady_clock::now() + 20s;
    auto left = anything_left();
    while (!left.empty() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(100ms);
      left = anything_left();
    }
    EXPECT_TRUE(left.empty()) << "left running:\n" << describe_pids(left);
    kill_leftovers(left);
  }

  // SIGKILLs erun's processes, workers, helpers, ssh clients and sshd's
  // sessions among `pids`, never a login shell: one killed in the middle of
  // the user's shell start-up can leave a lock behind (pyenv's rehash does)
  // that stalls every later login. A shell left alone finds its connection
  // gone and ends.
  void kill_leftovers(const std::vector<pid_t>& pids) const {
    for (pid_t pid : pids) {
      std::string cmd = cmdline_of(pid);
      for (const std::string& ours : {erun_binary() + " ", program_ + " ", std::string("sleep 86400 "),
                                      std::string("ssh "), std::string("sshd: ")}) {
        if (cmd.rfind(ours, 0) == 0) ::kill(pid, SIGKILL);
      }
    }
  }

  // Kills what a failed test left behind, so that the next one starts clean.
  void TearDown() override {
    if (!server_ || !server_->ok()) return;
    kill_leftovers(anything_left());
  }

  static bool wait_output_matching(const ErunProcess& p, const std::string& pattern, Duration timeout) {
    const std::regex re(pattern);
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      if (std::regex_search(p.err(), re)) return true;
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(50ms);
    }
  }

  static bool wait_all_gone(const std::vector<pid_t>& pids, Duration timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (pid_t pid : pids) {
      auto left = std::chrono::duration_cast<Duration>(deadline - std::chrono::steady_clock::now());
      if (!wait_pid_gone(pid, std::max<Duration>(left, 0ms))) return false;
    }
    return true;
  }

  // The local ssh clients of this server's connections to `host`.
  std::vector<pid_t> ssh_clients_to(const std::string& host) const {
    std::vector<pid_t> out;
    for (pid_t pid : pids_with_cmdline(" " + host + " exec ")) {
      std::string cmd = cmdline_of(pid);
      if (cmd.rfind("ssh ", 0) == 0 && cmd.find(server_->identity_file()) != std::string::npos) out.push_back(pid);
    }
    return out;
  }

 protected:
  static SshServer* server_;
  static std::string* reference_;
  std::string program_;
};
SshServer* ErunRemoteParts::server_ = nullptr;
std::string* ErunRemoteParts::reference_ = nullptr;

// One way to kill a part of 127.0.0.3's side of the job.
struct PartKill {
  std::string name;
  // Kills the part; a failed assertion inside stops the test.
  std::function<void(ErunRemoteParts&, ErunProcess&, const RemoteParts&)> kill;
  std::string failure;     // what erun must report for rank 2
  bool host_lost = true;   // the agent's connection ends ("agent on 127.0.0.3 lost")
};

void PrintTo(const PartKill& k, std::ostream* os) { *os << k.name; }

class ErunRemotePartKilled : public ErunRemoteParts, public ::testing::WithParamInterface<PartKill> {};

TEST_P(ErunRemotePartKilled, IsTheHostsFailureLeavesNoWorkerAndTheJobEndsAtTheSameModel) {
  const PartKill& k = GetParam();
  ErunProcess p(args("127.0.0.2:2,127.0.0.3:1", 3));
  ASSERT_TRUE(p.wait_output("epoch 1 ", 120s)) << p.out() << p.err();
  RemoteParts before = wait_parts_on("127.0.0.3", 1, 10s);
  ASSERT_GT(before.agent, 0) << before.describe() << p.err();
  ASSERT_GT(before.watchdog, 0) << before.describe();
  ASSERT_EQ(before.workers.size(), 1u) << before.describe();
  ASSERT_EQ(before.helpers.size(), 1u) << before.describe();
  ASSERT_NE(cmdline_of(before.sshd).find("sshd"), std::string::npos) << before.describe();
  EXPECT_EQ(p.count("failed with"), 0u) << p.err();
  // The agent's relay socket, from the worker's environment: its private
  // directory must not outlive the agent, however the agent ended.
  std::smatch m;
  const std::string env = environ_of(before.workers.at(0));
  ASSERT_TRUE(std::regex_search(env, m, std::regex("\nERUN_RDZV_ADDR=unix:(/[^\n]*)/rdzv\n")))
      << "the worker does not connect through its agent's relay";
  const std::string relay_dir = m[1].str();
  ASSERT_EQ(::access(relay_dir.c_str(), F_OK), 0) << relay_dir;

  ASSERT_NO_FATAL_FAILURE(k.kill(*this, p, before));
  // Reported at once (the agent's channel ends, or the agent reports its
  // worker's end): well within the heartbeat timeout, not the collective one.
  ASSERT_TRUE(p.wait_output("127.0.0.3 rank 2: " + k.failure, 10s)) << p.err();
  EXPECT_EQ(p.count("failed with"), 1u) << p.err();
  EXPECT_TRUE(wait_all_gone(before.workers, 10s)) << describe_pids(before.workers);
  EXPECT_TRUE(wait_all_gone(before.helpers, 10s)) << describe_pids(before.helpers);
  if (k.host_lost) {
    EXPECT_TRUE(p.wait_output("agent on 127.0.0.3 lost", 10s)) << p.err();
    // Nothing of that connection is left: agent, watchdog, sshd's session.
    std::vector<pid_t> gone = before.all;
    gone.push_back(before.sshd);
    EXPECT_TRUE(wait_all_gone(gone, 15s)) << describe_pids(parts_on("127.0.0.3").all) << describe_pids({before.sshd});
    // The agent's own clean-up, or its watchdog's when it was killed (a
    // watchdog started after `before` was taken may still be finishing).
    auto dir_deadline = std::chrono::steady_clock::now() + 10s;
    while (::access(relay_dir.c_str(), F_OK) == 0 && std::chrono::steady_clock::now() < dir_deadline) {
      std::this_thread::sleep_for(50ms);
    }
    EXPECT_NE(::access(relay_dir.c_str(), F_OK), 0) << relay_dir << " outlived the agent";
  } else {
    // Only the worker died: the agent and its watchdog carry on.
    EXPECT_EQ(p.count("agent on 127.0.0.3 lost"), 0u) << p.err();
    EXPECT_TRUE(pid_alive(before.agent));
    EXPECT_TRUE(pid_alive(before.watchdog));
  }

  // In place: the survivors carry on from their last commit.
  ASSERT_NO_FATAL_FAILURE(expect_trained_exactly(p, *reference_));
  EXPECT_NE(p.err().find("recovering in place"), std::string::npos) << p.err();
  EXPECT_EQ(p.count("epoch 0 "), 1u) << p.out();  // never restarted from scratch
  EXPECT_EQ(p.count("exactly-once=yes"), 10u) << p.out();
  expect_nothing_left();
}

void sigkill(pid_t pid) { ASSERT_EQ(::kill(pid, SIGKILL), 0) << describe_pids({pid}); }

INSTANTIATE_TEST_SUITE_P(
    EachPart, ErunRemotePartKilled,
    ::testing::Values(
        PartKill{"Agent", [](ErunRemoteParts&, ErunProcess&, const RemoteParts& r) { sigkill(r.agent); },
                 "failed with exit code 255"},
        // The agent starts another watchdog and tells it its workers; that
        // one stops them when the agent is killed next.
        PartKill{"WatchdogThenAgent",
                 [](ErunRemoteParts& t, ErunProcess&, const RemoteParts& r) {
                   sigkill(r.watchdog);
                   ASSERT_TRUE(wait_pid_gone(r.watchdog, 5s));
                   RemoteParts again = t.wait_parts_on("127.0.0.3", 1, 5s);
                   ASSERT_GT(again.watchdog, 0) << "no new watchdog: " << again.describe();
                   ASSERT_NE(again.watchdog, r.watchdog);
                   ASSERT_EQ(again.agent, r.agent);
                   sigkill(r.agent);
                 },
                 "failed with exit code 255"},
        // sshd's process for the connection: the agent's channel ends on
        // both sides (EOF at the agent, 255 from the local ssh client).
        PartKill{"SshdSession", [](ErunRemoteParts&, ErunProcess&, const RemoteParts& r) { sigkill(r.sshd); },
                 "failed with exit code 255"},
        // The local end of the same connection.
        PartKill{"LocalSshClient",
                 [](ErunRemoteParts& t, ErunProcess&, const RemoteParts&) {
                   auto clients = t.ssh_clients_to("127.0.0.3");
                   ASSERT_EQ(clients.size(), 1u) << describe_pids(clients);
                   sigkill(clients[0]);
                 },
                 "failed with exit code 255"},
        // A frozen agent is lost after --heartbeat-timeout; once it runs
        // again it finds its channel gone and stops its worker.
        PartKill{"AgentFrozenThenResumed",
                 [](ErunRemoteParts&, ErunProcess& p, const RemoteParts& r) {
                   ASSERT_EQ(::kill(r.agent, SIGSTOP), 0);
                   bool lost = p.wait_output("agent on 127.0.0.3 lost: silent for", 10s);
                   ::kill(r.agent, SIGCONT);
                   ASSERT_TRUE(lost) << p.err();
                 },
                 "failed with exit code 255"},
        // A frozen agent that never runs again: its watchdog hears nothing
        // from it for --heartbeat-timeout + 2 s, SIGKILLs it and stops the
        // worker's session, so the host keeps nothing of the job.
        PartKill{"AgentFrozenForGood",
                 [](ErunRemoteParts&, ErunProcess& p, const RemoteParts& r) {
                   ASSERT_EQ(::kill(r.agent, SIGSTOP), 0);
                   ASSERT_TRUE(p.wait_output("agent on 127.0.0.3 lost: silent for", 10s)) << p.err();
                 },
                 "failed with exit code 255"},
        // SIGTERM (with --drain-timeout 0): the agent stops its worker's
        // session itself and reports how the worker ended before it exits.
        PartKill{"AgentTerminated",
                 [](ErunRemoteParts&, ErunProcess&, const RemoteParts& r) { ASSERT_EQ(::kill(r.agent, SIGTERM), 0); },
                 "failed with signal 15 (Terminated)"},
        // Not erun's part, for contrast: the agent reports the worker's own
        // signal and stays.
        PartKill{"Worker", [](ErunRemoteParts&, ErunProcess&, const RemoteParts& r) { sigkill(r.workers.at(0)); },
                 "failed with signal 9 (Killed)", false}),
    [](const ::testing::TestParamInfo<PartKill>& info) { return info.param.name; });

TEST_F(ErunRemoteParts, PartsKilledOnTwoHostsThenSigkilledErunLeaveNothingOnAnyAddress) {
  ErunProcess p(args("127.0.0.2:2,127.0.0.3:1,127.0.0.4:1", 4));
  ASSERT_TRUE(p.wait_output("epoch 1 ", 120s)) << p.out() << p.err();
  RemoteParts two = wait_parts_on("127.0.0.2", 2, 10s);
  RemoteParts three = wait_parts_on("127.0.0.3", 1, 10s);
  RemoteParts four = wait_parts_on("127.0.0.4", 1, 10s);
  ASSERT_GT(two.watchdog, 0) << two.describe();
  ASSERT_GT(three.agent, 0) << three.describe();
  ASSERT_GT(four.sshd, 0) << four.describe();

  // 127.0.0.2 loses its watchdog (replaced, nobody fails), 127.0.0.3 its
  // agent, 127.0.0.4 sshd's session: the job goes on with 127.0.0.2 alone.
  sigkill(two.watchdog);
  sigkill(three.agent);
  sigkill(four.sshd);
  // Whichever host's loss is handled second has been renumbered by then.
  ASSERT_TRUE(wait_output_matching(p, "127\\.0\\.0\\.3 rank [23]: failed with exit code 255", 10s)) << p.err();
  ASSERT_TRUE(wait_output_matching(p, "127\\.0\\.0\\.4 rank [23]: failed with exit code 255", 10s)) << p.err();
  ASSERT_TRUE(p.wait_output("2 survivors", 20s)) << p.err();
  RemoteParts two_again = wait_parts_on("127.0.0.2", 2, 5s);
  ASSERT_GT(two_again.watchdog, 0) << two_again.describe();
  EXPECT_NE(two_again.watchdog, two.watchdog);
  EXPECT_EQ(two_again.workers, two.workers);
  size_t epochs = p.count("epoch ");
  auto deadline = std::chrono::steady_clock::now() + 30s;
  while (p.count("epoch ") == epochs && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(50ms);
  ASSERT_GT(p.count("epoch "), epochs) << "the survivors did not carry on\n" << p.out() << p.err();
  // A killed agent's watchdog keeps its host's commit directory up to 10 s
  // (kCommitAdoptGrace) for an agent the driver may start there again.
  EXPECT_TRUE(wait_all_gone(three.all, 15s)) << describe_pids(three.all);
  EXPECT_TRUE(wait_all_gone(four.all, 15s)) << describe_pids(four.all);

  p.signal(SIGKILL);
  ASSERT_TRUE(p.wait(10s));
  expect_nothing_left();
  EXPECT_TRUE(wait_all_gone(two_again.all, 1s)) << describe_pids(two_again.all);
}

}  // namespace
}  // namespace erun::testing
