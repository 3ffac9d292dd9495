// ssh_failure_hint(): what erun says when ssh cannot verify a host key. The
// real ssh failure is in tests/integration/launcher_ssh_test.cc.
#include <gtest/gtest.h>

#include <string>

#include "runner/launch/launcher.h"

namespace erun {
namespace {

std::string hint(const SshOptions& o, const std::string& host, const std::string& line) {
  auto h = ssh_failure_hint(o, host, line);
  return h ? *h : "<none>";
}

TEST(SshFailureHint, UnknownHostKeyGetsKeyscanAndAcceptNew) {
  SshOptions o;
  std::string h = hint(o, "node7", "Host key verification failed.");
  EXPECT_NE(h.find("`ssh-keyscan node7 >> ~/.ssh/known_hosts`"), std::string::npos) << h;
  EXPECT_NE(h.find("--ssh-option StrictHostKeyChecking=accept-new"), std::string::npos) << h;
}

TEST(SshFailureHint, PortUserAndKnownHostsFileFromTheOptions) {
  SshOptions o;
  o.port = 2222;
  o.extra_options = {"IdentitiesOnly=yes", "UserKnownHostsFile=/tmp/it's /etc/other", "UserKnownHostsFile=/x"};
  std::string h = hint(o, "bob@node7", "Host key verification failed.\r");
  EXPECT_NE(h.find("`ssh-keyscan -p 2222 node7 >> '/tmp/it'\\''s'`"), std::string::npos) << h;
  // Raw flags: "-o" "Key=Value" and "-oKey=Value"; the argument of "-F" is no option.
  o.extra_options = {"-F", "UserKnownHostsFile=/not", "-o", "userknownhostsfile /kh"};
  EXPECT_NE(hint(o, "n", "Host key verification failed.").find(">> /kh`"), std::string::npos);
  o.extra_options = {"-oUserKnownHostsFile=/kh2", "UserKnownHostsFile=/kh3"};
  EXPECT_NE(hint(o, "n", "Host key verification failed.").find(">> /kh2`"), std::string::npos);
}

TEST(SshFailureHint, ChangedHostKeySaysRemoveTheOldOneFirst) {
  SshOptions o;
  o.port = 2200;
  std::string h = hint(o, "node7", "@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @");
  EXPECT_NE(h.find("`ssh-keygen -f ~/.ssh/known_hosts -R '[node7]:2200'`"), std::string::npos) << h;
  EXPECT_NE(h.find("intercepting"), std::string::npos) << h;
}

TEST(SshFailureHint, OtherLinesGetNone) {
  SshOptions o;
  EXPECT_EQ(hint(o, "n", "ssh: connect to host n port 22: Connection refused"), "<none>");
  EXPECT_EQ(hint(o, "n", "Permission denied (publickey)."), "<none>");
  EXPECT_EQ(hint(o, "n", ""), "<none>");
}

}  // namespace
}  // namespace erun
