// SshLauncher over a private sshd on 127.0.0.2 and 127.0.0.3: the worker
// supervisor runs remotely, the exit status comes back through ssh, the secret
// travels on stdin only, and a dropped connection ends the remote worker.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/strings.h"
#include "runner/launcher.h"
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
    launcher_ = make_ssh_launcher(server_->launcher_options());
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
  // Local ssh client, remote sshd session, supervisor and worker: none shows it.
  EXPECT_FALSE(pids_with_cmdline(marker_).empty());
  EXPECT_TRUE(pids_with_cmdline(s.secret).empty()) << describe_pids(pids_with_cmdline(s.secret));
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
  EXPECT_EQ(st->code, 128 + SIGTERM) << st->describe();
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
  ::kill(static_cast<pid_t>(h->pid()), SIGKILL);  // the local ssh client only
  auto st = wait(*h);
  ASSERT_TRUE(st);
  EXPECT_EQ(st->signal, SIGKILL);
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
  std::string err = read_fd(h->take_stderr());
  EXPECT_NE(err.find("127.0.0.9"), std::string::npos) << err;
}

TEST_F(SshLauncherTest, CommandLineCarriesOptionsAndOneRemoteWord) {
  SshOptions o;
  o.port = 2200;
  o.identity_file = "/k";
  o.user = "bob";
  o.connect_timeout = 2500ms;
  o.extra_options = {"Compression=no", "-F", "/dev/null"};
  auto argv = make_ssh_launcher(o)->command_line(spec("node7", "true"));
  std::string line = join(argv, " ");
  EXPECT_EQ(argv.front(), "ssh");
  EXPECT_NE(line.find("-o BatchMode=yes"), std::string::npos);
  EXPECT_NE(line.find("-o ConnectTimeout=3"), std::string::npos);
  EXPECT_NE(line.find("-p 2200 -i /k -l bob -o Compression=no -F /dev/null node7 "), std::string::npos) << line;
  EXPECT_EQ(argv.back().rfind("exec /bin/sh -c '", 0), 0u);
  EXPECT_EQ(line.find("ssh-s3cr3t"), std::string::npos);
}

}  // namespace
}  // namespace erun
