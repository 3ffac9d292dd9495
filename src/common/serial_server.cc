#include "common/serial_server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace erun::net {

struct SerialServer::Answering {
  std::thread thread;
  bool done = false;  // under mu_
};

SerialServer::SerialServer(const std::string& address, int backlog, Handler handler, int at_once)
    : handler_(std::move(handler)), at_once_(std::max(1, at_once)) {
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
  if (!thread_.joinable()) return;
  // The eventfd stays readable: every handler's wait sees it.
  uint64_t one = 1;
  (void)!::write(stop_fd_.get(), &one, sizeof(one));
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  room_.notify_all();
  thread_.join();
  for (auto& a : answering_) a->thread.join();
}

bool SerialServer::wait_for_room() {
  std::unique_lock<std::mutex> lock(mu_);
  room_.wait(lock, [&] {
    for (auto it = answering_.begin(); it != answering_.end();) {
      if (!(*it)->done) {
        ++it;
        continue;
      }
      (*it)->thread.join();  // it has returned from its handler
      it = answering_.erase(it);
    }
    return stopping_ || static_cast<int>(answering_.size()) < at_once_;
  });
  return !stopping_;
}

void SerialServer::answer_beside(Fd conn, const Address& peer) {
  std::lock_guard<std::mutex> lock(mu_);
  answering_.push_back(std::make_unique<Answering>());
  Answering* a = answering_.back().get();
  a->thread = std::thread([this, a, peer, fd = std::move(conn)]() mutable {
    handler_(fd.get(), peer, stop_);
    fd.reset();
    {
      std::lock_guard<std::mutex> done_lock(mu_);
      a->done = true;
    }
    room_.notify_all();
  });
}

void SerialServer::run() {
  for (;;) {
    if (at_once_ > 1 && !wait_for_room()) return;
    pollfd p[2] = {{listener_.fd.get(), POLLIN, 0}, {stop_fd_.get(), POLLIN, 0}};
    if (::poll(p, 2, -1) < 0 && errno != EINTR) return;
    if (p[1].revents != 0) return;
    if (p[0].revents == 0) continue;
    Address peer;
    Fd conn = accept(listener_.fd.get(), &peer);
    if (!conn) continue;
    if (at_once_ == 1) {
      handler_(conn.get(), peer, stop_);
    } else {
      answer_beside(std::move(conn), peer);
    }
  }
}

}  // namespace erun::net
