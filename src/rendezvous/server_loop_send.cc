// ServerLoop, the writing side: the Outbox, write buffers and their flushing,
// refusing and closing connections, and reaping them at the end of a batch.
#include <sys/epoll.h>
#include <sys/socket.h>

#include <malloc.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/log.h"
#include "rendezvous/server_loop.h"

namespace erun {
namespace {

using wire::Type;
using SteadyClock = std::chrono::steady_clock;
constexpr TimePoint kNever = TimePoint::max();

}  // namespace

// ---- the Outbox -----------------------------------------------------------

void ServerLoop::send(ConnId conn, Type type, int64_t generation, uint32_t request_id, std::string_view payload) {
  if (Conn* c = find(conn)) send_frame(*c, type, generation, request_id, payload);
}

void ServerLoop::close(ConnId conn, const std::string& reason) {
  if (Conn* c = find(conn)) close_quietly(*c, reason);
}

bool ServerLoop::peer_closed(ConnId conn) {
  Conn* c = find(conn);
  if (c == nullptr || c->doomed) return true;
  if (c->parent != 0) return false;  // a relayed worker is live until its agent says RELAY_CLOSED
  char b;
  ssize_t n = ::recv(c->fd.get(), &b, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

void ServerLoop::refuse(ConnId conn, const std::string& reason) {
  if (Conn* c = find(conn)) refuse(*c, reason);
}

const std::string& ServerLoop::peer(ConnId conn) const {
  static const std::string kNone;
  Conn* c = find(conn);
  return c != nullptr ? c->peer : kNone;
}

ServerLoop::Conn* ServerLoop::find(ConnId id) const {
  auto it = conns_.find(id);
  return it == conns_.end() ? nullptr : it->second.get();
}

// The relay connection of a stream; nullptr once it is closing.
ServerLoop::Conn* ServerLoop::parent_of(const Conn& c) const {
  Conn* p = find(c.parent);
  return p == nullptr || p->doomed ? nullptr : p;
}

// ---- sending --------------------------------------------------------------

// A frame to a stream goes into a RELAY frame on its agent's connection.
void ServerLoop::send_frame(Conn& c, Type type, int64_t generation, uint32_t request_id, std::string_view payload) {
  if (c.doomed) return;
  std::string f = wire::encode_frame(type, job_hash_, generation, request_id, payload);
  if (c.parent == 0) return send_bytes(c, f);
  if (Conn* p = parent_of(c)) send_bytes(*p, wire::encode_relay(job_hash_, c.stream, f));
}

void ServerLoop::send_bytes(Conn& c, std::string_view frame) {
  if (c.doomed) return;
  if (c.id == reading_) {  // sent once the frames of this read are handled
    c.wbuf += frame;
    return;
  }
  if (queue_sends_) {
    if (c.wbuf.size() == c.woff) to_flush_.push_back(c.id);  // not queued yet, nor waiting for EPOLLOUT
    c.wbuf += frame;
    return;
  }
  c.wbuf += frame;
  flush(c);
}

void ServerLoop::flush(Conn& c) {
  if (c.parent != 0) return;  // a stream's frames sit in its relay connection's buffer
  while (c.woff < c.wbuf.size()) {
    ssize_t n = ::send(c.fd.get(), c.wbuf.data() + c.woff, c.wbuf.size() - c.woff, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      c.woff += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    close_quietly(c, fmt::format("send failed: {}", std::strerror(errno)));
    return;
  }
  if (c.woff == c.wbuf.size()) {
    c.wbuf.clear();
    c.woff = 0;
    c.write_deadline = kNever;
    watch_output(c, false);
    return;
  }
  // An agent's connection carries the replies of its host's workers: it
  // may hold that much for each of up to 16 of them before it is refused.
  const size_t readers = std::clamp<size_t>(c.streams.size(), 1, 16);
  if (c.wbuf.size() - c.woff > readers * (2 * opt_.max_frame_bytes + (1 << 20))) {
    return refuse(c, fmt::format("did not read its replies ({} bytes queued)", c.wbuf.size() - c.woff));
  }
  watch_output(c, true);
  if (c.write_deadline == kNever) {
    c.write_deadline = SteadyClock::now() + opt_.io_timeout;
    push_timer(c.write_deadline, c.id);
  }
}

// Asks epoll for EPOLLOUT while a connection has bytes it could not send.
void ServerLoop::watch_output(Conn& c, bool on) {
  if (c.want_out == on) return;
  epoll_event ev{};
  ev.events = on ? EPOLLIN | EPOLLOUT : EPOLLIN;
  ev.data.u64 = c.id;
  ::epoll_ctl(ep_.get(), EPOLL_CTL_MOD, c.fd.get(), &ev);
  c.want_out = on;
}

// ---- refusing and closing -------------------------------------------------

// A protocol violation: log with the peer and reason, count, tell the peer
// (best effort, one non-blocking send), and drop the connection. Safe to
// call from within flush(): the connection is only closed by reap().
void ServerLoop::refuse(Conn& c, const std::string& reason) {
  if (c.doomed) return;
  if (c.id == reading_) {  // the replies before the bad frame go first
    reading_ = 0;
    flush(c);
    if (c.doomed) return;
  }
  ++refused_;
  if (c.relay || c.parent != 0) return refuse_relayed(c, reason);
  if (admission_.refused(SteadyClock::now(), fmt::format("from {}: {}", c.peer, reason))) {
    ERUN_LOG_WARN("rendezvous: dropped connection from {}: {} (not a worker of this job; further drops in this "
                  "burst are counted, not logged)",
                  c.peer, reason);
    push_timer(admission_.next_burst_check(), kBurstId);
  }
  send_refusal(c, reason);
  doom(c, {});
}

// An agent's relay connection, or a stream of one. The agent authenticated:
// not a flood, so every one is logged.
void ServerLoop::refuse_relayed(Conn& c, const std::string& reason) {
  ERUN_LOG_WARN("{}: dropped {} from {}: {}{}", log_prefix(),
                c.relay ? "the agent relay connection" : "the relayed connection", c.peer, reason,
                c.relay ? fmt::format(" ({} relayed worker connection(s) close with it)", c.streams.size()) : "");
  if (c.parent != 0) {
    send_frame(c, Type::kError, handler_.generation(), 0, wire::encode_str("refused: " + reason));
  } else {
    send_refusal(c, reason);
  }
  doom(c, {});
}

// ERROR "refused: ..." in one non-blocking send, never in the middle of a
// half-sent frame.
void ServerLoop::send_refusal(Conn& c, const std::string& reason) {
  if (c.woff != c.wbuf.size()) return;
  std::string f =
      wire::encode_frame(Type::kError, job_hash_, handler_.generation(), 0, wire::encode_str("refused: " + reason));
  [[maybe_unused]] auto n = ::send(c.fd.get(), f.data(), f.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

void ServerLoop::close_quietly(Conn& c, const std::string& reason) {
  if (c.doomed) return;
  doom(c, reason);
}

void ServerLoop::doom(Conn& c, std::string_view why) {
  c.doomed = true;
  doomed_.push_back(c.id);
  handler_.on_closing(c.id, why);
  if (c.parent != 0) {
    // The agent closes its worker's socket on RELAY_CLOSED.
    if (Conn* p = parent_of(c)) {
      p->streams.erase(c.stream);
      if (!c.closed_by_agent) send_bytes(*p, wire::encode_relay_closed(job_hash_, c.stream));
    }
  }
  if (c.relay) close_streams(c);
}

// Every worker a relay connection carried is disconnected, as if each had
// its own socket.
void ServerLoop::close_streams(Conn& relay) {
  std::vector<ConnId> ids;
  ids.reserve(relay.streams.size());
  for (auto& [sid, id] : relay.streams) ids.push_back(id);
  relay.streams.clear();
  for (ConnId id : ids) {
    Conn& s = *conns_.at(id);
    s.closed_by_agent = true;
    close_quietly(s, fmt::format("the agent relay connection from {} closed", relay.peer));
  }
  --relays_;
  ERUN_LOG_DEBUG("{}: agent relay connection from {} closed with {} relayed worker connection(s) ({} relay "
                 "connection(s) open)",
                 log_prefix(), relay.peer, ids.size(), relays_.load());
}

void ServerLoop::reap() {
  for (ConnId id : doomed_) {
    auto it = conns_.find(id);
    if (it == conns_.end()) continue;
    it->second->fd.reset();  // also leaves the epoll set
    handler_.on_closed(id);
    admission_.done(id);
    conns_.erase(it);
    ++closed_since_trim_;
  }
  doomed_.clear();
  // After a burst of closed connections give the memory back to the system
  // (glibc keeps freed small blocks in its arenas otherwise). Each trim
  // walks the heap: when 100,000 workers leave at once it runs after every
  // quarter of those still open has gone (a few dozen trims), not every 256.
  if (closed_since_trim_ >= std::max<size_t>(256, conns_.size() / 4) && admission_.unauthenticated() == 0) {
    closed_since_trim_ = 0;
    ::malloc_trim(0);
  }
}

}  // namespace erun
