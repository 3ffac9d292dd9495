// The formed mesh moving one collective's frames between ranks: what the
// algorithms use instead of sockets. One caller thread (the Sender's calls
// step_send), abort() from any; failures are CommErrors. docs/design.md.
#pragma once

#include <poll.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "collectives/tcp/pair.h"
#include "collectives/tcp/tcp_communicator.h"
#include "common/clock.h"
#include "common/fd.h"
#include "common/net.h"
#include "store/kv_store.h"

namespace erun::tcp {

// Received data is reduced in pieces of this size while the rest arrives
// (a multiple of every element size).
inline constexpr size_t kReduceSegment = 256 << 10;

// One operation's frame out to one peer.
struct SendOp {
  int peer = 0;
  FrameHeader header{};
  const char* data = nullptr;
  size_t done = 0;  // bytes of header + payload written
  bool complete() const { return done == sizeof(FrameHeader) + header.length; }
};

// One operation's frame in from one peer.
struct RecvOp {
  int peer = 0;
  uint64_t offset = 0;  // the frame's expected offset and length
  uint64_t length = 0;
  char* dst = nullptr;
  // Called with [from, to) of the payload as it arrives, whole elements only.
  std::function<void(size_t, size_t)> on_data;
  size_t unit = 1;
  // When > 0, the payload is staged through dst[0, window) over and over
  // (cache-resident) and on_data is called for every full window: the data
  // of [from, to) is then at dst + from % window.
  size_t window = 0;
  size_t done = 0;  // bytes of header + payload read
  size_t reported = 0;
  FrameHeader header{};
  bool complete() const { return done == sizeof(FrameHeader) + length; }
};

class Transport {
 public:
  // Makes the abort eventfd; connect() forms the mesh.
  explicit Transport(const TcpOptions& o);
  // Forms the mesh (mesh.h); collective.
  void connect(KvStore& store);

  int rank() const { return o_.rank; }
  int size() const { return o_.size; }
  const std::string& who() const { return who_; }
  bool aborted() const { return aborted_; }
  // Any thread: every wait ends and every socket shuts down.
  void abort();
  // Shuts every socket down, so that the peers fail at once too.
  void shutdown();

  // Starts the next collective: numbers it and sets its deadline.
  void begin();
  uint64_t seq() const { return seq_; }
  TimePoint deadline() const { return deadline_; }

  // The frame of [offset, +length) of `c` for `peer`, read from `data`.
  SendOp send(int peer, const Call& c, uint64_t offset, uint64_t length, const char* data) const;
  // The frame of [offset, +length) due from `peer`, into `dst`.
  static RecvOp recv(int peer, uint64_t offset, uint64_t length, char* dst);

  // Moves every send and receive to completion at once (full duplex, so two
  // ranks sending to each other never wait on each other's buffers).
  void transfer(const Call& c, std::vector<SendOp>& sends, std::vector<RecvOp>& recvs);
  // Writes sends[next, released) in order while reading `recv` (if any) on
  // one thread, until the receive is complete (without one: those sends).
  void pump(const Call& c, std::vector<SendOp>& sends, size_t& next, size_t released, RecvOp* recv);

  // One non-blocking write or read; true when bytes moved. A received header
  // is checked before a byte of its payload reaches the caller's buffer.
  bool step_send(const Call& c, SendOp& s);
  bool step_recv(const Call& c, RecvOp& r);

  // For a waiting loop: pfds[0] is the abort eventfd, a peer's socket is fd().
  int abort_fd() const { return abort_fd_.get(); }
  int fd(int peer) const { return fds_[peer].get(); }
  // Polls for at most `timeout_ms` (net::poll_ms); throws on abort.
  void poll(const Call& c, pollfd* pfds, size_t n, int timeout_ms);
  [[noreturn]] void fail(const Call& c, const std::string& what) const;
  // A timeout or a closed connection: names `peer` as silent (it may itself be
  // blocked on another rank).
  [[noreturn]] void fail_peer(const Call& c, int peer, const std::string& what) const;
  // The deadline passed while `waiting` ("receiving from rank 2"); names `peer`.
  [[noreturn]] void time_out(const Call& c, int peer, const std::string& waiting) const;

 private:
  void check_frame(const Call& c, const RecvOp& r);

  const TcpOptions o_;
  std::string who_;
  std::vector<Fd> fds_;  // by rank; invalid for self
  Fd abort_fd_;
  std::atomic<bool> aborted_{false};
  // Ends the handshake's waits: abort_fd_, aborted_, o_.cancelled.
  net::Interrupt interrupt_;
  uint64_t seq_ = 0;
  TimePoint deadline_{};
};

}  // namespace erun::tcp
