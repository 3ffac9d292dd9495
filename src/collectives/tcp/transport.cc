#include "collectives/tcp/transport.h"

#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "collectives/tcp/mesh.h"
#include "common/log.h"

namespace erun::tcp {

using namespace std::chrono_literals;

Transport::Transport(const TcpOptions& o) : o_(o), who_(erun::who(o.generation, o.address, o.rank)), fds_(o.size) {
  abort_fd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!abort_fd_) throw CommError(fmt::format("erun tcp: eventfd: {}", std::strerror(errno)));
  interrupt_ = {abort_fd_.get(), &aborted_, o_.cancelled};
}

void Transport::connect(KvStore& store) { fds_ = form_mesh(store, o_, who_, interrupt_); }

void Transport::abort() {
  aborted_ = true;
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(abort_fd_.get(), &one, sizeof(one));
  shutdown();
}

void Transport::shutdown() {
  for (const Fd& fd : fds_) {
    if (fd) ::shutdown(fd.get(), SHUT_RDWR);
  }
}

void Transport::begin() {
  ++seq_;
  deadline_ = std::chrono::steady_clock::now() + o_.timeout;
}

SendOp Transport::send(int peer, const Call& c, uint64_t offset, uint64_t length, const char* data) const {
  SendOp s;
  s.peer = peer;
  s.header = frame_header(c, o_.generation, rank(), seq_, offset, length);
  s.data = data;
  return s;
}

RecvOp Transport::recv(int peer, uint64_t offset, uint64_t length, char* dst) {
  RecvOp r;
  r.peer = peer;
  r.offset = offset;
  r.length = length;
  r.dst = dst;
  return r;
}

void Transport::fail(const Call& c, const std::string& what) const {
  throw CommError(fmt::format("erun tcp: {}: {} (collective #{}): {}", who_, op_name(c.op), seq_, what));
}

void Transport::fail_peer(const Call& c, int peer, const std::string& what) const {
  throw CommError(fmt::format("erun tcp: {}: {} (collective #{}): {}", who_, op_name(c.op), seq_, what), peer,
                  PeerFate::kSilent);
}

void Transport::time_out(const Call& c, int peer, const std::string& waiting) const {
  fail_peer(c, peer, fmt::format("timed out after {:.1f} s {} (is that rank alive, or stopped?)", seconds(o_.timeout), waiting));
}

void Transport::poll(const Call& c, pollfd* pfds, size_t n, int timeout_ms) {
  int got = ::poll(pfds, n, timeout_ms);
  if (got < 0 && errno != EINTR) fail(c, fmt::format("poll: {}", std::strerror(errno)));
  if (aborted_ || (pfds[0].revents & POLLIN)) fail(c, "aborted");
}

// Why a received header is refused, checked before a byte of its payload
// is read into the caller's buffer.
void Transport::check_frame(const Call& c, const RecvOp& r) {
  const FrameHeader& h = r.header;
  const int p = r.peer;
  if (!intact(h)) {
    fail(c, fmt::format("corrupted frame header from rank {} (magic {:#x}, version {}, check {:#x}); the stream "
                        "from that rank is not trustworthy", p, h.magic, h.version, h.check));
  }
  if (h.generation != static_cast<uint32_t>(o_.generation) || h.from != p) {
    fail(c, fmt::format("frame from rank {} claims generation {} rank {}; this connection is generation {} rank {}", p,
                        h.generation, h.from, o_.generation, p));
  }
  if (h.seq != seq_ || h.op != static_cast<uint8_t>(c.op) || h.dtype != c.dtype || h.reduce != c.reduce ||
      h.count != c.count || h.root != c.root) {
    fail(c, fmt::format("collective mismatch: rank {} called #{} {} but rank {} called #{} {}; every rank must call "
                        "the same collectives with the same arguments in the same order",
                        rank(), seq_, describe(c), p, h.seq, describe(h)));
  }
  if (h.offset != r.offset || h.length != r.length) {
    fail(c, fmt::format("rank {} sent [{}, +{}) of {} where [{}, +{}) was due; the ranks disagree on the algorithm "
                        "(different erun versions?)", p, h.offset, h.length, describe(c), r.offset, r.length));
  }
}

void Transport::transfer(const Call& c, std::vector<SendOp>& sends, std::vector<RecvOp>& recvs) {
  size_t left = sends.size() + recvs.size();
  std::vector<pollfd> pfds;
  std::vector<int> which;  // >= 0: sends[i], < 0: recvs[-i-1]
  while (left > 0) {
    bool progressed = false;
    for (auto& s : sends) {
      if (s.complete()) continue;
      if (step_send(c, s)) progressed = true;
      if (s.complete()) --left;
    }
    for (auto& r : recvs) {
      if (r.complete()) continue;
      if (step_recv(c, r)) progressed = true;
      if (r.complete()) --left;
    }
    if (left == 0) break;
    if (progressed) continue;
    pfds.clear();
    which.clear();
    pfds.push_back({abort_fd_.get(), POLLIN, 0});
    which.push_back(0);
    for (size_t i = 0; i < sends.size(); ++i) {
      if (!sends[i].complete()) {
        pfds.push_back({fd(sends[i].peer), POLLOUT, 0});
        which.push_back(static_cast<int>(i));
      }
    }
    for (size_t i = 0; i < recvs.size(); ++i) {
      if (!recvs[i].complete()) {
        pfds.push_back({fd(recvs[i].peer), POLLIN, 0});
        which.push_back(-static_cast<int>(i) - 1);
      }
    }
    int timeout = net::poll_ms(deadline_, 1h);
    if (timeout == 0) {
      std::string waiting;
      int named = -1, named_recv = -1;  // the first peer this rank waits to receive from, else to send to
      for (size_t i = 1; i < pfds.size(); ++i) {
        int peer = which[i] >= 0 ? sends[which[i]].peer : recvs[-which[i] - 1].peer;
        if (named < 0) named = peer;
        if (named_recv < 0 && which[i] < 0) named_recv = peer;
        waiting += fmt::format("{}{} rank {}", waiting.empty() ? "" : ", ", which[i] >= 0 ? "sending to" : "receiving from", peer);
      }
      time_out(c, named_recv >= 0 ? named_recv : named, waiting);
    }
    poll(c, pfds.data(), pfds.size(), timeout);
  }
}

void Transport::pump(const Call& c, std::vector<SendOp>& sends, size_t& next, size_t released, RecvOp* recv) {
  auto recv_done = [&] { return !recv || recv->complete(); };
  while (!recv_done() || (!recv && next < released)) {
    bool progressed = false;
    while (next < released) {
      SendOp& s = sends[next];
      const bool moved = step_send(c, s);
      progressed |= moved;
      if (s.complete()) {
        ++next;
      } else if (!moved) {
        break;
      }
    }
    if (recv && !recv_done() && step_recv(c, *recv)) progressed = true;
    if (progressed) continue;
    pollfd pfds[3] = {{abort_fd_.get(), POLLIN, 0}, {-1, 0, 0}, {-1, 0, 0}};
    if (next < released) pfds[1] = {fd(sends[next].peer), POLLOUT, 0};
    if (recv) pfds[2] = {fd(recv->peer), POLLIN, 0};
    int timeout = net::poll_ms(deadline_, 1h);
    if (timeout == 0) {
      std::string waiting;
      if (next < released) waiting = fmt::format("sending to rank {}", sends[next].peer);
      if (recv) waiting += fmt::format("{}receiving from rank {}", waiting.empty() ? "" : ", ", recv->peer);
      time_out(c, recv ? recv->peer : sends[next].peer, waiting);
    }
    poll(c, pfds, 3, timeout);
  }
}

bool Transport::step_send(const Call& c, SendOp& s) {
  iovec iov[2];
  int n_iov = 0;
  constexpr size_t hb = sizeof(FrameHeader);
  if (s.done < hb) iov[n_iov++] = {reinterpret_cast<char*>(&s.header) + s.done, hb - s.done};
  const size_t payload_done = s.done > hb ? s.done - hb : 0;
  if (payload_done < s.header.length) iov[n_iov++] = {const_cast<char*>(s.data) + payload_done, s.header.length - payload_done};
  msghdr m{};
  m.msg_iov = iov;
  m.msg_iovlen = n_iov;
  ssize_t n = ::sendmsg(fd(s.peer), &m, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n > 0) {
    s.done += static_cast<size_t>(n);
    return true;
  }
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return false;
  if (aborted_) fail(c, "aborted");
  fail_peer(c, s.peer, fmt::format("sending to rank {} failed: {} (it exited or failed)", s.peer, n < 0 ? std::strerror(errno) : "closed"));
}

bool Transport::step_recv(const Call& c, RecvOp& r) {
  constexpr size_t hb = sizeof(FrameHeader);
  char* ptr;
  size_t want;
  if (r.done < hb) {
    ptr = reinterpret_cast<char*>(&r.header) + r.done;
    want = hb - r.done;
  } else if (r.window) {
    const size_t got = r.done - hb;
    ptr = r.dst + got % r.window;
    want = std::min(r.length - got, r.window - got % r.window);
  } else {
    ptr = r.dst + (r.done - hb);
    want = r.length - (r.done - hb);
  }
  ssize_t n = ::recv(fd(r.peer), ptr, want, MSG_DONTWAIT);
  if (n > 0) {
    const bool had_header = r.done >= hb;
    r.done += static_cast<size_t>(n);
    if (!had_header && r.done >= hb) check_frame(c, r);
    if (r.done > hb && r.on_data) {
      const size_t got = r.done - hb;
      const size_t whole = got - got % r.unit;
      const bool window_full = r.window && whole > r.reported && whole % r.window == 0;
      if (whole == r.length || window_full || (!r.window && whole - r.reported >= kReduceSegment)) {
        r.on_data(r.reported, whole);
        r.reported = whole;
      }
    }
    return true;
  }
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return false;
  if (aborted_) fail(c, "aborted");
  fail_peer(c, r.peer, fmt::format("receiving from rank {} failed: {} (it exited, failed or aborted)", r.peer,
                                   n < 0 ? std::strerror(errno) : "connection closed"));
}

}  // namespace erun::tcp
