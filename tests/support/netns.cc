#include "support/netns.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "common/strings.h"
#include "support/erun_process.h"
#include "support/process_utils.h"

namespace erun::testing {

namespace {

constexpr const char* kPrefix = "erun-test-";

// An iproute2 tool's path ("" when missing).
std::string find_tool(const std::string& name) {
  for (const char* dir : {"/usr/sbin/", "/sbin/", "/usr/bin/", "/bin/"}) {
    if (::access((dir + name).c_str(), X_OK) == 0) return dir + name;
  }
  return "";
}

std::string find_ip() { return find_tool("ip"); }
std::string find_tc() { return find_tool("tc"); }

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  std::string l;
  while (std::getline(in, l)) {
    l = trim(l);
    if (!l.empty()) out.push_back(l);
  }
  return out;
}

std::vector<pid_t> pids_in(const std::string& ip, const std::string& ns) {
  std::vector<pid_t> out;
  auto r = run_tool({ip, "netns", "pids", ns});
  if (!r) return out;
  for (auto& l : lines_of(*r)) {
    long v;
    if (parse_int(l, v) && v > 0) out.push_back(static_cast<pid_t>(v));
  }
  return out;
}

// Kills every process in the namespace and waits (bounded) until none is left.
void empty_namespace(const std::string& ip, const std::string& ns) {
  for (int round = 0; round < 50; ++round) {
    auto pids = pids_in(ip, ns);
    if (pids.empty()) return;
    for (pid_t p : pids) ::kill(p, SIGKILL);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

// Namespaces (and their links) of tests that were killed before cleaning up:
// erun-test-PID-... whose PID is gone.
void remove_stale(const std::string& ip) {
  auto r = run_tool({ip, "netns", "list"});
  if (!r) return;
  for (auto& l : lines_of(*r)) {
    std::string ns = l.substr(0, l.find(' '));
    if (!starts_with(ns, kPrefix)) continue;
    std::string rest = ns.substr(std::string(kPrefix).size());
    long pid;
    if (!parse_int(rest.substr(0, rest.find('-')), pid) || pid <= 0) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    empty_namespace(ip, ns);
    (void)run_tool({ip, "netns", "del", ns});  // the veth pair goes with it
  }
}

}  // namespace

std::unique_ptr<NetNamespace> NetNamespace::create() {
  std::unique_ptr<NetNamespace> n(new NetNamespace());
  if (::geteuid() != 0) {
    n->skip_reason_ = "network namespaces need root (ip netns add); run this test as root";
    return n;
  }
  const std::string ip = find_ip();
  if (ip.empty()) {
    n->skip_reason_ = "ip(8) not found: install iproute2 to run network-namespace tests";
    return n;
  }
  remove_stale(ip);
  static int counter = 0;
  const long pid = ::getpid();
  const int serial = counter++;
  n->name_ = fmt::format("{}{}-{}", kPrefix, pid, serial);
  if (auto r = run_tool({ip, "netns", "add", n->name_}); !r) {
    n->error_ = r.message();
    return n;
  }
  n->created_ = true;
  // Interface names: at most 15 characters.
  n->outer_if_ = fmt::format("evo{}x{}", pid, serial);
  n->inner_if_ = fmt::format("evi{}x{}", pid, serial);
  if (auto r = run_tool({ip, "link", "add", n->outer_if_, "type", "veth", "peer", "name", n->inner_if_}); !r) {
    n->error_ = r.message();
    return n;
  }
  n->link_created_ = true;
  // A /30 out of 10.77.0.0/16 picked by pid and serial; one in use (another
  // test at the same time) is skipped.
  std::string last;
  for (int attempt = 0; attempt < 64; ++attempt) {
    long block = (pid * 8 + serial + attempt * 97) % 16384;
    std::string outer = fmt::format("10.77.{}.{}", block / 64, (block % 64) * 4 + 1);
    std::string inner = fmt::format("10.77.{}.{}", block / 64, (block % 64) * 4 + 2);
    auto in_use = run_tool({ip, "-4", "-o", "addr", "show", "to", outer + "/30"});
    if (in_use && !trim(*in_use).empty()) continue;
    if (auto r = run_tool({ip, "addr", "add", outer + "/30", "dev", n->outer_if_}); !r) {
      last = r.message();
      continue;
    }
    n->outer_address_ = outer;
    n->inner_address_ = inner;
    break;
  }
  if (n->outer_address_.empty()) {
    n->error_ = "no free 10.77.x.y/30 for the namespace's link: " + last;
    return n;
  }
  for (const auto& argv : std::vector<std::vector<std::string>>{
           {ip, "link", "set", n->inner_if_, "netns", n->name_},
           {ip, "link", "set", n->outer_if_, "up"},
           {ip, "-n", n->name_, "addr", "add", n->inner_address_ + "/30", "dev", n->inner_if_},
           {ip, "-n", n->name_, "link", "set", n->inner_if_, "up"},
           {ip, "-n", n->name_, "link", "set", "lo", "up"}}) {
    if (auto r = run_tool(argv); !r) {
      n->error_ = r.message();
      return n;
    }
  }
  return n;
}

NetNamespace::~NetNamespace() {
  const std::string ip = find_ip();
  if (ip.empty()) return;
  if (created_) empty_namespace(ip, name_);
  if (link_created_) (void)run_tool({ip, "link", "del", outer_if_});  // deletes both ends
  if (created_) (void)run_tool({ip, "netns", "del", name_});
}

Status NetNamespace::cut() {
  auto r = run_tool({find_ip(), "-n", name_, "link", "set", inner_if_, "down"});
  return r ? Status::ok() : Status::error(r.message());
}

std::string NetNamespace::drop_skip_reason() {
  if (drop_probed_) return drop_skip_reason_;
  drop_probed_ = true;
  const std::string tc = find_tc();
  if (tc.empty()) return drop_skip_reason_ = "tc(8) not found: install iproute2 to drop a host's traffic";
  // A tbf drops every packet longer than its burst: with a 1-byte burst, all.
  std::string errors;
  for (const auto& qdisc : std::vector<std::vector<std::string>>{
           {"netem", "loss", "100%"}, {"tbf", "rate", "1kbit", "burst", "1", "latency", "1ms"}}) {
    std::vector<std::string> argv = {tc, "qdisc", "replace", "dev", outer_if_, "root"};
    argv.insert(argv.end(), qdisc.begin(), qdisc.end());
    if (auto r = run_tool(argv); !r) {
      errors += (errors.empty() ? "" : "; ") + r.message();
      continue;
    }
    (void)run_tool({tc, "qdisc", "del", "dev", outer_if_, "root"});
    drop_qdisc_ = qdisc;
    return "";
  }
  return drop_skip_reason_ = "this kernel has neither the netem nor the tbf qdisc (" + errors +
                             "): a host's traffic cannot be dropped here";
}

Status NetNamespace::drop() {
  if (std::string why = drop_skip_reason(); !why.empty()) return Status::error(why);
  const std::string tc = find_tc();
  // Both directions: each end's egress.
  std::vector<std::string> inner = {find_ip(), "netns", "exec", name_, tc, "qdisc", "replace", "dev", inner_if_, "root"};
  std::vector<std::string> outer = {tc, "qdisc", "replace", "dev", outer_if_, "root"};
  for (auto* argv : {&inner, &outer}) {
    argv->insert(argv->end(), drop_qdisc_.begin(), drop_qdisc_.end());
    dropping_ = true;  // restore() undoes what part of it was done
    if (auto r = run_tool(*argv); !r) return Status::error(r.message());
  }
  return Status::ok();
}

Status NetNamespace::limit(const std::string& rate) {
  const std::string tc = find_tc();
  if (tc.empty()) return Status::error("tc(8) not found: install iproute2 to slow a host's link");
  const std::vector<std::string> tbf = {"tbf", "rate", rate, "burst", "16kb", "latency", "2s"};
  std::vector<std::string> inner = {find_ip(), "netns", "exec", name_, tc, "qdisc", "replace", "dev", inner_if_, "root"};
  std::vector<std::string> outer = {tc, "qdisc", "replace", "dev", outer_if_, "root"};
  for (auto* argv : {&inner, &outer}) {
    argv->insert(argv->end(), tbf.begin(), tbf.end());
    dropping_ = true;  // restore() removes it
    if (auto r = run_tool(*argv); !r) return Status::error(r.message());
  }
  return Status::ok();
}

Status NetNamespace::restore() {
  const std::string ip = find_ip();
  if (dropping_) {
    const std::string tc = find_tc();
    (void)run_tool({ip, "netns", "exec", name_, tc, "qdisc", "del", "dev", inner_if_, "root"});
    (void)run_tool({tc, "qdisc", "del", "dev", outer_if_, "root"});
    dropping_ = false;
  }
  auto r = run_tool({ip, "-n", name_, "link", "set", inner_if_, "up"});
  return r ? Status::ok() : Status::error(r.message());
}

Status NetNamespace::exec(const std::vector<std::string>& argv) const {
  std::vector<std::string> full = {find_ip(), "netns", "exec", name_};
  full.insert(full.end(), argv.begin(), argv.end());
  auto r = run_tool(full);
  return r ? Status::ok() : Status::error(r.message());
}

std::vector<pid_t> NetNamespace::pids() const { return pids_in(find_ip(), name_); }

}  // namespace erun::testing
