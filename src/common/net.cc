#include "common/net.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace erun::net {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

}  // namespace

int Address::port() const {
  if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  if (family() == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  return 0;
}

bool Address::is_wildcard() const {
  if (family() == AF_INET) return reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr.s_addr == htonl(INADDR_ANY);
  if (family() == AF_INET6) {
    auto* a = reinterpret_cast<const sockaddr_in6*>(&storage);
    return std::memcmp(&a->sin6_addr, &in6addr_any, sizeof(in6addr_any)) == 0;
  }
  return false;
}

std::string Address::name() const {
  char host[INET6_ADDRSTRLEN] = {};
  if (family() == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr, host, sizeof(host));
    return fmt::format("{}:{}", host, port());
  }
  if (family() == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr, host, sizeof(host));
    return fmt::format("[{}]:{}", host, port());
  }
  return "unknown peer";
}

Result<std::vector<Address>> resolve(const std::string& host, const std::string& port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* res = nullptr;
  const char* node = passive && host.empty() ? nullptr : host.c_str();
  if (int rc = ::getaddrinfo(node, port.c_str(), &hints, &res); rc != 0) {
    return Result<std::vector<Address>>::error(::gai_strerror(rc));
  }
  std::vector<Address> out;
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    if (ai->ai_addrlen > sizeof(sockaddr_storage)) continue;
    Address a;
    std::memcpy(&a.storage, ai->ai_addr, ai->ai_addrlen);
    a.length = ai->ai_addrlen;
    out.push_back(a);
  }
  ::freeaddrinfo(res);
  if (out.empty()) return Result<std::vector<Address>>::error(::gai_strerror(EAI_NONAME));
  return out;
}

std::string Outcome::text() const {
  switch (end) {
    case kOk: return "ok";
    case kTimedOut: return "timed out";
    case kAborted: return "aborted";
    case kCancelled: return "cancelled";
    case kClosed: return "connection closed";
    case kError: return std::strerror(error);
  }
  return "unknown";
}

int poll_ms(TimePoint deadline, Duration cap) {
  auto left = deadline - Clock::now();
  if (left <= Duration::zero()) return 0;
  left = std::min(left, cap);
  return static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(left).count());
}

Outcome wait_fd(int fd, short events, TimePoint deadline, const Interrupt* in) {
  const bool polled = in && (in->cancelled || in->flag);
  const Duration cap = polled ? Duration(50ms) : Duration(60s);
  while (true) {
    if (in && in->cancelled && in->cancelled()) return {Outcome::kCancelled};
    pollfd p[2] = {{fd, events, 0}, {in ? in->fd : -1, POLLIN, 0}};
    int n = ::poll(p, 2, poll_ms(deadline, cap));
    if (n < 0 && errno != EINTR) return Outcome::failed("poll", errno);
    if (in && ((in->flag && in->flag->load()) || (p[1].revents & POLLIN))) return {Outcome::kAborted};
    if (n > 0 && p[0].revents) return {};
    if (Clock::now() >= deadline) return {Outcome::kTimedOut};
  }
}

Outcome send_all(int fd, std::string_view data, TimePoint deadline, const Interrupt* interrupt) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      if (auto w = wait_fd(fd, POLLOUT, deadline, interrupt); !w.ok()) return w;
      continue;
    }
    return Outcome::failed("send", errno);
  }
  return {};
}

Outcome recv_exact(int fd, char* out, size_t n, TimePoint deadline, const Interrupt* interrupt) {
  size_t off = 0;
  while (off < n) {
    ssize_t r = ::recv(fd, out + off, n - off, MSG_DONTWAIT);
    if (r > 0) {
      off += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) return {Outcome::kClosed};
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      if (auto w = wait_fd(fd, POLLIN, deadline, interrupt); !w.ok()) return w;
      continue;
    }
    return Outcome::failed("recv", errno);
  }
  return {};
}

Socket start_connect(const Address& a) {
  Socket s;
  s.fd.reset(::socket(a.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!s.fd) {
    s.outcome = Outcome::failed("socket", errno);
    return s;
  }
  if (a.family() != AF_UNIX) set_nodelay(s.fd.get());
  if (::connect(s.fd.get(), a.get(), a.length) != 0 && errno != EINPROGRESS) {
    s.outcome = Outcome::failed("connect", errno);
    s.fd.reset();
  }
  return s;
}

int connect_error(int fd) {
  int err = 0;
  socklen_t len = sizeof(err);
  if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) return errno;
  return err;
}

Socket connect(const Address& a, TimePoint deadline, const Interrupt* interrupt) {
  Socket s = start_connect(a);
  if (!s.ok()) return s;
  s.outcome = wait_fd(s.fd.get(), POLLOUT, deadline, interrupt);
  if (s.ok()) {
    if (int err = connect_error(s.fd.get()); err != 0) s.outcome = Outcome::failed("connect", err);
  }
  if (!s.ok()) s.fd.reset();
  return s;
}

bool unix_address(const std::string& path, Address* out) {
  Address a;
  auto* un = reinterpret_cast<sockaddr_un*>(&a.storage);
  if (path.empty() || path.size() >= sizeof un->sun_path) return false;
  un->sun_family = AF_UNIX;
  std::memcpy(un->sun_path, path.c_str(), path.size() + 1);
  a.length = sizeof(sockaddr_un);
  *out = a;
  return true;
}

Socket connect_unix(const Address& a, TimePoint deadline) {
  while (true) {
    Socket s;
    s.fd.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!s.fd) return {Fd(), Outcome::failed("socket", errno)};
    if (::connect(s.fd.get(), a.get(), a.length) == 0) return s;
    const int err = errno;
    // A full backlog (EAGAIN) clears as the listener accepts: retry until the deadline.
    if (err != EAGAIN || Clock::now() >= deadline) return {Fd(), Outcome::failed("connect", err)};
    ::usleep(5000);
  }
}

Socket listen(const Address& a, int backlog, bool reuse_address) {
  Socket s;
  s.fd.reset(::socket(a.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!s.fd) {
    s.outcome = Outcome::failed("socket", errno);
    return s;
  }
  if (reuse_address) {
    int one = 1;
    ::setsockopt(s.fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  }
  if (::bind(s.fd.get(), a.get(), a.length) != 0) {
    s.outcome = Outcome::failed("bind", errno);
  } else if (::listen(s.fd.get(), backlog) != 0) {
    s.outcome = Outcome::failed("listen", errno);
  }
  if (!s.ok()) s.fd.reset();
  return s;
}

Fd accept(int listen_fd, Address* peer) {
  Address a;
  a.length = sizeof(a.storage);
  Fd fd(::accept4(listen_fd, reinterpret_cast<sockaddr*>(&a.storage), &a.length, SOCK_NONBLOCK | SOCK_CLOEXEC));
  if (fd && peer) *peer = a;
  return fd;
}

Address local_address(int fd) {
  Address a;
  a.length = sizeof(a.storage);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a.storage), &a.length);
  return a;
}

Status set_nonblocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return Status::error(fmt::format("fcntl(O_NONBLOCK): {}", std::strerror(errno)));
  }
  return Status::ok();
}

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void ignore_sigpipe_unless_handled() {
  struct sigaction old {};
  if (::sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) {
    ::signal(SIGPIPE, SIG_IGN);
  }
}

}  // namespace erun::net
