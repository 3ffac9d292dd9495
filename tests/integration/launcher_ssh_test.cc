// The ssh launcher over a private sshd on 127.0.0.2 and 127.0.0.3 (host keys
// checked against the fixture's known_hosts): one erun agent per host runs
// remotely, exit statuses come back over its channel, the secret and the env
// travel on its stdin only, and a dropped connection ends the remote workers.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <algorithm>
#include <filesystem>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/strings.h"
#include "runner/launch/launcher.h"
#include "support/erun_process.h"
#include "support/process_utils.h"
#include "support/sshd.h"

namespace erun {
namespace {

using namespace std::chrono_literals;
using testing::describe_pids;
using testing::pids_with_cmdline;
using testing::read_file;
using testing::SshServer;
using testing::wait_file_lines;
using testing::wait_no_process;
using testing::wait_pid_gone;

class SshLauncherTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = SshServer::start().release(); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }

  void SetUp() override {
    ERUN_REQUIRE_SSHD(server_);
    char tmpl[] = "/tmp/erun-ssh-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    static std::atomic<int> counter{0};
    marker_ = fmt::format("erun-ssh-marker-{}-{}", ::getpid(), counter++);
    launcher_ = make_ssh_launcher(server_->launcher_options(), agent_options());
  }
  void TearDown() override {
    if (dir_.empty()) return;
    std::vector<pid_t> left;
    EXPECT_TRUE(wait_no_process(marker_, 10s, &left)) << describe_pids(left);
    for (pid_t p : left) ::kill(p, SIGKILL);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  WorkerSpec spec(const std::string& host, const std::string& script) {
    WorkerSpec s;
    s.host = host;
    s.command = {"/bin/sh", "-c", script, marker_};
    s.cwd = dir_;
    s.secret = "ssh-s3cr3t-" + marker_;
    s.term_grace = 1s;
    return s;
  }

  std::unique_ptr<WorkerHandle> launch(const WorkerSpec& s) {
    auto h = launcher_->launch(s);
    EXPECT_TRUE(h.is_ok()) << h.message();
    return h.is_ok() ? std::move(h).value() : nullptr;
  }

  static std::string read_fd(int fd) {
    std::string out;
    EXPECT_TRUE(read_all_until(fd, out, std::chrono::steady_clock::now() + 30s));
    ::close(fd);
    return out;
  }

  static std::optional<ExitStatus> wait(WorkerHandle& h, Duration timeout = 30s) {
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

  // The local ssh client carrying `host`'s agent.
  std::vector<pid_t> ssh_clients(const std::string& host) {
    std::vector<pid_t> out;
    for (pid_t p : pids_with_cmdline(" " + host + " exec ")) {
      if (testing::parent_of(p) == ::getpid()) out.push_back(p);
    }
    return out;
  }

  static SshServer* server_;
  std::unique_ptr<Launcher> launcher_;
  std::string dir_;
  std::string marker_;
};

SshServer* SshLauncherTest::server_ = nullptr;

TEST_F(SshLauncherTest, EnvCwdSecretAndExitCodeOnTwoHosts) {
  std::vector<std::unique_ptr<WorkerHandle>> handles;
  for (const char* host : {"127.0.0.2", "127.0.0.3"}) {
    auto s = spec(host, "printf '%s|%s|%s|' \"$FOO\" \"$(pwd)\" \"$ERUN_SECRET\"; "
                        "echo \"$SSH_CONNECTION\" | cut -d' ' -f3; exit 7");
    s.env = {{"FOO", std::string("x 'y' ") + host}};
    handles.push_back(launch(s));
    ASSERT_TRUE(handles.back());
  }
  for (size_t i = 0; i < handles.size(); ++i) {
    std::string host = i == 0 ? "127.0.0.2" : "127.0.0.3";
    std::string out = read_fd(handles[i]->take_stdout());
    EXPECT_EQ(out, fmt::format("x 'y' {}|{}|ssh-s3cr3t-{}|{}\n", host, dir_, marker_, host));
    auto st = wait(*handles[i]);
    ASSERT_TRUE(st);
    EXPECT_EQ(st->code, 7) << st->describe() << " stderr: " << read_fd(handles[i]->take_stderr());
  }
}

TEST_F(SshLauncherTest, SecretIsNeverInAnyCommandLine) {
  std::string flag = dir_ + "/started";
  auto s = spec("127.0.0.2", "echo \"$ERUN_SECRET\" > " + shell_quote(flag) + "; sleep 30");
  auto h = launch(s);
  ASSERT_TRUE(h);
  ASSERT_TRUE(wait_file_lines(flag, 1, 30s));
  EXPECT_EQ(read_file(flag), s.secret + "\n");
  // Local ssh client, remote sshd session, agent and worker: none shows it.
  EXPECT_FALSE(pids_with_cmdline(marker_).empty());
  EXPECT_TRUE(pids_with_cmdline(s.secret).empty()) << describe_pids(pids_with_cmdline(s.secret));
  std::string value = "ssh-env-value-" + marker_;
  std::reverse(value.begin(), value.end());
  auto s2 = spec("127.0.0.2", "echo \"$V\" >> " + shell_quote(flag) + "; sleep 30");
  s2.env = {{"V", value}};
  auto h2 = launch(s2);
  ASSERT_TRUE(h2);
  ASSERT_TRUE(wait_file_lines(flag, 2, 30s));
  EXPECT_TRUE(pids_with_cmdline(value).empty()) << describe_pids(pids_with_cmdline(value));
  h2->kill();
  ASSERT_TRUE(wait(*h2));
  h->kill();
  ASSERT_TRUE(wait(*h));
}

TEST_F(SshLauncherTest, TerminateStopsTheRemoteWorkerAndItsChildren) {
  std::string pids = dir_ + "/pids";
  auto h = launch(spec("127.0.0.3", "sleep 300 & echo $! >> " + pids + "; echo $$ >> " + pids + "; wait"));
  ASSERT_TRUE(h);
  ASSERT_TRUE(wait_file_lines(pids, 2, 30s));
  h->terminate();
  auto st = wait(*h);
  ASSERT_TRUE(st);
  EXPECT_EQ(st->shell_code(), 128 + SIGTERM) << st->describe();
  for (pid_t p : read_pids(pids)) EXPECT_TRUE(wait_pid_gone(p, 10s)) << p;
}

TEST_F(SshLauncherTest, DroppedConnectionKillsTheRemoteWorker) {
  std::string pids = dir_ + "/pids";
  // The worker and a grandchild both ignore SIGTERM: the grace then SIGKILL ends them.
  auto h = launch(spec("127.0.0.2", "trap '' TERM; (trap '' TERM; sleep 301) & echo $! >> " + pids +
                                        "; echo $$ >> " + pids + "; while :; do sleep 0.05; done"));
  ASSERT_TRUE(h);
  ASSERT_TRUE(wait_file_lines(pids, 2, 30s));
  auto start = std::chrono::steady_clock::now();
  auto clients = ssh_clients("127.0.0.2");
  ASSERT_EQ(clients.size(), 1u);
  ::kill(clients[0], SIGKILL);  // the local ssh client only
  auto st = wait(*h);
  ASSERT_TRUE(st);
  EXPECT_EQ(st->code, 255) << st->describe();
  for (pid_t p : read_pids(pids)) EXPECT_TRUE(wait_pid_gone(p, 15s)) << p;
  std::vector<pid_t> left;
  EXPECT_TRUE(wait_no_process(marker_, 15s, &left)) << describe_pids(left);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
}

TEST_F(SshLauncherTest, DestroyingTheHandleLeavesNoRemoteProcess) {
  std::string pids = dir_ + "/pids";
  auto s = spec("127.0.0.3", "trap '' TERM; sleep 300 & echo $! >> " + pids + "; echo $$ >> " + pids +
                                 "; while :; do sleep 0.05; done");
  s.term_grace = 60s;
  auto h = launch(s);
  ASSERT_TRUE(h);
  ASSERT_TRUE(wait_file_lines(pids, 2, 30s));
  auto start = std::chrono::steady_clock::now();
  h.reset();
  for (pid_t p : read_pids(pids)) EXPECT_TRUE(wait_pid_gone(p, 15s)) << p;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 15s);
}

TEST_F(SshLauncherTest, UnreachableHostFailsWith255Quickly) {
  auto start = std::chrono::steady_clock::now();
  auto s = spec("127.0.0.9", "true");
  auto h = launch(s);
  ASSERT_TRUE(h);
  auto st = wait(*h, 30s);
  ASSERT_TRUE(st);
  EXPECT_EQ(st->code, 255) << st->describe();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
}

TEST_F(SshLauncherTest, UnknownHostKeyIsRefusedByDefault) {
  SshOptions o = server_->launcher_options();
  o.extra_options = {"IdentitiesOnly=yes", "UserKnownHostsFile=" + dir_ + "/empty_known_hosts"};
  auto refusing = make_ssh_launcher(o, agent_options());
  auto h = refusing->launch(spec("127.0.0.2", "touch " + dir_ + "/ran"));
  ASSERT_TRUE(h.is_ok()) << h.message();
  auto st = wait(**h);
  ASSERT_TRUE(st);
  EXPECT_EQ(st->code, 255) << st->describe();
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/ran"));
  // The worker's report is ssh's line and how to fix it, for this port and known_hosts file.
  auto report = (*h)->exit_stderr();
  ASSERT_TRUE(report);
  std::string text = join(*report, "\n");
  EXPECT_NE(text.find("Host key verification failed"), std::string::npos) << text;
  EXPECT_NE(text.find(fmt::format("`ssh-keyscan -p {} 127.0.0.2 >> {}/empty_known_hosts`", server_->port(), dir_)),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("--ssh-option StrictHostKeyChecking=accept-new"), std::string::npos) << text;
  // The documented way to turn checking off for a throwaway cluster.
  o.extra_options.push_back("StrictHostKeyChecking=no");
  o.extra_options.push_back("UserKnownHostsFile=/dev/null");
  o.extra_options.erase(o.extra_options.begin() + 1);
  auto trusting = make_ssh_launcher(o, agent_options());
  auto h2 = trusting->launch(spec("127.0.0.2", "exit 6"));
  ASSERT_TRUE(h2.is_ok()) << h2.message();
  st = wait(**h2);
  ASSERT_TRUE(st);
  EXPECT_EQ(st->code, 6) << st->describe();
}

TEST_F(SshLauncherTest, OneAgentPerHostStartsManyWorkers) {
  std::vector<std::unique_ptr<WorkerHandle>> handles;
  for (int i = 0; i < 6; ++i) handles.push_back(launch(spec(i % 2 ? "127.0.0.3" : "127.0.0.2", "exit 3")));
  for (auto& h : handles) {
    ASSERT_TRUE(h);
    auto st = wait(*h);
    ASSERT_TRUE(st);
    EXPECT_EQ(st->code, 3);
  }
  EXPECT_EQ(ssh_clients("127.0.0.2").size(), 1u);
  EXPECT_EQ(ssh_clients("127.0.0.3").size(), 1u);
}

TEST_F(SshLauncherTest, CommandLineCarriesOptionsAndOneRemoteWord) {
  SshOptions o;
  o.port = 2200;
  o.identity_file = "/k";
  o.user = "bob";
  o.connect_timeout = 2500ms;
  o.extra_options = {"Compression=no", "-F", "/dev/null"};
  auto s = spec("node7", "true");
  s.env = {{"FOO", "env-value-" + marker_}};
  auto argv = make_ssh_launcher(o, agent_options())->command_line(s);
  std::string line = join(argv, " ");
  EXPECT_EQ(argv.front(), "ssh");
  EXPECT_NE(line.find("-o BatchMode=yes"), std::string::npos);
  EXPECT_NE(line.find("-o ConnectTimeout=3"), std::string::npos);
  // The user's known_hosts and config decide about host keys.
  EXPECT_EQ(line.find("StrictHostKeyChecking"), std::string::npos);
  EXPECT_EQ(line.find("UserKnownHostsFile"), std::string::npos);
  EXPECT_NE(line.find("-p 2200 -i /k -l bob -o Compression=no -F /dev/null -- node7 "), std::string::npos) << line;
  // Relaying is on unless --no-agent-relay turned it off.
  EXPECT_EQ(argv.back(), "exec " + testing::erun_binary() + " --agent --heartbeat-interval 1 --heartbeat-timeout 3 --relay --log-level info");
  EXPECT_EQ(line.find("ssh-s3cr3t"), std::string::npos);
  EXPECT_EQ(line.find(marker_), std::string::npos);
}

}  // namespace
}  // namespace erun
