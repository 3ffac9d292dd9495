#include "agent/replicas.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "agent/detached.h"
#include "commits/replica.h"
#include "common/fd.h"
#include "common/log.h"
#include "common/net.h"
#include "erun/errors.hpp"

namespace erun::agent {
namespace {

namespace si = erun::state_internal;
using namespace std::chrono_literals;

// A stalled peer holds a keeper or a pusher this long at most.
constexpr auto kIoTimeout = 30s;
// A pusher waits (kBusyShare - 1) times as long as its last push took.
constexpr int kBusyShare = 10;

bool channel_ended(int fd, int wait_ms) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, wait_ms) <= 0) return false;
  char byte;
  ssize_t n = ::read(fd, &byte, 1);
  return n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN);
}

// Says each distinct failure once, until a success.
class Complaints {
 public:
  explicit Complaints(std::string me) : me_(std::move(me)) {}
  void failed(const std::string& why) {
    if (why != last_) ERUN_LOG_WARN("{}: {}", me_, why);
    last_ = why;
  }
  void ok() { last_.clear(); }

 private:
  std::string me_, last_;
};

// A listener on every address of this host: IPv6's wildcard, which takes
// IPv4 too, when the host has IPv6 and does not bind it to IPv6 only
// (net.ipv6.bindv6only); otherwise IPv4's.
net::Socket listen_everywhere() {
  char only = '0';
  if (FILE* f = std::fopen("/proc/sys/net/ipv6/bindv6only", "r")) {
    only = static_cast<char>(std::fgetc(f));
    std::fclose(f);
  }
  net::Socket best;
  auto addrs = net::resolve("", "0", /*passive=*/true);
  if (!addrs.is_ok()) return best;
  for (const net::Address& a : addrs.value()) {
    if (a.family() == AF_INET6 && only == '1') continue;
    net::Socket s = net::listen(a, 16);
    if (s.ok() && (!best.ok() || a.family() == AF_INET6)) best = std::move(s);
  }
  return best;
}

[[noreturn]] void run_keeper(int channel, const std::string& commit_dir, const std::string& secret,
                             const std::string& me, net::Socket listener) {
  const std::string port = std::to_string(net::local_address(listener.fd.get()).port()) + "\n";
  if (::write(channel, port.data(), port.size()) != static_cast<ssize_t>(port.size())) ::_exit(1);
  si::ReplicaStore store(commit_dir, std::make_shared<handshake::Key>(secret));
  net::Interrupt stop;
  stop.fd = channel;  // readable at its end
  store.set_interrupt(&stop);
  Complaints complaints(me + ": commit replica keeper");
  while (true) {
    pollfd p[2] = {{listener.fd.get(), POLLIN, 0}, {channel, POLLIN, 0}};
    if (::poll(p, 2, -1) < 0 && errno != EINTR) ::_exit(1);
    if (p[1].revents != 0 && channel_ended(channel, 0)) ::_exit(0);
    if (p[0].revents == 0) continue;
    net::Address peer;
    Fd conn = net::accept(listener.fd.get(), &peer);
    if (!conn) continue;
    // Named without its port, so that one peer's repeated failure is said once.
    std::string name = peer.name();
    name = name.substr(0, name.rfind(':'));
    try {
      int n = store.serve(conn.get(), name, kIoTimeout);
      if (n > 0) ERUN_LOG_DEBUG("{}: stored {} commit(s) from {}", me, n, name);
      complaints.ok();
    } catch (const Error& e) {
      if (channel_ended(channel, 0)) ::_exit(0);
      complaints.failed(e.what());
    } catch (const std::exception& e) {  // e.g. no memory for a table: this keeper ends, the agent starts another
      ERUN_LOG_ERROR("{}: commit replica keeper: {}", me, e.what());
      ::_exit(1);
    }
  }
}

[[noreturn]] void run_pusher(int channel, const std::string& commit_dir, const std::string& secret,
                             const std::string& host, int port, const std::string& keeper_dir, const std::string& me) {
  si::ReplicaPusher pusher(commit_dir, std::make_shared<handshake::Key>(secret));
  net::Interrupt stop;
  stop.fd = channel;
  pusher.set_interrupt(&stop);
  Complaints complaints(fmt::format("{}: commit replicas to {}", me, host));
  bool targeted = false;
  int wait_ms = 0;
  uint64_t count = 0, bytes = 0;
  std::chrono::steady_clock::duration busy{};
  // The wait after an attempt that took `took`: the copying is at most a
  // tenth of the time, leaving the workers of this host the rest of its
  // cores and memory bandwidth; `floor_ms` at least.
  auto pause_after = [](std::chrono::steady_clock::duration took, int floor_ms) {
    return std::max(floor_ms, static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                   took * (kBusyShare - 1)).count()));
  };
  while (!channel_ended(channel, wait_ms)) {
    wait_ms = 100;
    const auto started = std::chrono::steady_clock::now();
    std::vector<si::Pushed> pushed;  // what reached the keeper, even when a later push failed
    bool failed = false;
    try {
      if (!targeted) {
        // Resolved here, not in the agent: a slow name service delays no worker.
        auto addrs = net::resolve(host, std::to_string(port));
        if (!addrs.is_ok() || addrs.value().empty()) {
          throw Error(fmt::format("cannot resolve the keeper's host {}: {}", host, addrs.message()));
        }
        pusher.target(addrs.value().front(), keeper_dir);
        targeted = true;
      }
      pusher.push(kIoTimeout, &pushed);
      complaints.ok();
    } catch (const Error& e) {
      if (channel_ended(channel, 0)) break;
      complaints.failed(e.what());
      failed = true;  // a keeper not there yet, or gone: again in a second at the soonest
    } catch (const std::exception& e) {
      ERUN_LOG_ERROR("{}: commit replicas to {}: {}", me, host, e.what());
      ::_exit(1);
    }
    const auto took = std::chrono::steady_clock::now() - started;
    for (const si::Pushed& p : pushed) {
      ERUN_LOG_DEBUG("{}: commit {} of State {} replicated to {}", me, p.id, p.ordinal, host);
      if (count++ == 0) ERUN_LOG_INFO("{}: commit {} replicated to {}, the first", me, p.id, host);
      bytes += p.bytes;
    }
    if (!pushed.empty() || failed) {
      busy += took;
      wait_ms = pause_after(took, failed ? 1000 : 100);
    }
  }
  ERUN_LOG_INFO("{}: {} commit(s) replicated to {} ({:.1f} MiB, {:.2f} s copying)", me, count, host,
                static_cast<double>(bytes) / (1 << 20), std::chrono::duration<double>(busy).count());
  ::_exit(0);
}

}  // namespace

KeeperProcess spawn_keeper(const std::string& commit_dir, const std::string& secret, const std::string& me,
                           std::string* error) {
  KeeperProcess k;
  const int fd = spawn_helper([&](int channel) {
    // The listener is made here: fork_detached() closed every other descriptor.
    net::Socket listener = listen_everywhere();
    if (!listener.ok()) {
      std::string line = "E " + listener.outcome.text() + "\n";
      (void)!::write(channel, line.data(), line.size());
      ::_exit(1);
    }
    run_keeper(channel, commit_dir, secret, me, std::move(listener));
  });
  if (fd < 0) {
    *error = std::string("cannot start the commit replica keeper: ") + std::strerror(errno);
    return k;
  }
  // Its first line: the port, or why it has none.
  std::string line;
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (line.find('\n') == std::string::npos) {
    pollfd p{fd, POLLIN, 0};
    const int left = net::poll_ms(deadline, 5s);
    if (left <= 0 || ::poll(&p, 1, left) <= 0) break;
    char buf[64];
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    line.append(buf, static_cast<size_t>(n));
  }
  long port = 0;
  if (line.empty() || line[0] == 'E' || (port = std::strtol(line.c_str(), nullptr, 10)) <= 0 || port > 65535) {
    *error = line.size() > 2 && line[0] == 'E' ? "cannot listen for commit replicas: " + line.substr(2, line.size() - 3)
                                               : "the commit replica keeper did not start";
    ::close(fd);
    return k;
  }
  k.channel = fd;
  k.port = static_cast<int>(port);
  return k;
}

int spawn_pusher(const std::string& commit_dir, const std::string& secret, const std::string& host, int port,
                 const std::string& keeper_dir, const std::string& me) {
  return spawn_helper(
      [&](int channel) { run_pusher(channel, commit_dir, secret, host, port, keeper_dir, me); });
}

}  // namespace erun::agent
