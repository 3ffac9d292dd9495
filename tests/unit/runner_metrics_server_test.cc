// The driver's Prometheus endpoint (runner/observe/metrics_server.h) over real sockets
// on loopback: what a scraper gets, and that no scraper, silent, flooding or
// not reading, holds up publish(), the other scrapers or the destructor.
#include "runner/observe/metrics_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/fd.h"
#include "common/net.h"

namespace erun {
namespace {

using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;

// A client socket connected to host:port, or an invalid Fd. `rcvbuf` > 0
// shrinks its receive buffer first, so that a large reply backs up at once.
Fd dial(int port, const std::string& host = "127.0.0.1", int rcvbuf = 0) {
  auto addrs = net::resolve(host, std::to_string(port));
  if (!addrs) return Fd();
  const net::Address& a = addrs->front();
  Fd fd(::socket(a.family(), SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return fd;
  if (rcvbuf > 0) ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
  if (::connect(fd.get(), a.get(), a.length) != 0) return Fd();
  return fd;
}

void send_text(int fd, std::string_view s) {
  net::Outcome o = net::send_all(fd, s, SteadyClock::now() + 5s);
  ASSERT_TRUE(o.ok()) << o.text();
}

// All the peer sends until it closes. `ended` says whether it closed (or reset)
// before the deadline.
std::string read_to_end(int fd, Duration within = 5s, bool* ended = nullptr) {
  const TimePoint deadline = SteadyClock::now() + within;
  std::string out;
  char buf[65536];
  if (ended) *ended = false;
  while (true) {
    if (!net::wait_fd(fd, POLLIN, deadline).ok()) return out;
    const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
    } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
      if (ended) *ended = true;
      return out;
    }
  }
}

struct Response {
  std::string status;  // "HTTP/1.1 200 OK"
  std::map<std::string, std::string> headers;
  std::string body;
};

Response parse(const std::string& raw) {
  Response r;
  const size_t end = raw.find("\r\n\r\n");
  if (end == std::string::npos) return r;
  std::string head = raw.substr(0, end);
  r.body = raw.substr(end + 4);
  size_t pos = head.find("\r\n");
  r.status = head.substr(0, pos);
  while (pos != std::string::npos) {
    const size_t start = pos + 2;
    pos = head.find("\r\n", start);
    const std::string line = head.substr(start, pos == std::string::npos ? std::string::npos : pos - start);
    const size_t colon = line.find(": ");
    if (colon != std::string::npos) r.headers[line.substr(0, colon)] = line.substr(colon + 2);
  }
  return r;
}

Response request(int port, const std::string& text, const std::string& host = "127.0.0.1") {
  Fd fd = dial(port, host);
  EXPECT_TRUE(fd.valid()) << std::strerror(errno);
  if (!fd) return {};
  send_text(fd.get(), text);
  bool ended = false;
  std::string raw = read_to_end(fd.get(), 5s, &ended);
  EXPECT_TRUE(ended) << "the server did not close the connection after replying";
  return parse(raw);
}

Response get(int port, const std::string& path = "/metrics") {
  return request(port, "GET " + path + " HTTP/1.1\r\nHost: x\r\nUser-Agent: test\r\n\r\n");
}

Duration time_of(const std::function<void()>& f) {
  const TimePoint t0 = SteadyClock::now();
  f();
  return SteadyClock::now() - t0;
}

// ---- what a scraper gets ------------------------------------------------------

TEST(RunnerMetricsServer, ServesTheLatestPublishedPage) {
  MetricsServer server;
  ASSERT_TRUE(server.start("127.0.0.1", 0).is_ok());
  ASSERT_GT(server.port(), 0);

  Response before = get(server.port());
  EXPECT_EQ(before.status, "HTTP/1.1 200 OK");
  EXPECT_TRUE(before.body.empty() || before.body[0] == '#') << before.body;  // nothing yet, still valid

  const std::string page = "# TYPE erun_world_size gauge\nerun_world_size 4\n";
  server.publish(page);
  Response r = get(server.port());
  EXPECT_EQ(r.status, "HTTP/1.1 200 OK");
  EXPECT_EQ(r.headers["Content-Type"], "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(r.headers["Content-Length"], std::to_string(page.size()));
  EXPECT_EQ(r.headers["Connection"], "close");
  EXPECT_EQ(r.body, page);

  server.publish("erun_world_size 8\n");
  EXPECT_EQ(get(server.port()).body, "erun_world_size 8\n");
  EXPECT_EQ(get(server.port(), "/metrics?name[]=erun_world_size").body, "erun_world_size 8\n");
}

TEST(RunnerMetricsServer, IndexNotFoundMethodsAndHead) {
  MetricsServer server;
  ASSERT_TRUE(server.start("127.0.0.1", 0).is_ok());
  server.publish("erun_up 1\n");

  Response index = get(server.port(), "/");
  EXPECT_EQ(index.status, "HTTP/1.1 200 OK");
  EXPECT_NE(index.body.find("/metrics"), std::string::npos);

  Response missing = get(server.port(), "/metricsx");
  EXPECT_EQ(missing.status, "HTTP/1.1 404 Not Found");
  EXPECT_EQ(missing.headers["Content-Length"], std::to_string(missing.body.size()));

  Response post = request(server.port(), "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(post.status, "HTTP/1.1 405 Method Not Allowed");
  EXPECT_EQ(post.headers["Allow"], "GET, HEAD");

  Response head = request(server.port(), "HEAD /metrics HTTP/1.1\r\n\r\n");
  EXPECT_EQ(head.status, "HTTP/1.1 200 OK");
  EXPECT_EQ(head.headers["Content-Length"], "10");  // that of the GET
  EXPECT_EQ(head.body, "");

  EXPECT_EQ(request(server.port(), "nonsense\r\n\r\n").status, "HTTP/1.1 400 Bad Request");
  EXPECT_EQ(request(server.port(), "GET /metrics HTTP/1.0\n\n").body, "erun_up 1\n");  // bare LFs
}

// ---- scrapers that misbehave --------------------------------------------------

TEST(RunnerMetricsServer, ASilentClientHoldsUpNothing) {
  auto server = std::make_unique<MetricsServer>();
  ASSERT_TRUE(server->start("127.0.0.1", 0).is_ok());
  Fd silent = dial(server->port());
  ASSERT_TRUE(silent.valid());
  send_text(silent.get(), "GET /metr");  // and then nothing

  Duration took = time_of([&] { server->publish("erun_up 1\n"); });
  // A swap under a mutex. Loose on a loaded machine: a publish() that waited
  // on the network would wait for the connection deadline (10 s).
  EXPECT_LT(took, 1s);
  EXPECT_EQ(get(server->port()).body, "erun_up 1\n");

  took = time_of([&] { server.reset(); });
  EXPECT_LT(took, 1s) << "the destructor waited for the silent client";
  bool ended = false;
  read_to_end(silent.get(), 2s, &ended);
  EXPECT_TRUE(ended) << "the destructor left the client's connection open";
}

TEST(RunnerMetricsServer, ASilentClientIsClosedAtItsDeadline) {
  MetricsServerOptions opt;
  opt.connection_deadline = 300ms;
  MetricsServer server(opt);
  ASSERT_TRUE(server.start("127.0.0.1", 0).is_ok());
  Fd silent = dial(server.port());
  ASSERT_TRUE(silent.valid());
  bool ended = false;
  const Duration took = time_of([&] { EXPECT_EQ(read_to_end(silent.get(), 5s, &ended), ""); });
  EXPECT_TRUE(ended);
  EXPECT_GE(took, 250ms);
  EXPECT_LT(took, 3s);
}

TEST(RunnerMetricsServer, AnOversizedRequestHeadIsRefusedAndOthersAreServed) {
  MetricsServer server;
  ASSERT_TRUE(server.start("127.0.0.1", 0).is_ok());
  server.publish("erun_up 1\n");
  Fd flood = dial(server.port());
  ASSERT_TRUE(flood.valid());
  std::string head = "GET /metrics HTTP/1.1\r\nX-Pad: " + std::string(100 * 1024, 'a') + "\r\n\r\n";
  // The server stops reading past its cap: the rest of the send may fail. Ignored.
  (void)net::send_all(flood.get(), head, SteadyClock::now() + 2s);
  bool ended = false;
  std::string raw = read_to_end(flood.get(), 5s, &ended);
  EXPECT_TRUE(ended) << "the flooding client was not closed";
  if (!raw.empty()) {
    EXPECT_EQ(raw.rfind("HTTP/1.1 431 ", 0), 0u) << raw.substr(0, 80);
  }
  EXPECT_EQ(get(server.port()).body, "erun_up 1\n");
}

TEST(RunnerMetricsServer, AClientThatReadsNothingOfALargePageHoldsUpNothing) {
  MetricsServer server;
  ASSERT_TRUE(server.start("127.0.0.1", 0).is_ok());
  std::string large;
  for (int i = 0; large.size() < 4u << 20; ++i) large += "erun_sample{i=\"" + std::to_string(i) + "\"} 1\n";
  server.publish(large);

  Fd stuck = dial(server.port(), "127.0.0.1", 16 * 1024);
  ASSERT_TRUE(stuck.valid());
  send_text(stuck.get(), "GET /metrics HTTP/1.1\r\n\r\n");
  std::this_thread::sleep_for(100ms);  // the server has filled the stuck client's buffers

  const Duration took = time_of([&] { server.publish("erun_up 1\n"); });
  EXPECT_LT(took, 1s);
  EXPECT_EQ(get(server.port()).body, "erun_up 1\n");
  EXPECT_EQ(get(server.port(), "/").status, "HTTP/1.1 200 OK");

  // Reading at last, the stuck client gets the page of its request, whole.
  Response late = parse(read_to_end(stuck.get()));
  EXPECT_EQ(late.headers["Content-Length"], std::to_string(large.size()));
  EXPECT_TRUE(late.body == large) << "got " << late.body.size() << " of " << large.size() << " bytes";
}

TEST(RunnerMetricsServer, PastTheConnectionCapTheOldestIsDropped) {
  MetricsServerOptions opt;
  opt.max_connections = 3;
  MetricsServer server(opt);
  ASSERT_TRUE(server.start("127.0.0.1", 0).is_ok());
  server.publish("erun_up 1\n");
  std::vector<Fd> idle;
  for (int i = 0; i < 3; ++i) {
    idle.push_back(dial(server.port()));
    ASSERT_TRUE(idle.back().valid());
  }
  EXPECT_EQ(get(server.port()).body, "erun_up 1\n");  // the fourth: served
  bool ended = false;
  read_to_end(idle[0].get(), 2s, &ended);
  EXPECT_TRUE(ended) << "the oldest connection was kept";
  read_to_end(idle[2].get(), 200ms, &ended);
  EXPECT_FALSE(ended) << "a newer connection was dropped";
}

// ---- the listening socket -----------------------------------------------------

TEST(RunnerMetricsServer, APortInUseIsAnErrorNamingTheFlag) {
  auto addrs = net::resolve("127.0.0.1", "0");
  ASSERT_TRUE(addrs.is_ok());
  net::Socket holder = net::listen(addrs->front(), 4);
  ASSERT_TRUE(holder.ok());
  const int taken = net::local_address(holder.fd.get()).port();

  MetricsServer server;
  Status s = server.start("127.0.0.1", taken);
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.message(), "--metrics-port " + std::to_string(taken) + ": cannot listen on 127.0.0.1:" +
                             std::to_string(taken) + ": " + std::strerror(EADDRINUSE));

  MetricsServer bad_port;
  EXPECT_NE(bad_port.start("127.0.0.1", 70000).message().find("--metrics-port 70000"), std::string::npos);
  MetricsServer foreign;  // TEST-NET-1: an address of no host here
  EXPECT_EQ(foreign.start("192.0.2.1", 0).message().rfind("--metrics-addr 192.0.2.1: ", 0), 0u);
}

TEST(RunnerMetricsServer, ListensOnTheAskedAddressOnly) {
  MetricsServer loopback;
  ASSERT_TRUE(loopback.start("127.0.0.1", 0).is_ok());
  EXPECT_EQ(loopback.url(), "http://127.0.0.1:" + std::to_string(loopback.port()) + "/metrics");
  EXPECT_FALSE(dial(loopback.port(), "127.0.0.2").valid());  // another loopback address: refused

  MetricsServer any;
  ASSERT_TRUE(any.start("0.0.0.0", 0).is_ok());
  any.publish("erun_up 1\n");
  Response r = request(any.port(), "GET /metrics HTTP/1.1\r\n\r\n", "127.0.0.2");
  EXPECT_EQ(r.body, "erun_up 1\n");
}

TEST(RunnerMetricsServer, ServesOnIPv6Loopback) {
  MetricsServer server;
  Status s = server.start("::1", 0);
  if (!s.is_ok()) GTEST_SKIP() << "no IPv6 loopback here: " << s.message();
  EXPECT_EQ(server.url(), "http://[::1]:" + std::to_string(server.port()) + "/metrics");
  server.publish("erun_up 1\n");
  EXPECT_EQ(request(server.port(), "GET /metrics HTTP/1.1\r\n\r\n", "::1").body, "erun_up 1\n");
}

// ---- descriptors ------------------------------------------------------------------

std::vector<std::pair<int, std::string>> open_fds() {
  std::vector<std::pair<int, std::string>> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    std::string target = std::filesystem::read_symlink(e.path(), ec).string();
    if (!ec) out.emplace_back(std::stoi(e.path().filename().string()), target);
  }
  return out;
}

TEST(RunnerMetricsServer, EveryDescriptorIsCloseOnExecAndNoneOutlivesTheServer) {
  const size_t before = open_fds().size();
  {
    MetricsServer server;
    ASSERT_TRUE(server.start("127.0.0.1", 0).is_ok());
    server.publish("erun_up 1\n");
    Fd idle = dial(server.port());
    ASSERT_TRUE(idle.valid());
    // Served after the idle one was queued: the server has accepted both.
    EXPECT_EQ(get(server.port()).body, "erun_up 1\n");
    int sockets = 0;
    for (const auto& [fd, target] : open_fds()) {
      if (target.rfind("socket:", 0) != 0 && target.find("eventfd") == std::string::npos) continue;
      ++sockets;
      EXPECT_TRUE(::fcntl(fd, F_GETFD) & FD_CLOEXEC) << "fd " << fd << " (" << target << ") is inherited by exec";
    }
    EXPECT_GE(sockets, 4);  // the listener, the eventfd, the accepted idle one and our client
  }
  EXPECT_EQ(open_fds().size(), before);
}

}  // namespace
}  // namespace erun
