// erun end to end over a real sshd: 127.0.0.2, 127.0.0.3 and 127.0.0.4 act as
// three hosts. Launch, a "host" whose workers are all killed, a dropped SSH
// connection, a shrinking host set, and erun stopped by SIGTERM: the job goes
// on (or ends cleanly) and no process is left on any address.
#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>

#include "support/erun_process.h"
#include "support/process_utils.h"
#include "support/sshd.h"

namespace erun::testing {
namespace {

using namespace std::chrono_literals;

size_t count_events(const std::string& path, const std::string& event) {
  std::ifstream in(path);
  std::string line;
  size_t n = 0;
  while (std::getline(in, line)) n += line.find("\"event\":\"" + event + "\"") != std::string::npos;
  return n;
}

class ErunSsh : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = SshServer::start().release(); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    ERUN_REQUIRE_SSHD(server_);
    worker_ = build_path("examples/restart_worker");
  }
  std::vector<std::string> ssh_args() {
    auto args = server_->erun_args();
    args.insert(args.end(), {"--term-grace", "2"});
    return args;
  }
  // The restart_worker processes (not their supervisors) on `host`.
  std::vector<pid_t> workers_on(const std::string& host) {
    std::vector<pid_t> out;
    for (pid_t pid : pids_with_cmdline("restart_worker --checkpoint " + dir_.path())) {
      bool is_worker =
          read_file("/proc/" + std::to_string(pid) + "/cmdline").rfind(worker_ + std::string(1, '\0'), 0) == 0;
      if (is_worker && environ_of(pid).find("\nERUN_HOSTNAME=" + host + "\n") != std::string::npos) {
        out.push_back(pid);
      }
    }
    return out;
  }
  bool wait_events(const std::string& event, size_t n, Duration timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (count_events(dir_.file("events.jsonl"), event) >= n) return true;
      std::this_thread::sleep_for(50ms);
    }
    return false;
  }
  void expect_no_worker_left() {
    std::vector<pid_t> left;
    EXPECT_TRUE(wait_no_process(dir_.path(), 20s, &left)) << describe_pids(left);
    for (pid_t p : left) ::kill(p, SIGKILL);
  }

  static SshServer* server_;
  std::string worker_;
  TempDir dir_;
};
SshServer* ErunSsh::server_ = nullptr;

TEST_F(ErunSsh, LaunchesOverSshWithRanksPerHost) {
  auto args = ssh_args();
  args.insert(args.end(), {"-np", "4", "-H", "127.0.0.2:2,127.0.0.3:2", "sh", "-c",
                           "echo \"on $ERUN_HOSTNAME rank $RANK local $LOCAL_RANK master $MASTER_ADDR:$MASTER_PORT "
                           "dir $(pwd)\"", dir_.path()});
  ErunProcess p(args);
  auto s = p.wait(120s);
  ASSERT_TRUE(s);
  ASSERT_EQ(s->shell_code(), 0) << p.err();
  EXPECT_NE(p.out().find("[0]<stdout>:on 127.0.0.2 rank 0 local 0 master 127.0.0.2:"), std::string::npos) << p.out();
  EXPECT_NE(p.out().find("[3]<stdout>:on 127.0.0.3 rank 3 local 1 master 127.0.0.2:"), std::string::npos) << p.out();
  char cwd[4096];
  ASSERT_TRUE(::getcwd(cwd, sizeof cwd));
  EXPECT_NE(p.out().find(std::string("dir ") + cwd), std::string::npos);
}

TEST_F(ErunSsh, UnreachableHostFailsWithSshExitCode) {
  auto args = ssh_args();
  args.insert(args.end(), {"-np", "1", "-H", "127.0.0.9:1", "--ssh-connect-timeout", "2", "true"});
  ErunProcess p(args);
  auto s = p.wait(60s);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->shell_code(), 255) << p.err();
  EXPECT_NE(p.err().find("127.0.0.9"), std::string::npos) << p.err();
}

TEST_F(ErunSsh, AgentMissingOnTheHostSaysWhichPath) {
  // The remote shell cannot find the agent (exit 127): erun names the path
  // and how to fix it, whether ssh ended before or after taking the secret.
  auto args = ssh_args();
  std::string missing = dir_.file("no-such-erun");
  args.insert(args.end(), {"--agent-path", missing, "-np", "1", "-H", "127.0.0.2:1", "true"});
  ErunProcess p(args);
  auto s = p.wait(60s);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->shell_code(), 255) << p.err();
  EXPECT_NE(p.err().find("lost: its ssh process ended with exit code 127 before it started: " + missing +
                         " is not there (install the same erun on that host, or pass --agent-path"),
            std::string::npos)
      << p.err();
}

TEST_F(ErunSsh, UnknownHostKeySaysHowToAddIt) {
  // No known_hosts entry for the host: ssh refuses it, and erun says how to fix that.
  dir_.write("known_hosts", "");
  std::vector<std::string> args = {"--ssh-port", std::to_string(server_->port()), "--ssh-identity-file",
                                   server_->identity_file(), "--ssh-option", "IdentitiesOnly=yes", "--ssh-option",
                                   "UserKnownHostsFile=" + dir_.file("known_hosts"), "-np", "1", "-H", "127.0.0.2:1",
                                   "true"};
  ErunProcess p(args);
  auto s = p.wait(60s);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->shell_code(), 255) << p.err();
  std::string fix = "`ssh-keyscan -p " + std::to_string(server_->port()) + " 127.0.0.2 >> " + dir_.file("known_hosts") + "`";
  EXPECT_NE(p.err().find("Host key verification failed"), std::string::npos) << p.err();
  EXPECT_NE(p.err().find("lost: its ssh process ended with exit code 255; 1 worker(s) there failed (exit code 255) "
                         "and the host counts as failed: ssh could not verify the host key of 127.0.0.2"),
            std::string::npos)
      << p.err();
  // In the job's root cause too, the last thing erun prints.
  auto root = p.err().find("root cause:");
  ASSERT_NE(root, std::string::npos) << p.err();
  EXPECT_NE(p.err().find(fix, root), std::string::npos) << p.err();
  EXPECT_NE(p.err().find("--ssh-option StrictHostKeyChecking=accept-new", root), std::string::npos) << p.err();
}

TEST_F(ErunSsh, ElasticJobSurvivesAKilledHostADroppedConnectionAndAShrink) {
  dir_.write("hosts", "127.0.0.2:2\n127.0.0.3:1\n127.0.0.4:1\n");
  dir_.write("discover.sh", "#!/bin/sh\ncat " + dir_.file("hosts") + "\n", true);
  auto args = ssh_args();
  args.insert(args.end(), {"-np", "4", "--min-np", "2", "--host-discovery-script", dir_.file("discover.sh"),
                           "--discovery-interval", "0.3", "--blacklist-after", "3", "--event-log",
                           dir_.file("events.jsonl"), worker_, "--checkpoint", dir_.path(), "--epochs", "40",
                           "--steps-per-epoch", "4", "--step-ms", "100"});
  ErunProcess p(args);
  ASSERT_TRUE(p.wait_output("rank 3/4", 60s)) << p.out() << p.err();

  // Every worker of "host" 127.0.0.3 is killed.
  auto victims = workers_on("127.0.0.3");
  ASSERT_FALSE(victims.empty()) << p.err();
  for (pid_t v : victims) ::kill(v, SIGKILL);
  ASSERT_TRUE(wait_events("generation_started", 2, 60s)) << p.err();
  ASSERT_TRUE(p.wait_output("restart 1", 60s)) << p.out() << p.err();

  // The SSH connection of 127.0.0.4's worker drops: its remote worker must end
  // (nothing to orphan) and the job restarts.
  auto before = workers_on("127.0.0.4");
  ASSERT_FALSE(before.empty());
  std::vector<pid_t> clients;
  for (pid_t pid : pids_with_cmdline("127.0.0.4")) {
    if (read_file("/proc/" + std::to_string(pid) + "/cmdline").rfind(std::string("ssh") + '\0', 0) == 0) {
      clients.push_back(pid);
    }
  }
  ASSERT_FALSE(clients.empty());
  for (pid_t c : clients) ::kill(c, SIGKILL);
  for (pid_t w : before) EXPECT_TRUE(wait_pid_gone(w, 20s)) << "remote worker " << w << " outlived its connection";
  ASSERT_TRUE(wait_events("generation_started", 3, 60s)) << p.err();

  // 127.0.0.4 leaves the host set: the job shrinks to 3 and finishes.
  dir_.write("hosts", "127.0.0.2:2\n127.0.0.3:1\n");
  ASSERT_TRUE(wait_events("generation_started", 4, 60s)) << p.err();
  auto s = p.wait(240s);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->shell_code(), 0) << p.err();
  EXPECT_NE(p.out().find("done epochs=40"), std::string::npos) << p.out();
  EXPECT_TRUE(workers_on("127.0.0.4").empty());
  expect_no_worker_left();
}

TEST_F(ErunSsh, SigtermStopsRemoteWorkersEverywhere) {
  std::string marker = "727272";
  auto args = ssh_args();
  args.insert(args.end(), {"-np", "3", "-H", "127.0.0.2:1,127.0.0.3:1,127.0.0.4:1", "sh", "-c",
                           "trap '' TERM; echo up-$RANK; sleep " + marker + "; sleep " + marker});
  ErunProcess p(args);
  for (int r = 0; r < 3; ++r) ASSERT_TRUE(p.wait_output("up-" + std::to_string(r), 60s)) << p.err();
  p.signal(SIGTERM);
  auto s = p.wait(60s);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->shell_code(), 128 + SIGTERM);
  std::vector<pid_t> left;
  EXPECT_TRUE(wait_no_process(marker, 20s, &left)) << describe_pids(left);
}

}  // namespace
}  // namespace erun::testing
