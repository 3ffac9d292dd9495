// MetricsServer: the driver's Prometheus page over HTTP (--metrics-port,
// --metrics-addr). The driver thread hands it the whole page with publish();
// the server's own thread answers scrapers with the latest one. publish() only
// swaps a pointer under a mutex, so no scraper, slow, stuck or hostile, can
// delay the driver: each connection has a deadline, a cap on its request and
// its own unsent rest, and past max_connections the oldest is dropped. Every
// socket is close-on-exec (the driver forks workers).
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/fd.h"
#include "common/status.h"

struct pollfd;

namespace erun {

struct MetricsServerOptions {
  // From accept to the last byte sent; a scraper that takes longer is cut off.
  Duration connection_deadline = std::chrono::seconds(10);
  size_t max_connections = 64;
  size_t max_request_head = 8 * 1024;  // larger: 431 and closed
};

class MetricsServer {
 public:
  MetricsServer() = default;
  explicit MetricsServer(MetricsServerOptions options) : opt_(options) {}
  ~MetricsServer();  // stop()
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // Listens on address:port ("127.0.0.1", "0.0.0.0", "::1", "::", a host's IP
  // or name; port 0: an ephemeral one) and starts the server's thread. The
  // error names the flag at fault. Once per server.
  Status start(const std::string& address, int port);
  // Stops and joins the thread, closing every socket (idempotent).
  void stop();
  int port() const { return port_; }  // the bound port, once started
  // "http://127.0.0.1:9400/metrics", "http://[::1]:9400/metrics", for the log.
  const std::string& url() const { return url_; }

  // Replaces the page served at /metrics. Any thread; never waits on the network.
  void publish(std::string text);

 private:
  struct Conn;
  void loop();
  bool serve(Conn& c) const;
  void accept_waiting(std::vector<Conn>& conns, TimePoint& accept_paused_until) const;
  int poll_set(const std::vector<Conn>& conns, bool accepting, TimePoint accept_paused_until,
               std::vector<pollfd>& fds) const;
  std::shared_ptr<const std::string> page() const;

  MetricsServerOptions opt_;
  Fd listen_fd_;
  Fd wake_fd_;  // an eventfd: stop() makes it readable
  int port_ = 0;
  std::string url_;
  std::thread thread_;

  mutable std::mutex mu_;
  std::shared_ptr<const std::string> page_;  // guarded by mu_; null before the first publish()
};

}  // namespace erun
