// SshServer: a private sshd on loopback addresses (127.0.0.2, .3, ... act as
// distinct hosts) with its own host key, client key and config in a temp dir,
// so SSH launch is tested for real without touching the system's sshd.
// Start it once per test suite; the destructor stops sshd and removes the dir.
// Missing /usr/sbin/sshd is a skip (CI installs openssh-server); a sshd that
// fails to start is a failure with its log in error().
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/subprocess.h"
#include "runner/launch/launcher.h"

namespace erun::testing {

class SshServer;

struct SshServerOptions {
  std::vector<std::string> addresses;
  // Run sshd inside this network namespace (tests/support/netns.h).
  std::string netns;
  // 0: a port free on every address.
  int port = 0;
  // Accept the client key of this server too, so that one identity file
  // (erun --ssh-identity-file) reaches both.
  const SshServer* keys_from = nullptr;
};

class SshServer {
 public:
  static std::vector<std::string> default_addresses() { return {"127.0.0.2", "127.0.0.3", "127.0.0.4"}; }
  // Never throws; check available() and error().
  static std::unique_ptr<SshServer> start(std::vector<std::string> addresses = default_addresses());
  static std::unique_ptr<SshServer> start(const SshServerOptions& options);
  ~SshServer();

  bool available() const { return available_; }  // false: no sshd binary (skip)
  const std::string& error() const { return error_; }  // non-empty: start failed
  bool ok() const { return available_ && error_.empty(); }

  int port() const { return port_; }
  const std::string& identity_file() const { return identity_file_; }
  const std::string& dir() const { return dir_; }
  const std::vector<std::string>& addresses() const { return addresses_; }
  std::string log() const;

  // known_hosts holding this server's host key for each of its addresses.
  std::string known_hosts_file() const { return dir_ + "/known_hosts"; }

  // What a launcher needs to reach this server (host keys checked).
  SshOptions launcher_options() const {
    SshOptions o;
    o.port = port_;
    o.identity_file = identity_file_;
    o.connect_timeout = std::chrono::seconds(10);
    o.extra_options = {"IdentitiesOnly=yes", "UserKnownHostsFile=" + known_hosts_file()};
    return o;
  }
  // The same as erun flags.
  std::vector<std::string> erun_args() const {
    return {"--ssh-port", std::to_string(port_), "--ssh-identity-file", identity_file_,
            "--ssh-option", "IdentitiesOnly=yes", "--ssh-option", "UserKnownHostsFile=" + known_hosts_file()};
  }

 private:
  SshServer() = default;
  bool available_ = true;
  std::string error_;
  std::string dir_;
  std::string identity_file_;
  std::vector<std::string> addresses_;
  int port_ = 0;
  std::unique_ptr<Subprocess> sshd_;
};

}  // namespace erun::testing

// In a test body or SetUp: skip without sshd, fail when it did not start.
#define ERUN_REQUIRE_SSHD(server)                                                          \
  do {                                                                                     \
    if (!(server) || !(server)->available())                                               \
      GTEST_SKIP() << "/usr/sbin/sshd not found: install openssh-server to run SSH tests"; \
    ASSERT_TRUE((server)->error().empty()) << (server)->error();                           \
  } while (0)
