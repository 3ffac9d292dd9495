// A TCP server that answers one connection at a time on a thread of its
// own, for the workers' small side services (the link probe responder, the
// shard server). It listens on an address's ephemeral port and stops when
// destroyed, interrupting the connection it is answering.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "common/net.h"

namespace erun::net {

class SerialServer {
 public:
  // Answers one connection: `fd` (non-blocking) from `peer`; `stop` is
  // signalled when the server is destroyed (give it to every wait).
  using Handler = std::function<void(int fd, const Address& peer, const Interrupt& stop)>;
  SerialServer(const std::string& address, int backlog, Handler handler);
  ~SerialServer();
  SerialServer(const SerialServer&) = delete;
  SerialServer& operator=(const SerialServer&) = delete;
  // The port it listens on; 0 when it could not listen (why: error()).
  int port() const { return port_; }
  const std::string& error() const { return error_; }

 private:
  void run();
  Socket listener_;
  Fd stop_fd_;
  Interrupt stop_;
  Handler handler_;
  int port_ = 0;
  std::string error_;
  std::thread thread_;
};

}  // namespace erun::net
