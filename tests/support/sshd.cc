#include "support/sshd.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/format.h>

#include "common/strings.h"
#include "support/erun_process.h"
#include "support/process_utils.h"

namespace erun::testing {

namespace {

constexpr const char* kSshd = "/usr/sbin/sshd";

// Binds addr:port (port 0: any); returns the bound port or -1.
int try_bind(const std::string& addr, int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, addr.c_str(), &sa.sin_addr);
  int result = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0) {
    socklen_t len = sizeof sa;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
    result = ntohs(sa.sin_port);
  }
  ::close(fd);
  return result;
}

bool can_connect(const std::string& addr, int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, addr.c_str(), &sa.sin_addr);
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0;
  ::close(fd);
  return ok;
}

}  // namespace

std::unique_ptr<SshServer> SshServer::start(std::vector<std::string> addresses) {
  SshServerOptions o;
  o.addresses = std::move(addresses);
  return start(o);
}

std::unique_ptr<SshServer> SshServer::start(const SshServerOptions& options) {
  std::unique_ptr<SshServer> s(new SshServer());
  s->addresses_ = options.addresses;
  if (::access(kSshd, X_OK) != 0) {
    s->available_ = false;
    return s;
  }
  char tmpl[] = "/tmp/erun-sshd-XXXXXX";
  if (!::mkdtemp(tmpl)) {
    s->error_ = "mkdtemp failed";
    return s;
  }
  s->dir_ = tmpl;
  const std::string host_key = s->dir_ + "/host_ed25519";
  s->identity_file_ = options.keys_from ? options.keys_from->identity_file() : s->dir_ + "/client_ed25519";
  std::vector<std::string> keys = {host_key};
  if (!options.keys_from) keys.push_back(s->identity_file_);
  for (const auto& key : keys) {
    if (auto r = run_tool({"ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "erun-test", "-f", key}); !r) {
      s->error_ = r.message();
      return s;
    }
  }
  std::filesystem::copy_file(s->identity_file_ + ".pub", s->dir_ + "/authorized_keys");

  // A port free on every address (another sshd could still take it before ours
  // starts; start() then fails with a clear log). A namespace of the test's
  // own has no other listener: any port is free there.
  s->port_ = options.port;
  if (s->port_ == 0 && !options.netns.empty()) s->port_ = try_bind("127.0.0.1", 0);
  for (int attempt = 0; attempt < 20 && s->port_ <= 0; ++attempt) {
    int port = try_bind(s->addresses_.at(0), 0);
    bool all = port > 0;
    for (size_t i = 1; all && i < s->addresses_.size(); ++i) all = try_bind(s->addresses_[i], port) == port;
    if (all) s->port_ = port;
  }
  if (s->port_ <= 0) {
    s->error_ = "no free port on " + s->addresses_.at(0);
    return s;
  }

  // Host-key checking stays on: clients trust exactly this server's key.
  {
    auto words = split(trim(read_file(host_key + ".pub")), ' ');
    if (words.size() < 2) {
      s->error_ = "cannot read the host key " + host_key + ".pub";
      return s;
    }
    std::ofstream k(s->known_hosts_file());
    for (const auto& a : s->addresses_) k << "[" << a << "]:" << s->port_ << " " << words[0] << " " << words[1] << "\n";
  }

  const std::string config = s->dir_ + "/sshd_config";
  {
    std::ofstream c(config);
    c << "Port " << s->port_ << "\n";
    for (const auto& a : s->addresses_) c << "ListenAddress " << a << "\n";
    c << "HostKey " << host_key << "\n"
      << "AuthorizedKeysFile " << s->dir_ << "/authorized_keys\n"
      << "PidFile " << s->dir_ << "/sshd.pid\n"
      << "StrictModes no\nUsePAM no\nPermitRootLogin yes\nPasswordAuthentication no\n"
      << "KbdInteractiveAuthentication no\nPubkeyAuthentication yes\nUseDNS no\n"
      << "MaxStartups 100\nMaxSessions 100\nX11Forwarding no\nPrintMotd no\nLogLevel INFO\n";
  }
  std::error_code ec;
  std::filesystem::create_directories("/run/sshd", ec);

  SpawnOptions o;
  o.argv = {"/bin/sh", "-c",
            fmt::format("exec {} -D -e -f '{}' 2>>'{}/sshd.log'", kSshd, config, s->dir_)};
  if (!options.netns.empty()) o.argv.insert(o.argv.begin(), {"ip", "netns", "exec", options.netns});
  o.pipe_stdout = false;
  o.pipe_stderr = false;
  auto p = Subprocess::spawn(o);
  if (!p) {
    s->error_ = "cannot start sshd: " + p.message();
    return s;
  }
  s->sshd_ = std::make_unique<Subprocess>(std::move(p).value());

  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  for (const auto& a : s->addresses_) {
    while (!can_connect(a, s->port_)) {
      if (auto st = s->sshd_->poll()) {
        s->error_ = fmt::format("sshd exited ({}): {}", st->describe(), s->log());
        return s;
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        s->error_ = fmt::format("sshd did not listen on {}:{} within 15 s: {}", a, s->port_, s->log());
        return s;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  return s;
}

std::string SshServer::log() const { return read_file(dir_ + "/sshd.log"); }

SshServer::~SshServer() {
  if (sshd_) (void)sshd_->terminate(std::chrono::seconds(2));
  sshd_.reset();
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

}  // namespace erun::testing
