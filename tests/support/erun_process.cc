#include "support/erun_process.h"

#include <algorithm>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/strings.h"

namespace erun::testing {

std::string build_path(const std::string& relative) { return std::string(ERUN_BUILD_DIR) + "/" + relative; }
std::string source_path(const std::string& relative) { return std::string(ERUN_SOURCE_DIR) + "/" + relative; }
std::string erun_binary() { return build_path("src/runner/erun"); }

Result<std::string> run_tool(const std::vector<std::string>& argv) {
  SpawnOptions o;
  o.argv = argv;
  auto p = Subprocess::spawn(o);
  if (!p) return Result<std::string>::error(p.message());
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  std::string out, err;
  (void)read_all_until(p->stdout_fd(), out, deadline);
  (void)read_all_until(p->stderr_fd(), err, deadline);
  auto st = p->wait_for(std::chrono::seconds(5));
  if (!st || !st->ok()) {
    std::string cmd;
    for (auto& a : argv) cmd += (cmd.empty() ? "" : " ") + a;
    return Result<std::string>::error(
        fmt::format("'{}' failed ({}): {}", cmd, st ? st->describe() : "timed out", trim(err)));
  }
  return out;
}

const std::vector<std::string> kTrainMlpArgs = {"--samples", "8000", "--epochs",       "10", "--batch",
                                                "256",       "--commit-every", "5",  "--step-ms", "40"};

std::string train_checksum(const std::string& out) {
  std::smatch m;
  static const std::regex re("final accuracy=[0-9.]+ loss=[0-9.]+ checksum=([0-9a-f]+)");
  return std::regex_search(out, m, re) ? m[1].str() : "";
}

void expect_trained_exactly(ErunProcess& p, const std::string& reference) {
  auto s = p.wait(std::chrono::seconds(300));
  ASSERT_TRUE(s) << "erun did not finish\n" << p.out() << p.err();
  EXPECT_EQ(s->shell_code(), 0) << p.err();
  EXPECT_EQ(train_checksum(p.out()), reference) << p.out();
  EXPECT_EQ(p.count("exactly-once=NO"), 0u) << p.out();
}

std::string uninterrupted_training_output() {
  // A copy of its own: tests of real processes running beside this one find
  // their workers by the program's path.
  TempDir dir;
  const std::string program = dir.file("train_mlp_reference");
  std::error_code copied;
  std::filesystem::copy_file(build_path("examples/train_mlp"), program, copied);
  if (copied || ::chmod(program.c_str(), 0755) != 0) return "cannot copy examples/train_mlp: " + copied.message();
  SpawnOptions o;
  o.argv = {program};
  o.argv.insert(o.argv.end(), kTrainMlpArgs.begin(), kTrainMlpArgs.end());
  o.argv.push_back("--step-ms");
  o.argv.push_back("0");
  auto p = Subprocess::spawn(o);
  if (!p) return p.message();
  std::string out;
  read_all_until(p->stdout_fd(), out, std::chrono::steady_clock::now() + std::chrono::seconds(120));
  p->wait_for(std::chrono::seconds(30));
  return out;
}

const std::string& uninterrupted_checksum() {
  static const std::string* checksum = [] {
    const std::string out = uninterrupted_training_output();
    auto* c = new std::string(train_checksum(out));
    EXPECT_FALSE(c->empty()) << "the uninterrupted training failed:\n" << out;
    return c;
  }();
  return *checksum;
}

TempDir::TempDir() {
  char tmpl[] = "/tmp/erun-test-XXXXXX";
  char* p = ::mkdtemp(tmpl);
  path_ = p ? p : "/tmp";
}

TempDir::~TempDir() {
  std::error_code ec;
  if (path_ != "/tmp") std::filesystem::remove_all(path_, ec);
}

void TempDir::write(const std::string& name, const std::string& text, bool executable) const {
  std::string tmp = file(name) + ".tmp";
  {
    std::ofstream out(tmp);
    out << text;
  }
  ::chmod(tmp.c_str(), executable ? 0755 : 0644);
  std::filesystem::rename(tmp, file(name));  // atomic: a reader never sees half a file
}

ErunProcess::ErunProcess(std::vector<std::string> args, std::vector<std::string> extra_env,
                         std::vector<std::string> wrapper) {
  SpawnOptions o;
  o.argv = std::move(wrapper);
  o.argv.push_back(erun_binary());
  // A test that kills erun expects its workers gone with it, unless it asks
  // for a grace itself (a takeover test).
  const bool takeover = std::find(args.begin(), args.end(), "--attach") != args.end() ||
                        std::find(args.begin(), args.end(), "--job-record") != args.end();
  const bool driver = args.empty() || (args[0] != "--agent" && !takeover && args[0] != "--help" &&
                                       args[0] != "--version");
  if (driver && std::find(args.begin(), args.end(), "--driver-grace") == args.end()) {
    o.argv.insert(o.argv.end(), {"--driver-grace", "0"});
  }
  o.argv.insert(o.argv.end(), args.begin(), args.end());
  if (!extra_env.empty()) {
    // An extra NAME=VALUE replaces the inherited NAME (getenv finds the first).
    auto name_of = [](const std::string& kv) { return kv.substr(0, kv.find('=')); };
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) {
      const std::string kv = *e;
      bool replaced = std::any_of(extra_env.begin(), extra_env.end(),
                                  [&](const std::string& x) { return name_of(x) == name_of(kv); });
      if (!replaced) env.push_back(kv);
    }
    env.insert(env.end(), extra_env.begin(), extra_env.end());
    o.env = env;
  }
  auto p = Subprocess::spawn(o);
  if (!p) {
    start_error_ = p.message();
    return;
  }
  proc_ = std::make_unique<Subprocess>(std::move(p.value()));
  out_fd_ = proc_->release_stdout();
  err_fd_ = proc_->release_stderr();
  started_ = true;
  reader_ = std::thread([this] { pump(); });
}

ErunProcess::~ErunProcess() {
  if (proc_ && !proc_->poll()) {
    proc_->signal(SIGKILL);
    proc_->wait_for(std::chrono::seconds(10));
  }
  if (reader_.joinable()) reader_.join();
  if (out_fd_ >= 0) ::close(out_fd_);
  if (err_fd_ >= 0) ::close(err_fd_);
}

void ErunProcess::pump() {
  char buf[65536];
  bool out_open = true, err_open = true;
  while (out_open || err_open) {
    pollfd fds[2] = {{out_open ? out_fd_ : -1, POLLIN, 0}, {err_open ? err_fd_ : -1, POLLIN, 0}};
    int n = ::poll(fds, 2, 200);
    if (n < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t r = ::read(fds[i].fd, buf, sizeof buf);
      if (r <= 0) {
        (i == 0 ? out_open : err_open) = false;
        continue;
      }
      std::lock_guard<std::mutex> lock(mu_);
      (i == 0 ? out_ : err_).append(buf, static_cast<size_t>(r));
    }
  }
}

long ErunProcess::pid() const { return proc_ ? proc_->pid() : -1; }

std::optional<ExitStatus> ErunProcess::wait(Duration timeout) {
  if (!proc_) return ExitStatus{127, 0};
  auto s = proc_->wait_for(timeout);
  if (s && reader_.joinable()) reader_.join();
  return s;
}

void ErunProcess::signal(int sig) {
  // erun itself, not its group: erun must do the forwarding.
  if (proc_ && !proc_->poll()) ::kill(static_cast<pid_t>(proc_->pid()), sig);
}

std::string ErunProcess::out() const {
  std::lock_guard<std::mutex> lock(mu_);
  return out_;
}

std::string ErunProcess::err() const {
  std::lock_guard<std::mutex> lock(mu_);
  return err_;
}

bool ErunProcess::wait_output(const std::string& text, Duration timeout) const {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (out_.find(text) != std::string::npos || err_.find(text) != std::string::npos) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

size_t ErunProcess::count(const std::string& text) const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const std::string* s : {&out_, &err_}) {
    for (size_t pos = s->find(text); pos != std::string::npos; pos = s->find(text, pos + 1)) ++n;
  }
  return n;
}

}  // namespace erun::testing
