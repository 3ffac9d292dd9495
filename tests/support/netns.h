// NetNamespace: a "host" of its own for tests that must cut a host off for
// real. It is a network namespace with a veth pair to this machine's
// namespace and private addresses that exist only inside this machine
// (10.77.X.Y/30: this side .Y, the namespace .Y+1). Start the test's sshd in
// it (SshServerOptions::netns) and its workers live there too; cut() takes
// its link down and drop() makes it lose every packet with the link up (a
// qdisc on both ends: netem loss 100%, or where the kernel has no netem a tbf
// whose burst is smaller than any packet), both silently: no reset, no ICMP,
// as a powered-off or partitioned host.
//
// Names carry the test's pid; create() also removes what a killed test left
// (a namespace whose pid is gone). The destructor kills every process in the
// namespace and deletes the link and the namespace, on every path. Needs
// root and ip(8) (iproute2); without them skip_reason() says why.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <sys/types.h>

#include "common/status.h"

namespace erun::testing {

class NetNamespace {
 public:
  // Never throws; check skip_reason() (the test should skip) and error().
  static std::unique_ptr<NetNamespace> create();
  ~NetNamespace();
  NetNamespace(const NetNamespace&) = delete;
  NetNamespace& operator=(const NetNamespace&) = delete;

  const std::string& skip_reason() const { return skip_reason_; }
  const std::string& error() const { return error_; }
  bool ok() const { return skip_reason_.empty() && error_.empty(); }

  const std::string& name() const { return name_; }
  // This machine's end of the link (reachable from inside the namespace).
  const std::string& outer_address() const { return outer_address_; }
  // The namespace's own address.
  const std::string& inner_address() const { return inner_address_; }

  // The link goes down inside the namespace: packets either way vanish.
  Status cut();
  // Why drop() cannot work here, "" when it can: no tc(8), or a kernel with
  // neither the netem nor the tbf qdisc. Probes the link's outer end once.
  std::string drop_skip_reason();
  // Every packet either way is dropped (the link stays up).
  Status drop();
  // Every packet either way waits in a token bucket of `rate` (tc's words,
  // e.g. "1mbit"): a slow link, up and lossless (tbf).
  Status limit(const std::string& rate);
  // Undoes cut(), drop() and limit().
  Status restore();
  // Runs argv inside the namespace and waits (at most 30 s); its exit status
  // must be 0.
  Status exec(const std::vector<std::string>& argv) const;
  // The processes inside the namespace now.
  std::vector<pid_t> pids() const;

 private:
  NetNamespace() = default;
  std::string skip_reason_, error_;
  std::string name_, outer_if_, inner_if_, outer_address_, inner_address_;
  std::vector<std::string> drop_qdisc_;  // tc's words after "root", once probed
  std::string drop_skip_reason_;
  bool drop_probed_ = false;
  bool created_ = false, link_created_ = false, dropping_ = false;
};

}  // namespace erun::testing

// In a test body or SetUp: skip without root or ip(8), fail when the namespace
// could not be made.
#define ERUN_REQUIRE_NETNS(ns)                                   \
  do {                                                           \
    ASSERT_TRUE(ns);                                             \
    if (!(ns)->skip_reason().empty()) GTEST_SKIP() << (ns)->skip_reason(); \
    ASSERT_TRUE((ns)->error().empty()) << (ns)->error();         \
  } while (0)
