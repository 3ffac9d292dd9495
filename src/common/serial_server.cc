#include "common/serial_server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>

namespace erun::net {

SerialServer::SerialServer(const std::string& address, int backlog, Handler handler) : handler_(std::move(handler)) {
  auto addrs = resolve(address, "0", /*passive=*/false);
  if (!addrs.is_ok() || addrs.value().empty()) {
    error_ = "cannot resolve " + address;
    return;
  }
  listener_ = listen(addrs.value().front(), backlog);
  stop_fd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!listener_.ok() || !stop_fd_) {
    error_ = "cannot listen on " + address + ": " + listener_.outcome.text();
    return;
  }
  stop_.fd = stop_fd_.get();
  port_ = local_address(listener_.fd.get()).port();
  thread_ = std::thread([this] { run(); });
}

SerialServer::~SerialServer() {
  if (thread_.joinable()) {
    uint64_t one = 1;
    (void)!::write(stop_fd_.get(), &one, sizeof(one));
    thread_.join();
  }
}

void SerialServer::run() {
  for (;;) {
    pollfd p[2] = {{listener_.fd.get(), POLLIN, 0}, {stop_fd_.get(), POLLIN, 0}};
    if (::poll(p, 2, -1) < 0 && errno != EINTR) return;
    if (p[1].revents != 0) return;
    if (p[0].revents == 0) continue;
    Address peer;
    Fd conn = accept(listener_.fd.get(), &peer);
    if (conn) handler_(conn.get(), peer, stop_);
  }
}

}  // namespace erun::net
