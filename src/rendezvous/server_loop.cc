// ServerLoop, the reading side: the I/O thread's loop, accepting, reading and
// checking frames, the handshake, relay frames, and the timers.
#include "rendezvous/server_loop.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/log.h"
#include "common/net.h"

namespace erun {
namespace {

using wire::Type;
using SteadyClock = std::chrono::steady_clock;
constexpr TimePoint kNever = TimePoint::max();
constexpr uint64_t kWakeId = UINT64_MAX;  // epoll: the eventfd
constexpr size_t kReadChunk = 64 << 10;
// Before authentication a connection holds at most one handshake frame.
constexpr size_t kPreAuthBytes = wire::kHeaderBytes + wire::kMaxHandshakeFrameBytes;
// A connection this young is never closed to make room for a newer one.
constexpr auto kPreAuthMinAge = std::chrono::milliseconds(200);
// A refusal burst ends after this long without one.
constexpr auto kBurstQuiet = std::chrono::seconds(2);
// Queued frames (publish, notify) the I/O thread sends per round of its loop.
constexpr size_t kFlushBatch = 2048;

// Every worker holds one connection: the soft open-file limit goes up to the
// hard one. Returns the limit in force.
rlim_t raise_fd_limit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return 0;
  if (rl.rlim_cur < rl.rlim_max) {
    rlimit want = rl;
    want.rlim_cur = rl.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &want) != 0) {
      ERUN_LOG_WARN("rendezvous: could not raise the open-file limit (RLIMIT_NOFILE) from {} to its hard limit "
                    "{}: {}; the driver can serve at most about {} workers. Raise it with `ulimit -n {}` before "
                    "starting erun",
                    rl.rlim_cur, rl.rlim_max, std::strerror(errno), rl.rlim_cur, rl.rlim_max);
      return rl.rlim_cur;
    }
    return rl.rlim_max;
  }
  return rl.rlim_cur;
}

void watch(int ep, int op, int fd, uint32_t events, uint64_t id) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = id;
  ::epoll_ctl(ep, op, fd, &ev);
}

}  // namespace

ServerLoop::ServerLoop(const ServerOptions& options, std::mutex& mu, Handler& handler)
    : opt_(options),
      mu_(mu),
      handler_(handler),
      job_hash_(handshake::job_hash(opt_.job_id)),
      proofs_(wire::proofs(opt_.secret, opt_.job_id)),
      admission_(opt_.max_unauthenticated, kPreAuthMinAge, kBurstQuiet),
      scratch_(kReadChunk) {}

ServerLoop::~ServerLoop() { stop(); }

void ServerLoop::stop() {
  stop_ = true;
  wake();
  if (io_.joinable()) io_.join();
}

void ServerLoop::wake() {
  if (!wake_fd_) return;
  uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(wake_fd_.get(), &one, sizeof(one));
}

Status ServerLoop::start() {
  fd_limit_ = raise_fd_limit();
  if (Status s = listen(); !s) return s;
  ep_.reset(::epoll_create1(EPOLL_CLOEXEC));
  wake_fd_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!ep_ || !wake_fd_) {
    return Status::error(fmt::format("rendezvous: cannot set up the server's I/O loop (epoll/eventfd): {}; raise the "
                                     "open-file limit (ulimit -n) or free memory, then start the job again",
                                     std::strerror(errno)));
  }
  watch(ep_.get(), EPOLL_CTL_ADD, listen_fd_.get(), EPOLLIN, kListenId);
  watch(ep_.get(), EPOLL_CTL_ADD, wake_fd_.get(), EPOLLIN, kWakeId);
  io_ = std::thread([this] { loop(); });
  ERUN_LOG_DEBUG("rendezvous: listening on {}:{}", opt_.bind_address, bound_port_);
  return Status::ok();
}

Status ServerLoop::listen() {
  auto addrs = net::resolve(opt_.bind_address, std::to_string(opt_.port), /*passive=*/true);
  if (!addrs) {
    return Status::error(fmt::format("rendezvous: cannot resolve the address '{}' to listen on: {}; give an IP "
                                     "address or a name of this host",
                                     opt_.bind_address, addrs.message()));
  }
  std::string last;
  for (const net::Address& a : *addrs) {
    net::Socket s = net::listen(a, 65535, /*reuse_address=*/true);
    if (s.ok()) {
      listen_fd_ = std::move(s.fd);
      break;
    }
    last = s.outcome.text();
  }
  if (!listen_fd_) {
    return Status::error(fmt::format("rendezvous: cannot listen on {}:{}: {}; {}", opt_.bind_address, opt_.port, last,
                                     opt_.port == 0 ? "check that the address belongs to this host and that the "
                                                      "open-file limit (ulimit -n) is not exhausted"
                                                    : "the port is taken or not allowed: choose another"));
  }
  bound_port_ = net::local_address(listen_fd_.get()).port();
  return Status::ok();
}

// ---- the I/O loop -------------------------------------------------------

int ServerLoop::next_timeout_ms() {
  if (!doomed_.empty() || !to_flush_.empty()) return 0;
  TimePoint next = std::min(timers_.empty() ? kNever : timers_.top().when, handler_.next_deadline());
  if (next == kNever) return -1;
  auto left = next - SteadyClock::now();
  if (left <= Duration::zero()) return 0;
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return ms > 60'000 ? 60'000 : static_cast<int>(ms);
}

void ServerLoop::loop() {
  std::vector<epoll_event> events(1024);
  while (!stop_) {
    int timeout;
    {
      std::lock_guard<std::mutex> lock(mu_);
      timeout = next_timeout_ms();
    }
    int n = ::epoll_wait(ep_.get(), events.data(), static_cast<int>(events.size()), timeout);
    if (n < 0 && errno != EINTR) {
      int err = errno;
      std::lock_guard<std::mutex> lock(mu_);
      ERUN_LOG_ERROR("{}: the server's I/O loop stopped: epoll_wait failed: {}; workers can no longer "
                     "join or use the store, and the job will fail: start it again",
                     log_prefix(), std::strerror(err));
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (int i = 0; i < n; ++i) {
      uint64_t id = events[i].data.u64;
      if (id == kListenId) {
        accept_all();
      } else if (id == kWakeId) {
        uint64_t v;
        while (::read(wake_fd_.get(), &v, sizeof(v)) > 0) {
        }
      } else {
        Conn* c = find(id);
        if (c == nullptr || c->doomed) continue;
        if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) on_readable(*c);
        if (!c->doomed && (events[i].events & EPOLLOUT)) flush(*c);
      }
    }
    flush_queued();
    run_timers(SteadyClock::now());
    reap();
  }
}

// Sends up to kFlushBatch of the frames the driver's calls queued.
void ServerLoop::flush_queued() {
  size_t n = std::min(to_flush_.size(), kFlushBatch);
  for (size_t i = to_flush_.size() - n; i < to_flush_.size(); ++i) {
    Conn* c = find(to_flush_[i]);
    if (c != nullptr && !c->doomed) flush(*c);
  }
  to_flush_.resize(to_flush_.size() - n);
}

// ---- accepting ----------------------------------------------------------

void ServerLoop::pause_accepting(Duration d) {
  watch(ep_.get(), EPOLL_CTL_MOD, listen_fd_.get(), 0, kListenId);
  accept_paused_ = true;
  push_timer(SteadyClock::now() + d, kListenId);
}

// Room for one more unauthenticated connection: closes the oldest once it is
// old enough; false (accepting pauses) when every one is still young.
bool ServerLoop::make_room() {
  if (!admission_.full()) return true;
  auto victim = admission_.evictable(SteadyClock::now());
  if (!victim) {
    pause_accepting(std::chrono::milliseconds(20));
    return false;
  }
  Conn* c = find(*victim);
  admission_.done(*victim);
  if (c != nullptr) {
    refuse(*c, fmt::format("over the cap of {} connections that have not authenticated; the oldest is closed first",
                           admission_.cap()));
  }
  return true;
}

void ServerLoop::accept_all() {
  while (true) {
    if (!make_room()) return;
    net::Address addr;
    Fd fd = net::accept(listen_fd_.get(), &addr);
    if (!fd) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        ERUN_LOG_WARN("rendezvous: cannot accept another worker's connection ({} open, open-file limit {}): {}; "
                      "retrying in 100 ms. Workers beyond the limit wait in the kernel's queue and may time out: "
                      "raise the hard limit (ulimit -Hn, LimitNOFILE= for a systemd unit) above the number of "
                      "workers",
                      conns_.size(), fd_limit_, std::strerror(errno));
        pause_accepting(std::chrono::milliseconds(100));
      }
      return;
    }
    net::set_nodelay(fd.get());
    auto c = std::make_unique<Conn>();
    c->id = next_conn_++;
    c->peer = addr.name();
    c->handshake_deadline = SteadyClock::now() + opt_.io_timeout;
    push_timer(c->handshake_deadline, c->id);
    admission_.accepted(c->id, SteadyClock::now());
    watch(ep_.get(), EPOLL_CTL_ADD, fd.get(), EPOLLIN, c->id);
    c->fd = std::move(fd);
    conns_.emplace(c->id, std::move(c));
  }
}

// ---- reading ------------------------------------------------------------

void ServerLoop::on_readable(Conn& c) {
  while (true) {
    // Reads go through one shared buffer; a connection keeps only its
    // unparsed bytes (a few hundred at most before authentication), so
    // 10,000 idle workers do not each hold (and zero) a 64 KiB buffer.
    size_t room = kReadChunk;
    if (c.phase != Phase::kReady) {
      if (c.rlen >= kPreAuthBytes) return refuse(c, "sent more than a handshake frame before authenticating");
      room = kPreAuthBytes - c.rlen;
    }
    ssize_t n = ::recv(c.fd.get(), scratch_.data(), room, 0);
    if (n > 0) {
      if (c.rbuf.size() < c.rlen + static_cast<size_t>(n)) c.rbuf.resize(c.rlen + static_cast<size_t>(n));
      std::memcpy(c.rbuf.data() + c.rlen, scratch_.data(), static_cast<size_t>(n));
      c.rlen += static_cast<size_t>(n);
      // The replies to the frames of one read leave in one send: a relay
      // connection's 8 JOINs and their answers cost one system call each way.
      reading_ = c.id;
      parse(c);
      reading_ = 0;
      if (c.doomed) return;
      flush(c);
      if (c.doomed) return;
      if (static_cast<size_t>(n) < room) break;
      continue;
    }
    if (n == 0) {
      if (c.phase != Phase::kReady) {
        refuse(c, "closed the connection before authenticating");
      } else {
        close_quietly(c, "closed by the peer");
      }
      return;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    close_quietly(c, std::strerror(errno));
    return;
  }
}

void ServerLoop::parse(Conn& c) {
  size_t off = 0;
  while (c.rlen - off >= wire::kHeaderBytes) {
    wire::Header h = wire::decode_header(c.rbuf.data() + off);
    size_t limit =
        c.phase == Phase::kReady ? opt_.max_frame_bytes + wire::kRelayOverhead : wire::kMaxHandshakeFrameBytes;
    if (auto why = wire::check_header(h, job_hash_, limit)) {
      refuse(c, *why);
      return;
    }
    size_t total = wire::kHeaderBytes + h.length;
    if (c.rlen - off < total) {
      if (c.phase == Phase::kReady && c.rbuf.capacity() < off + total) c.rbuf.reserve(off + total);
      break;
    }
    std::string_view payload(c.rbuf.data() + off + wire::kHeaderBytes, h.length);
    off += total;
    handle(c, h, payload);
    if (c.doomed) return;
  }
  if (off > 0) {
    std::memmove(c.rbuf.data(), c.rbuf.data() + off, c.rlen - off);
    c.rlen -= off;
  }
  if (c.rlen == 0) {
    c.frame_deadline = kNever;
    if (c.rbuf.size() > 4 * kReadChunk) std::vector<char>().swap(c.rbuf);
  } else if (c.frame_deadline == kNever) {
    c.frame_deadline = SteadyClock::now() + opt_.io_timeout;
    push_timer(c.frame_deadline, c.id);
  }
}

void ServerLoop::handle(Conn& c, const wire::Header& h, std::string_view payload) {
  if (c.phase != Phase::kReady) return handshake(c, h, payload);
  auto type = static_cast<Type>(h.type);
  if (type == Type::kRelay || type == Type::kRelayClosed) return on_relay(c, type, payload);
  if (c.relay) {
    return refuse(c, fmt::format("{} on an agent's relay connection, which carries only RELAY frames",
                                 wire::type_name(h.type)));
  }
  handler_.on_frame(c.id, h, payload);
}

// HELLO, then AUTH: the server side of the challenge-response.
void ServerLoop::handshake(Conn& c, const wire::Header& h, std::string_view payload) {
  auto type = static_cast<Type>(h.type);
  if (c.phase == Phase::kHello) {
    if (type != Type::kHello || !c.hs.hello(payload, &nonces_)) {
      return refuse(c, fmt::format("expected HELLO, got {} ({} bytes)", wire::type_name(h.type), payload.size()));
    }
    c.phase = Phase::kAuth;
    return send_frame(c, Type::kChallenge, handler_.generation(), h.request_id, c.hs.challenge());
  }
  if (type != Type::kAuth || payload.size() != wire::kMacBytes) {
    return refuse(c, fmt::format("expected AUTH, got {} ({} bytes)", wire::type_name(h.type), payload.size()));
  }
  if (!c.hs.verify(proofs_, payload)) return refuse(c, "authentication failed (wrong job secret)");
  c.phase = Phase::kReady;
  c.handshake_deadline = kNever;
  admission_.done(c.id);
  send_frame(c, Type::kAuthOk, handler_.generation(), h.request_id, c.hs.proof(proofs_));
}

// A frame of an agent's relay connection (docs/protocol.md, "Relaying").
// Its first RELAY frame makes a connection a relay connection; a stream id
// not seen before opens a stream, already authenticated (the agent ran the
// handshake with its worker); ids only grow, so a frame for a stream the
// server closed (RELAY_CLOSED crossing it on the wire) is dropped.
void ServerLoop::on_relay(Conn& c, Type type, std::string_view payload) {
  if (c.parent != 0 || handler_.is_worker(c.id)) {
    return refuse(c, fmt::format("{} on a worker's own connection", wire::type_name(static_cast<uint16_t>(type))));
  }
  if (type == Type::kRelayClosed) {
    auto id = wire::decode_relay_closed(payload);
    if (!id) return refuse(c, fmt::format("malformed RELAY_CLOSED payload ({} bytes)", payload.size()));
    auto it = c.streams.find(*id);
    if (it == c.streams.end()) return;
    Conn& s = *conns_.at(it->second);
    s.closed_by_agent = true;
    return close_quietly(s, "its worker's connection to the agent closed");
  }
  wire::RelayedFrame f;
  if (auto why = wire::decode_relay(payload, job_hash_, opt_.max_frame_bytes, &f)) return refuse(c, *why);
  if (!c.relay) {
    c.relay = true;
    ++relays_;
    ERUN_LOG_DEBUG("{}: agent relay connection from {} opened ({} relay connection(s) open)", log_prefix(), c.peer,
                   relays_.load());
  }
  auto it = c.streams.find(f.stream);
  if (it != c.streams.end()) return handle(*conns_.at(it->second), f.header, f.payload);
  if (f.stream <= c.last_stream) return;  // a stream already closed
  if (c.streams.size() >= wire::kMaxRelayStreams) {
    return refuse(c, fmt::format("opened more than {} streams at once", wire::kMaxRelayStreams));
  }
  handle(open_stream(c, f.stream), f.header, f.payload);
}

ServerLoop::Conn& ServerLoop::open_stream(Conn& relay, uint32_t stream) {
  auto s = std::make_unique<Conn>();
  s->id = next_conn_++;
  s->peer = fmt::format("{} (relayed, stream {})", relay.peer, stream);
  s->phase = Phase::kReady;
  s->parent = relay.id;
  s->stream = stream;
  relay.streams.emplace(stream, s->id);
  relay.last_stream = stream;
  Conn& ref = *s;
  conns_.emplace(s->id, std::move(s));
  return ref;
}

// ---- timers -------------------------------------------------------------

// The loop's timers and the Handler's deadlines that are due, in time order.
void ServerLoop::run_timers(TimePoint now) {
  while (true) {
    TimePoint mine = timers_.empty() ? kNever : timers_.top().when;
    TimePoint theirs = handler_.next_deadline();
    if (std::min(mine, theirs) > now) return;
    if (theirs < mine) {
      handler_.on_deadline(now);
      continue;
    }
    Timer t = timers_.top();
    timers_.pop();
    run_timer(t, now);
  }
}

void ServerLoop::run_timer(const Timer& t, TimePoint now) {
  if (t.conn == kBurstId) {
    if (auto line = admission_.burst_line(now)) {
      ERUN_LOG_WARN("rendezvous: {}; the job is unaffected. If these are not yours, limit who can reach "
                    "port {} (a firewall), or run erun where only the workers can connect",
                    *line, bound_port_);
    }
    if (auto next = admission_.next_burst_check(); next != kNever) push_timer(next, kBurstId);
    return;
  }
  if (t.conn == kListenId) {
    if (accept_paused_) {
      watch(ep_.get(), EPOLL_CTL_MOD, listen_fd_.get(), EPOLLIN, kListenId);
      accept_paused_ = false;
    }
    return;
  }
  Conn* c = find(t.conn);
  if (c == nullptr || c->doomed) return;
  auto secs = seconds(opt_.io_timeout);
  if (c->handshake_deadline <= now) {
    refuse(*c, fmt::format("did not authenticate within {:.1f} s", secs));
  } else if (c->frame_deadline <= now) {
    refuse(*c, fmt::format("sent part of a frame and stalled for {:.1f} s", secs));
  } else if (c->write_deadline <= now) {
    refuse(*c, fmt::format("did not read its replies for {:.1f} s", secs));
  }
}

}  // namespace erun
