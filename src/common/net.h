// Sockets with deadlines, written once for the rendezvous client and server,
// the agent's relay and the tcp transport: resolve, connect, listen, accept,
// send and receive. Free functions over descriptors the caller owns (an Fd);
// safe from any thread on distinct sockets. Every socket made here is
// non-blocking and close-on-exec. Failures are values (Outcome), never
// exceptions; each caller words its own error messages from them.
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "common/fd.h"
#include "common/status.h"

namespace erun::net {

// One socket address (IPv4, IPv6 or unix).
struct Address {
  sockaddr_storage storage{};
  socklen_t length = 0;
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
  int family() const { return storage.ss_family; }
  int port() const;  // 0 for a unix address
  bool is_wildcard() const;  // 0.0.0.0 or ::
  // "1.2.3.4:5", "[::1]:5"; "unknown peer" for another family.
  std::string name() const;
};

// Every TCP address of host:port (getaddrinfo; a numeric port); `passive`
// with an empty host: the wildcard addresses to listen on. The error is
// gai_strerror()'s text.
Result<std::vector<Address>> resolve(const std::string& host, const std::string& port, bool passive = false);

// What may end a wait before its deadline: `fd` readable (an abort eventfd),
// `*flag` set (checked after each poll), `cancelled()` true (checked before
// each poll). With a flag or cancelled() a poll lasts at most 50 ms. Any
// member may be unset.
struct Interrupt {
  int fd = -1;
  const std::atomic<bool>* flag = nullptr;
  std::function<bool()> cancelled;
};

// How an operation ended. kError carries the failing call's errno.
struct Outcome {
  enum End { kOk, kTimedOut, kAborted, kCancelled, kClosed, kError };
  End end = kOk;
  int error = 0;
  std::string_view call;  // with kError: "socket", "bind", "listen", "connect", "poll", "send", "recv"
  bool ok() const { return end == kOk; }
  // "timed out", "aborted", "cancelled", "connection closed", or strerror(error).
  std::string text() const;
  static Outcome failed(std::string_view call, int error) { return {kError, error, call}; }
};

// A new socket, or why there is none.
struct Socket {
  Fd fd;
  Outcome outcome;
  bool ok() const { return outcome.ok(); }
};

// Milliseconds to poll until `deadline`, at most `cap`; 0 once it passed.
int poll_ms(TimePoint deadline, Duration cap);
// Waits until fd has one of `events` (or an error), the deadline, or the interrupt.
Outcome wait_fd(int fd, short events, TimePoint deadline, const Interrupt* interrupt = nullptr);
// Writes all of data (MSG_NOSIGNAL) before the deadline.
Outcome send_all(int fd, std::string_view data, TimePoint deadline, const Interrupt* interrupt = nullptr);
// Reads exactly n bytes before the deadline; kClosed when the peer closed first.
Outcome recv_exact(int fd, char* out, size_t n, TimePoint deadline, const Interrupt* interrupt = nullptr);

// Starts connecting to `a` without waiting (TCP_NODELAY set for TCP): the
// socket, connecting or connected; call connect_error() once it is writable.
Socket start_connect(const Address& a);
// The outcome of a started connect once its socket polled writable: 0 or its errno.
int connect_error(int fd);
// Connects to `a` before the deadline and the interrupt.
Socket connect(const Address& a, TimePoint deadline, const Interrupt* interrupt = nullptr);
// The address of a unix-domain socket at `path`; false when the path is empty
// or too long for one.
bool unix_address(const std::string& path, Address* out);
// Connects to a unix-domain stream socket; a full backlog (EAGAIN) is retried
// until the deadline.
Socket connect_unix(const Address& a, TimePoint deadline);

// Binds `a` (with SO_REUSEADDR when asked) and listens.
Socket listen(const Address& a, int backlog, bool reuse_address = false);
// One pending connection (non-blocking, close-on-exec), or an invalid Fd with
// errno set (EAGAIN when none is waiting); `peer` gets its address.
Fd accept(int listen_fd, Address* peer = nullptr);
// The address a socket is bound to.
Address local_address(int fd);

Status set_nonblocking(int fd);
void set_nodelay(int fd);

// A write to a peer that is gone must be an error (EPIPE), not the end of
// the process: ignores SIGPIPE unless the program handles or ignores it
// already. For what writes without MSG_NOSIGNAL (Gloo's TCP transport).
void ignore_sigpipe_unless_handled();

}  // namespace erun::net
