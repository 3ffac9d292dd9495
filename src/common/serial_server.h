// A TCP server for the workers' small side services (the link probe
// responder, the shard server, the buddy keeper): it answers one connection
// at a time on a thread of its own, or up to `at_once` at a time, each on a
// thread of its own, so that one slow or frozen peer holds one of them and
// not the whole service. It listens on an address's ephemeral port and
// stops when destroyed, interrupting the connections it is answering.
#pragma once

#include <condition_variable>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/net.h"

namespace erun::net {

class SerialServer {
 public:
  // Answers one connection: `fd` (non-blocking) from `peer`; `stop` is
  // signalled when the server is destroyed (give it to every wait). With
  // at_once > 1 handlers run at the same time: what they share is theirs
  // to guard.
  using Handler = std::function<void(int fd, const Address& peer, const Interrupt& stop)>;
  SerialServer(const std::string& address, int backlog, Handler handler, int at_once = 1);
  ~SerialServer();
  SerialServer(const SerialServer&) = delete;
  SerialServer& operator=(const SerialServer&) = delete;
  // The port it listens on; 0 when it could not listen (why: error()).
  int port() const { return port_; }
  const std::string& error() const { return error_; }

 private:
  struct Answering;  // a connection answered on a thread of its own
  void run();
  // With at_once > 1: waits until fewer than at_once connections are being
  // answered (false: the server stops), joining the threads that ended.
  bool wait_for_room();
  void answer_beside(Fd conn, const Address& peer);
  Socket listener_;
  Fd stop_fd_;
  Interrupt stop_;
  Handler handler_;
  int at_once_ = 1;
  int port_ = 0;
  std::string error_;
  std::mutex mu_;
  std::condition_variable room_;
  bool stopping_ = false;
  std::list<std::unique_ptr<Answering>> answering_;
  std::thread thread_;  // last: joined before the rest goes
};

}  // namespace erun::net
