#include "runner/observe/metrics_server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "common/log.h"
#include "common/net.h"

namespace erun {
namespace {

using SteadyClock = std::chrono::steady_clock;
using namespace std::chrono_literals;
using Body = std::shared_ptr<const std::string>;

constexpr std::string_view kExposition = "text/plain; version=0.0.4; charset=utf-8";
constexpr std::string_view kText = "text/plain; charset=utf-8";

Body make_body(std::string_view s) { return std::make_shared<const std::string>(s); }

// A request head ends with an empty line: CRLF CRLF, or bare LFs from a hand-typed request.
bool head_complete(std::string_view in) {
  return in.find("\r\n\r\n") != std::string_view::npos || in.find("\n\n") != std::string_view::npos;
}

struct Reply {
  std::string head;  // status line and headers
  Body body;         // null: none sent (HEAD)
};

Reply reply(std::string_view status, std::string_view type, Body body, std::string_view extra_headers = {}) {
  std::string head = fmt::format("HTTP/1.1 {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{}Connection: close\r\n\r\n",
                                 status, type, body->size(), extra_headers);
  return {std::move(head), std::move(body)};
}

// The answer to a complete request head; `page` is the latest published one.
Reply answer(std::string_view head, const Body& page) {
  std::string_view line = head.substr(0, head.find('\n'));
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos) return reply("400 Bad Request", kText, make_body("bad request\n"));
  const std::string_view method = line.substr(0, sp1);
  const std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string_view path = target.substr(0, target.find('?'));  // a query changes nothing
  if (method != "GET" && method != "HEAD") {
    return reply("405 Method Not Allowed", kText, make_body("only GET and HEAD\n"), "Allow: GET, HEAD\r\n");
  }
  Reply r;
  if (path == "/metrics") {
    r = reply("200 OK", kExposition, page);
  } else if (path == "/") {
    r = reply("200 OK", "text/html; charset=utf-8",
              make_body("<html><body>erun driver: <a href=\"/metrics\">/metrics</a></body></html>\n"));
  } else {
    r = reply("404 Not Found", kText, make_body("not found: the metrics are at /metrics\n"));
  }
  if (method == "HEAD") r.body.reset();  // Content-Length stays that of the GET
  return r;
}

}  // namespace

struct MetricsServer::Conn {
  Conn(Fd f, TimePoint d) : fd(std::move(f)), deadline(d) {}

  Fd fd;
  TimePoint deadline;
  std::string in;         // the request head so far
  bool replying = false;  // the head is in: only writing from now on
  Reply out;
  size_t sent = 0;  // of out.head, then out.body

  size_t total() const { return out.head.size() + (out.body ? out.body->size() : 0); }

  enum class Read { kMore, kHead, kTooLarge, kGone };
  Read read_head(size_t max) {
    char buf[4096];
    while (true) {
      // One byte past the cap tells a head that is too large from one that just fits.
      const size_t room = max + 1 - in.size();
      const ssize_t n = ::recv(fd.get(), buf, std::min(sizeof buf, room), 0);
      if (n > 0) {
        in.append(buf, static_cast<size_t>(n));
        if (in.size() > max) return Read::kTooLarge;
        if (head_complete(in)) return Read::kHead;
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Read::kMore;
      return Read::kGone;  // closed before asking, or an error
    }
  }

  // Sends what the socket takes now; true while some is left.
  bool write_some() {
    while (sent < total()) {
      iovec iov[2];
      int n = 0;
      const std::string& h = out.head;
      if (sent < h.size()) iov[n++] = {const_cast<char*>(h.data()) + sent, h.size() - sent};
      const size_t body_off = sent > h.size() ? sent - h.size() : 0;
      if (out.body && body_off < out.body->size()) {
        iov[n++] = {const_cast<char*>(out.body->data()) + body_off, out.body->size() - body_off};
      }
      msghdr m{};
      m.msg_iov = iov;
      m.msg_iovlen = static_cast<size_t>(n);
      // MSG_NOSIGNAL: a scraper that hung up must not SIGPIPE the driver.
      const ssize_t r = ::sendmsg(fd.get(), &m, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (r > 0) {
        sent += static_cast<size_t>(r);
        continue;
      }
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      return false;  // the peer is gone: nothing left worth sending
    }
    return false;
  }
};

MetricsServer::~MetricsServer() { stop(); }

Status MetricsServer::start(const std::string& address, int port) {
  ERUN_CHECK(!thread_.joinable());
  if (port < 0 || port > 65535) {
    return Status::error(fmt::format("--metrics-port {}: not a port number (0 to 65535)", port));
  }
  auto addrs = net::resolve(address, std::to_string(port), /*passive=*/true);
  if (!addrs) {
    return Status::error(fmt::format("--metrics-addr {}: cannot resolve it: {}; give an IP address of this host",
                                     address, addrs.message()));
  }
  std::string why;
  bool address_at_fault = false;
  for (const net::Address& a : *addrs) {
    net::Socket s = net::listen(a, 128, /*reuse_address=*/true);  // SOCK_CLOEXEC | SOCK_NONBLOCK
    if (s.ok()) {
      listen_fd_ = std::move(s.fd);
      break;
    }
    why = fmt::format("cannot listen on {}: {}", a.name(), s.outcome.text());
    address_at_fault = s.outcome.error == EADDRNOTAVAIL;
  }
  if (!listen_fd_) {
    return Status::error(address_at_fault ? fmt::format("--metrics-addr {}: {}", address, why)
                                          : fmt::format("--metrics-port {}: {}", port, why));
  }
  wake_fd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_fd_) {
    const int err = errno;
    listen_fd_.reset();
    return Status::error(fmt::format("--metrics-port {}: cannot start the metrics server: eventfd: {}", port,
                                     std::strerror(err)));
  }
  const net::Address bound = net::local_address(listen_fd_.get());
  port_ = bound.port();
  url_ = fmt::format("http://{}/metrics", bound.name());
  thread_ = std::thread([this] { loop(); });
  return Status::ok();
}

void MetricsServer::stop() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_fd_.get(), &one, sizeof one);  // fails only on overflow
    thread_.join();
  }
  listen_fd_.reset();
  wake_fd_.reset();
}

void MetricsServer::publish(std::string text) {
  Body page = std::make_shared<const std::string>(std::move(text));
  std::lock_guard lock(mu_);
  // The old page is freed after unlocking (declared before the lock), unless a
  // scraper's connection still sends it.
  page_.swap(page);
}

std::shared_ptr<const std::string> MetricsServer::page() const {
  std::lock_guard lock(mu_);
  return page_;
}

// One connection's turn when its socket is ready: read its request head,
// then answer with the latest page; false once it is done with.
bool MetricsServer::serve(Conn& c) const {
  static const Body kNothingYet = make_body("# erun: no metrics published yet\n");
  if (!c.replying) {
    switch (c.read_head(opt_.max_request_head)) {
      case Conn::Read::kMore: return true;
      case Conn::Read::kGone: return false;
      case Conn::Read::kTooLarge:
        c.out = reply("431 Request Header Fields Too Large", kText, make_body("request head too large\n"));
        break;
      case Conn::Read::kHead: {
        Body latest = page();
        c.out = answer(c.in, latest ? latest : kNothingYet);
        break;
      }
    }
    c.replying = true;
    c.in = std::string();
  }
  return c.write_some();
}

// Accepts every connection waiting on the listener, dropping the oldest past
// max_connections; on a shortage of descriptors or memory, rests the listener
// until `accept_paused_until`.
void MetricsServer::accept_waiting(std::vector<Conn>& conns, TimePoint& accept_paused_until) const {
  while (true) {
    Fd fd = net::accept(listen_fd_.get());  // non-blocking, close-on-exec
    if (!fd) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      // Out of descriptors or memory: the listener stays readable, so rest
      // it a while instead of spinning on it.
      ERUN_LOG_WARN("metrics: cannot accept a scraper's connection: {}", std::strerror(errno));
      accept_paused_until = SteadyClock::now() + 1s;
      break;
    }
    if (conns.size() >= opt_.max_connections) {
      // Dropping the oldest, not refusing the newest: stuck clients cannot
      // lock a real scraper out for a whole deadline.
      ERUN_LOG_DEBUG("metrics: {} scraper connections open: dropping the oldest", conns.size());
      conns.erase(conns.begin());
    }
    conns.emplace_back(std::move(fd), SteadyClock::now() + opt_.connection_deadline);
  }
}

// Fills `fds` for one poll (the wake fd, the listener unless resting, then
// each connection in order) and returns the poll's timeout in milliseconds:
// until the nearest deadline or the end of the listener's rest.
int MetricsServer::poll_set(const std::vector<Conn>& conns, bool accepting, TimePoint accept_paused_until,
                            std::vector<pollfd>& fds) const {
  TimePoint next = accepting ? TimePoint::max() : accept_paused_until;
  fds.clear();
  fds.push_back({wake_fd_.get(), POLLIN, 0});
  fds.push_back({accepting ? listen_fd_.get() : -1, POLLIN, 0});
  for (const Conn& c : conns) {
    fds.push_back({c.fd.get(), static_cast<short>(c.replying ? POLLOUT : POLLIN), 0});
    next = std::min(next, c.deadline);
  }
  return next == TimePoint::max() ? -1 : net::poll_ms(next, 1h);
}

// The server's thread: closes connections past their deadline, polls, serves
// the ready ones and accepts new ones, until stop() wakes it.
void MetricsServer::loop() {
  std::vector<Conn> conns;  // in accept order: the oldest first
  std::vector<pollfd> fds;
  TimePoint accept_paused_until{};
  while (true) {
    const TimePoint now = SteadyClock::now();
    const size_t before = conns.size();
    std::erase_if(conns, [&](const Conn& c) { return c.deadline <= now; });
    if (conns.size() != before) {
      ERUN_LOG_DEBUG("metrics: closed {} scraper connection(s) at their deadline", before - conns.size());
    }
    const int timeout = poll_set(conns, now >= accept_paused_until, accept_paused_until, fds);
    if (::poll(fds.data(), fds.size(), timeout) < 0) {
      if (errno != EINTR) {
        ERUN_LOG_WARN("metrics: poll: {}", std::strerror(errno));
        std::this_thread::sleep_for(100ms);
      }
      continue;
    }
    if (fds[0].revents) return;  // stop(): the connections close with `conns`

    for (size_t i = 0; i < conns.size(); ++i) {
      if (fds[i + 2].revents && !serve(conns[i])) conns[i].fd.reset();
    }
    std::erase_if(conns, [](const Conn& c) { return !c.fd; });
    if (fds[1].revents & POLLIN) accept_waiting(conns, accept_paused_until);
  }
}

}  // namespace erun
