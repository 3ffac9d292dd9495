// Helpers for the rendezvous tests: a started server, client options that
// reach it, raw sockets for speaking bad protocol, and waits with deadlines.
#pragma once

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "rendezvous/rendezvous.h"
#include "rendezvous/wire.h"

namespace erun::testing {

inline const std::string kJob = "job-42";
inline const std::string kSecret = std::string("s3cr3t\0bytes", 12);

inline ServerOptions server_options(Duration io_timeout = std::chrono::seconds(10)) {
  ServerOptions o;
  o.job_id = kJob;
  o.secret = kSecret;
  o.bind_address = "127.0.0.1";
  o.io_timeout = io_timeout;
  o.max_frame_bytes = 1 << 20;
  return o;
}

inline std::unique_ptr<RendezvousServer> start_server(ServerOptions o = server_options()) {
  auto s = std::make_unique<RendezvousServer>(std::move(o));
  auto st = s->start();
  EXPECT_TRUE(st.is_ok()) << st.message();
  return s;
}

inline ClientOptions client_options(int port) {
  ClientOptions o;
  o.address = "127.0.0.1";
  o.port = port;
  o.job_id = kJob;
  o.secret = kSecret;
  o.io_timeout = std::chrono::seconds(10);
  o.join_timeout = std::chrono::seconds(20);
  return o;
}

inline JoinRequest join_request(const std::string& host, int index, uint64_t commit = 0) {
  JoinRequest r;
  r.slot = {host, index};
  r.commit_id = commit;
  r.pid = ::getpid();
  return r;
}

inline RankAssignment rank_of(const std::string& host, int index, int rank, int size) {
  RankAssignment a;
  a.slot = {host, index};
  a.rank = rank;
  a.size = size;
  a.local_rank = index;
  a.local_size = 1;
  a.cross_rank = rank;
  a.cross_size = size;
  return a;
}

// Polls `pred` until it holds or the deadline passes.
inline bool wait_for(const std::function<bool()>& pred, Duration timeout = std::chrono::seconds(20)) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// A blocking socket to the server, for speaking raw bytes.
inline int raw_connect(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  return fd;
}

inline void raw_send(int fd, const std::string& bytes) {
  ASSERT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
}

// True when the peer closes the connection (EOF or reset) within the timeout;
// anything it sends first (an ERROR frame) is read and discarded.
inline bool closed_by_peer(int fd, Duration timeout = std::chrono::seconds(20)) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  char buf[4096];
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return true;
  }
  return false;
}

// Runs the handshake by hand on a raw socket; true when the server accepted it.
inline bool raw_authenticate(int fd, const std::string& job = kJob, const std::string& secret = kSecret) {
  uint64_t jh = handshake::job_hash(job);
  std::string cn = handshake::random_bytes(wire::kNonceBytes);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  if (!wire::send_all(fd, wire::encode_frame(wire::Type::kHello, jh, -1, 0, cn), deadline)) return false;
  auto ch = wire::recv_frame(fd, jh, 4096, deadline);
  if (!ch || ch->header.type != static_cast<uint16_t>(wire::Type::kChallenge)) return false;
  auto proof = wire::client_proof(secret, ch->payload, job, cn);
  if (!wire::send_all(fd, wire::encode_frame(wire::Type::kAuth, jh, -1, 0, proof), deadline)) return false;
  auto ok = wire::recv_frame(fd, jh, 4096, deadline);
  return ok && ok->header.type == static_cast<uint16_t>(wire::Type::kAuthOk);
}

}  // namespace erun::testing
