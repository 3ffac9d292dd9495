// RendezvousServer: one I/O thread runs an epoll loop over the listening
// socket, an eventfd (wake-ups from the driver's thread) and every client
// socket, all non-blocking with per-connection buffers. All state sits under
// one mutex, held by the I/O thread while it handles a batch of events and by
// the driver's calls; sockets are only closed by the I/O thread.
//
// Scale (aimed at 100,000 connections; docs/performance.md section 9 measures
// up to 19,700): no per-join work over all connections or members. Who waits
// and who is a member of the current generation are kept as slot-ordered
// indexes, updated as joins, assignments and closes happen; snapshot() copies
// lists rebuilt only when they changed. publish() and the pushes to members
// (HOSTS_UPDATED, PEERS_LOST) queue their frames and return; the I/O thread
// sends them in batches, giving the mutex back between batches.
// Authentication uses the secret's precomputed HMAC pads and nonces from a
// pooled CSPRNG draw.
//
// Relaying (docs/protocol.md): an agent's connection carries its host's
// workers as streams; each stream is a Conn without a socket (fd -1, parent
// set) that goes through the same code as a direct connection, and whatever
// is sent to it is wrapped in a RELAY frame in its parent's write buffer.
// Closing the parent closes its streams; a stream's close is told to the
// agent with RELAY_CLOSED.
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <malloc.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <queue>
#include <set>
#include <thread>
#include <unordered_map>

#include "common/fd.h"
#include "common/handshake.h"
#include "common/log.h"
#include "common/net.h"
#include "rendezvous/admission.h"
#include "rendezvous/rendezvous.h"
#include "rendezvous/wire.h"

namespace erun {
namespace {

using wire::Type;
using SteadyClock = std::chrono::steady_clock;
constexpr TimePoint kNever = TimePoint::max();
constexpr uint64_t kListenId = 0;
constexpr uint64_t kWakeId = UINT64_MAX;
constexpr uint64_t kBurstId = UINT64_MAX - 1;  // timer: the refusal burst's log line
constexpr size_t kReadChunk = 64 << 10;
// Before authentication a connection holds at most one handshake frame.
constexpr size_t kPreAuthBytes = wire::kHeaderBytes + wire::kMaxHandshakeFrameBytes;
// A connection this young is never closed to make room for a newer one.
constexpr auto kPreAuthMinAge = std::chrono::milliseconds(200);
// A refusal burst ends after this long without one.
constexpr auto kBurstQuiet = std::chrono::seconds(2);
constexpr auto kMaxGetWait = std::chrono::hours(24);
// Re-joins kept for the driver between two snapshots; older ones are dropped
// (with a warning) when a driver stops asking.
constexpr size_t kMaxRejoins = 8192;
// Queued frames (publish, notify) the I/O thread sends per round of its loop.
constexpr size_t kFlushBatch = 2048;

enum class Phase { kHello, kAuth, kReady };

struct Conn {
  uint64_t id = 0;
  Fd fd;  // invalid for a relayed stream
  std::string peer;
  Phase phase = Phase::kHello;
  handshake::Responder hs;

  std::vector<char> rbuf;
  size_t rlen = 0;
  std::string wbuf;
  size_t woff = 0;
  bool want_out = false;

  TimePoint handshake_deadline = kNever;
  TimePoint frame_deadline = kNever;
  TimePoint write_deadline = kNever;

  bool joined = false;  // sent a JOIN at least once
  JoinRequest join;
  bool join_pending = false;
  uint32_t join_request_id = 0;
  int64_t join_after_gen = -1;
  int64_t member_gen = -1;
  std::vector<uint64_t> gets;  // pending KV_GET ids

  bool doomed = false;

  // Relaying: an agent's connection carries its host's workers as streams,
  // each a Conn of its own (fd -1) handled like a direct connection.
  bool relay = false;                              // this is an agent's relay connection
  std::unordered_map<uint32_t, uint64_t> streams;  // relay: stream id -> its Conn
  uint32_t last_stream = 0;                        // relay: the newest stream id (ids only grow)
  uint64_t parent = 0;                             // a stream: its relay connection's id
  uint32_t stream = 0;                             // a stream: its id there
  bool closed_by_agent = false;                    // a stream: the agent closed it (no RELAY_CLOSED back)
};

struct PendingGet {
  uint64_t conn = 0;
  uint32_t request_id = 0;
  std::string key;
  TimePoint deadline;
  Duration waited;
};

struct Timer {
  TimePoint when;
  uint64_t conn;  // kListenId: resume accepting
  uint64_t get;   // 0: a connection deadline
  bool operator>(const Timer& o) const { return when > o.when; }
};

std::string slot_name(const SlotKey& s) { return fmt::format("{}:{}", s.host, s.local_index); }

struct SlotHash {
  size_t operator()(const SlotKey& s) const {
    return std::hash<std::string>{}(s.host) * 31 + static_cast<size_t>(s.local_index);
  }
};

// An index entry: the connection listed for a slot and its JOIN, kept here so
// that rebuilding a list touches the index alone, not 100,000 connections.
struct Listed {
  uint64_t conn = 0;
  JoinRequest join;
};
using SlotIndex = std::map<SlotKey, Listed>;

// The lists snapshot() hands out, shared with the snapshots (a snapshot
// costs a reference count). A list is patched in place with the slots that
// changed since it was built: from the first changed position on, a lookup
// per changed slot; joins that come in slot order touch only its end. It is
// copied first only when a snapshot still holds it, and rebuilt from the
// whole index only after publish() or when most of it changed.
struct CachedList {
  std::shared_ptr<std::vector<JoinRequest>> list = std::make_shared<std::vector<JoinRequest>>();  // slot order
  bool dirty = true;              // rebuild from the whole index
  std::vector<SlotKey> touched;   // slots put or taken out since `list` was built

  void touch(const SlotKey& slot) {
    if (dirty) return;
    // A driver that stops asking (restart mode) does not grow this forever.
    if (touched.size() >= std::max<size_t>(1024, list->size())) {
      dirty = true;
      std::vector<SlotKey>().swap(touched);
      return;
    }
    touched.push_back(slot);
  }
};

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

}  // namespace

struct RendezvousServer::Impl {
  explicit Impl(ServerOptions o)
      : opt(std::move(o)),
        job_hash(handshake::job_hash(opt.job_id)),
        proofs(wire::proofs(opt.secret, opt.job_id)),
        admission(opt.max_unauthenticated, kPreAuthMinAge, kBurstQuiet) {}

  ServerOptions opt;
  uint64_t job_hash;
  handshake::Proofs proofs;
  handshake::NoncePool nonces;  // server nonces, drawn 128 at a time
  rlim_t fd_limit = 0;
  Fd listen_fd, ep, wake_fd;
  int bound_port = 0;
  std::thread io;
  std::atomic<bool> stop{false};
  std::atomic<long> refused{0};
  std::atomic<long> relays{0};  // open relay connections
  uint64_t reading = 0;         // the connection whose frames are being handled (its replies wait)

  mutable std::mutex mu;
  std::unordered_map<uint64_t, std::unique_ptr<Conn>> conns;
  uint64_t next_conn = 1, next_get = 1;
  std::vector<uint64_t> doomed;
  std::priority_queue<Timer, std::vector<Timer>, std::greater<Timer>> timers;
  bool accept_paused = false;
  Admission admission;
  size_t closed_since_trim = 0;
  std::vector<char> scratch = std::vector<char>(kReadChunk);  // the I/O thread's read buffer

  SlotIndex waiting;                       // slot -> conn blocked in join
  SlotIndex members;                       // slot -> conn assigned in the current generation
  CachedList waiting_list, member_list;    // what snapshot() copies
  std::unordered_map<SlotKey, uint64_t, SlotHash> slot_owner;  // slot -> latest conn that joined for it
  std::set<SlotKey> disconnected;          // since the last snapshot
  std::vector<JoinRequest> rejoined;       // since the last snapshot, at most kMaxRejoins

  int64_t gen = -1;
  std::unordered_map<SlotKey, RankAssignment, SlotHash> assignments;
  // Connections with frames queued by the driver's calls, for the I/O thread
  // to send (publish() of 100,000 assignments returns without 100,000 sends).
  bool queue_sends = false;
  std::vector<uint64_t> to_flush;
  std::unordered_map<std::string, std::vector<char>> kv;
  std::unordered_map<std::string, std::vector<uint64_t>> waiters;  // key -> get ids
  std::unordered_map<uint64_t, PendingGet> gets;

  ~Impl() {
    stop = true;
    wake();
    if (io.joinable()) io.join();
  }

  // "rendezvous (gen 3)" for the server's log lines ("rendezvous" before the first generation).
  std::string log_prefix() const { return gen >= 0 ? fmt::format("rendezvous ({})", who(gen)) : "rendezvous"; }

  void wake() {
    if (!wake_fd) return;
    uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wake_fd.get(), &one, sizeof(one));
  }

  Status start() {
    fd_limit = raise_fd_limit();
    auto addrs = net::resolve(opt.bind_address, std::to_string(opt.port), /*passive=*/true);
    if (!addrs) {
      return Status::error(fmt::format("rendezvous: cannot resolve the address '{}' to listen on: {}; give an IP "
                                       "address or a name of this host",
                                       opt.bind_address, addrs.message()));
    }
    std::string last;
    for (const net::Address& a : *addrs) {
      net::Socket s = net::listen(a, 65535, /*reuse_address=*/true);
      if (s.ok()) {
        listen_fd = std::move(s.fd);
        break;
      }
      last = s.outcome.text();
    }
    if (!listen_fd) {
      return Status::error(fmt::format("rendezvous: cannot listen on {}:{}: {}; {}", opt.bind_address, opt.port, last,
                                       opt.port == 0 ? "check that the address belongs to this host and that the "
                                                       "open-file limit (ulimit -n) is not exhausted"
                                                     : "the port is taken or not allowed: choose another"));
    }
    bound_port = net::local_address(listen_fd.get()).port();
    ep.reset(::epoll_create1(EPOLL_CLOEXEC));
    wake_fd.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (!ep || !wake_fd) {
      return Status::error(fmt::format("rendezvous: cannot set up the server's I/O loop (epoll/eventfd): {}; raise the "
                                       "open-file limit (ulimit -n) or free memory, then start the job again",
                                       std::strerror(errno)));
    }
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kListenId;
    ::epoll_ctl(ep.get(), EPOLL_CTL_ADD, listen_fd.get(), &ev);
    ev.data.u64 = kWakeId;
    ::epoll_ctl(ep.get(), EPOLL_CTL_ADD, wake_fd.get(), &ev);
    io = std::thread([this] { loop(); });
    ERUN_LOG_DEBUG("rendezvous: listening on {}:{}", opt.bind_address, bound_port);
    return Status::ok();
  }

  // ---- the I/O loop -------------------------------------------------------

  int next_timeout_ms() const {
    if (!doomed.empty() || !to_flush.empty()) return 0;
    if (timers.empty()) return -1;
    auto left = timers.top().when - SteadyClock::now();
    if (left <= Duration::zero()) return 0;
    auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
    return ms > 60'000 ? 60'000 : static_cast<int>(ms);
  }

  void loop() {
    std::vector<epoll_event> events(1024);
    while (!stop) {
      int timeout;
      {
        std::lock_guard<std::mutex> lock(mu);
        timeout = next_timeout_ms();
      }
      int n = ::epoll_wait(ep.get(), events.data(), static_cast<int>(events.size()), timeout);
      if (n < 0 && errno != EINTR) {
        ERUN_LOG_ERROR("{}: the server's I/O loop stopped: epoll_wait failed: {}; workers can no longer "
                       "join or use the store, and the job will fail: start it again",
                       log_prefix(), std::strerror(errno));
        return;
      }
      std::lock_guard<std::mutex> lock(mu);
      for (int i = 0; i < n; ++i) {
        uint64_t id = events[i].data.u64;
        if (id == kListenId) {
          accept_all();
        } else if (id == kWakeId) {
          uint64_t v;
          while (::read(wake_fd.get(), &v, sizeof(v)) > 0) {
          }
        } else {
          auto it = conns.find(id);
          if (it == conns.end() || it->second->doomed) continue;
          Conn& c = *it->second;
          if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) on_readable(c);
          if (!c.doomed && (events[i].events & EPOLLOUT)) flush(c);
        }
      }
      flush_queued();
      run_timers(SteadyClock::now());
      reap();
    }
  }

  // Sends up to kFlushBatch of the frames the driver's calls queued.
  void flush_queued() {
    size_t n = std::min(to_flush.size(), kFlushBatch);
    for (size_t i = to_flush.size() - n; i < to_flush.size(); ++i) {
      auto it = conns.find(to_flush[i]);
      if (it != conns.end() && !it->second->doomed) flush(*it->second);
    }
    to_flush.resize(to_flush.size() - n);
  }

  void push_timer(TimePoint when, uint64_t conn, uint64_t get) { timers.push({when, conn, get}); }

  void pause_accepting(Duration d) {
    epoll_event ev{};
    ev.data.u64 = kListenId;
    ::epoll_ctl(ep.get(), EPOLL_CTL_MOD, listen_fd.get(), &ev);
    accept_paused = true;
    push_timer(SteadyClock::now() + d, kListenId, 0);
  }

  // Room for one more unauthenticated connection: closes the oldest once it is
  // old enough; false (accepting pauses) when every one is still young.
  bool make_room() {
    if (!admission.full()) return true;
    auto now = SteadyClock::now();
    auto victim = admission.evictable(now);
    if (!victim) {
      pause_accepting(std::chrono::milliseconds(20));
      return false;
    }
    auto it = conns.find(*victim);
    admission.done(*victim);
    if (it != conns.end()) {
      refuse(*it->second, fmt::format("over the cap of {} connections that have not authenticated; the oldest "
                                      "is closed first",
                                      admission.cap()));
    }
    return true;
  }

  void accept_all() {
    while (true) {
      if (!make_room()) return;
      net::Address addr;
      Fd fd = net::accept(listen_fd.get(), &addr);
      if (!fd) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          ERUN_LOG_WARN("rendezvous: cannot accept another worker's connection ({} open, open-file limit {}): {}; "
                        "retrying in 100 ms. Workers beyond the limit wait in the kernel's queue and may time out: "
                        "raise the hard limit (ulimit -Hn, LimitNOFILE= for a systemd unit) above the number of "
                        "workers",
                        conns.size(), fd_limit, std::strerror(errno));
          pause_accepting(std::chrono::milliseconds(100));
        }
        return;
      }
      net::set_nodelay(fd.get());
      auto c = std::make_unique<Conn>();
      c->id = next_conn++;
      c->peer = addr.name();
      c->handshake_deadline = SteadyClock::now() + opt.io_timeout;
      push_timer(c->handshake_deadline, c->id, 0);
      admission.accepted(c->id, SteadyClock::now());
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u64 = c->id;
      ::epoll_ctl(ep.get(), EPOLL_CTL_ADD, fd.get(), &ev);
      c->fd = std::move(fd);
      conns.emplace(c->id, std::move(c));
    }
  }

  void on_readable(Conn& c) {
    while (true) {
      // Reads go through one shared buffer; a connection keeps only its
      // unparsed bytes (a few hundred at most before authentication), so
      // 10,000 idle workers do not each hold (and zero) a 64 KiB buffer.
      size_t room = kReadChunk;
      if (c.phase != Phase::kReady) {
        if (c.rlen >= kPreAuthBytes) return refuse(c, "sent more than a handshake frame before authenticating");
        room = kPreAuthBytes - c.rlen;
      }
      ssize_t n = ::recv(c.fd.get(), scratch.data(), room, 0);
      if (n > 0) {
        if (c.rbuf.size() < c.rlen + static_cast<size_t>(n)) c.rbuf.resize(c.rlen + static_cast<size_t>(n));
        std::memcpy(c.rbuf.data() + c.rlen, scratch.data(), static_cast<size_t>(n));
        c.rlen += static_cast<size_t>(n);
        // The replies to the frames of one read leave in one send: a relay
        // connection's 8 JOINs and their answers cost one system call each way.
        reading = c.id;
        parse(c);
        reading = 0;
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

  void parse(Conn& c) {
    size_t off = 0;
    while (c.rlen - off >= wire::kHeaderBytes) {
      wire::Header h = wire::decode_header(c.rbuf.data() + off);
      size_t limit = c.phase == Phase::kReady ? opt.max_frame_bytes + wire::kRelayOverhead
                                              : wire::kMaxHandshakeFrameBytes;
      if (auto why = wire::check_header(h, job_hash, limit)) {
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
      c.frame_deadline = SteadyClock::now() + opt.io_timeout;
      push_timer(c.frame_deadline, c.id, 0);
    }
  }

  // ---- sending and closing -----------------------------------------------

  // A frame to a stream goes into a RELAY frame on its agent's connection.
  void send_frame(Conn& c, Type type, int64_t generation, uint32_t request_id,
                  std::string_view payload) {
    if (c.doomed) return;
    std::string f = wire::encode_frame(type, job_hash, generation, request_id, payload);
    if (c.parent == 0) return send_bytes(c, f);
    if (Conn* p = parent_of(c)) send_bytes(*p, wire::encode_relay(job_hash, c.stream, f));
  }

  void send_bytes(Conn& c, std::string_view frame) {
    if (c.doomed) return;
    if (c.id == reading) {  // sent once the frames of this read are handled
      c.wbuf += frame;
      return;
    }
    if (queue_sends) {
      if (c.wbuf.size() == c.woff) to_flush.push_back(c.id);  // not queued yet, nor waiting for EPOLLOUT
      c.wbuf += frame;
      return;
    }
    c.wbuf += frame;
    flush(c);
  }

  void send_error(Conn& c, uint32_t request_id, const std::string& message) {
    send_frame(c, Type::kError, gen, request_id, wire::encode_str(message));
  }

  void flush(Conn& c) {
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
    epoll_event ev{};
    ev.data.u64 = c.id;
    if (c.woff == c.wbuf.size()) {
      c.wbuf.clear();
      c.woff = 0;
      c.write_deadline = kNever;
      if (c.want_out) {
        ev.events = EPOLLIN;
        ::epoll_ctl(ep.get(), EPOLL_CTL_MOD, c.fd.get(), &ev);
        c.want_out = false;
      }
      return;
    }
    // An agent's connection carries the replies of its host's workers: it
    // may hold that much for each of up to 16 of them before it is refused.
    const size_t readers = std::clamp<size_t>(c.streams.size(), 1, 16);
    if (c.wbuf.size() - c.woff > readers * (2 * opt.max_frame_bytes + (1 << 20))) {
      return refuse(c, fmt::format("did not read its replies ({} bytes queued)", c.wbuf.size() - c.woff));
    }
    if (!c.want_out) {
      ev.events = EPOLLIN | EPOLLOUT;
      ::epoll_ctl(ep.get(), EPOLL_CTL_MOD, c.fd.get(), &ev);
      c.want_out = true;
    }
    if (c.write_deadline == kNever) {
      c.write_deadline = SteadyClock::now() + opt.io_timeout;
      push_timer(c.write_deadline, c.id, 0);
    }
  }

  // A protocol violation: log with the peer and reason, count, tell the peer
  // (best effort, one non-blocking send), and drop the connection. Safe to
  // call from within flush(): the connection is only closed by reap().
  void refuse(Conn& c, const std::string& reason) {
    if (c.doomed) return;
    if (c.id == reading) {  // the replies before the bad frame go first
      reading = 0;
      flush(c);
      if (c.doomed) return;
    }
    ++refused;
    if (c.relay || c.parent != 0) {
      // The agent authenticated: not a flood, so every one is logged.
      ERUN_LOG_WARN("{}: dropped {} from {}: {}{}", log_prefix(),
                    c.relay ? "the agent relay connection" : "the relayed connection", c.peer, reason,
                    c.relay ? fmt::format(" ({} relayed worker connection(s) close with it)", c.streams.size()) : "");
      if (c.parent != 0) send_error(c, 0, "refused: " + reason);
      if (c.relay && c.woff == c.wbuf.size()) {
        std::string f = wire::encode_frame(Type::kError, job_hash, gen, 0, wire::encode_str("refused: " + reason));
        [[maybe_unused]] auto n = ::send(c.fd.get(), f.data(), f.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      }
      return doom(c);
    }
    if (admission.refused(SteadyClock::now(), fmt::format("from {}: {}", c.peer, reason))) {
      ERUN_LOG_WARN("rendezvous: dropped connection from {}: {} (not a worker of this job; further drops in this "
                    "burst are counted, not logged)",
                    c.peer, reason);
      push_timer(admission.next_burst_check(), kBurstId, 0);
    }
    if (c.woff == c.wbuf.size()) {  // never in the middle of a half-sent frame
      std::string f = wire::encode_frame(Type::kError, job_hash, gen, 0,
                                         wire::encode_str("refused: " + reason));
      [[maybe_unused]] auto n = ::send(c.fd.get(), f.data(), f.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    doom(c);
  }

  void close_quietly(Conn& c, const std::string& reason) {
    if (c.doomed) return;
    if (c.joined) {
      ERUN_LOG_DEBUG("rendezvous: connection of slot {} from {} closed: {}", slot_name(c.join.slot),
                     c.peer, reason);
    }
    doom(c);
  }

  void doom(Conn& c) {
    c.doomed = true;
    doomed.push_back(c.id);
    unindex(waiting, waiting_list, c);
    unindex(members, member_list, c);
    if (c.parent != 0) {
      // The agent closes its worker's socket on RELAY_CLOSED.
      if (Conn* p = parent_of(c)) {
        p->streams.erase(c.stream);
        if (!c.closed_by_agent) send_bytes(*p, wire::encode_relay_closed(job_hash, c.stream));
      }
    }
    if (c.relay) {
      // Every worker it carried is disconnected, as if each had its own socket.
      std::vector<uint64_t> ids;
      ids.reserve(c.streams.size());
      for (auto& [sid, id] : c.streams) ids.push_back(id);
      c.streams.clear();
      for (uint64_t id : ids) {
        Conn& s = *conns.at(id);
        s.closed_by_agent = true;
        close_quietly(s, fmt::format("the agent relay connection from {} closed", c.peer));
      }
      --relays;
      ERUN_LOG_DEBUG("{}: agent relay connection from {} closed with {} relayed worker connection(s) ({} relay "
                    "connection(s) open)",
                    log_prefix(), c.peer, ids.size(), relays.load());
    }
  }

  // Takes `c` out of a slot index if it is the one listed for its slot.
  void unindex(SlotIndex& index, CachedList& list, const Conn& c) {
    auto it = index.find(c.join.slot);
    if (it == index.end() || it->second.conn != c.id) return;
    index.erase(it);
    list.touch(c.join.slot);
  }

  void reap() {
    for (uint64_t id : doomed) {
      auto it = conns.find(id);
      if (it == conns.end()) continue;
      Conn& c = *it->second;
      c.fd.reset();  // also leaves the epoll set
      if (c.joined) {
        auto o = slot_owner.find(c.join.slot);
        if (o != slot_owner.end() && o->second == c.id) {
          slot_owner.erase(o);
          disconnected.insert(c.join.slot);
        }
      }
      for (uint64_t g : c.gets) drop_get(g);
      admission.done(id);
      conns.erase(it);
      ++closed_since_trim;
    }
    doomed.clear();
    // After a burst of closed connections give the memory back to the system
    // (glibc keeps freed small blocks in its arenas otherwise). Each trim
    // walks the heap: when 100,000 workers leave at once it runs after every
    // quarter of those still open has gone (a few dozen trims), not every 256.
    if (closed_since_trim >= std::max<size_t>(256, conns.size() / 4) && admission.unauthenticated() == 0) {
      closed_since_trim = 0;
      ::malloc_trim(0);
    }
  }

  // ---- timers ---------------------------------------------------------------

  void run_timers(TimePoint now) {
    while (!timers.empty() && timers.top().when <= now) {
      Timer t = timers.top();
      timers.pop();
      if (t.get != 0) {
        expire_get(t.get, now);
        continue;
      }
      if (t.conn == kBurstId) {
        if (auto line = admission.burst_line(now)) {
          ERUN_LOG_WARN("rendezvous: {}; the job is unaffected. If these are not yours, limit who can reach "
                        "port {} (a firewall), or run erun where only the workers can connect",
                        *line, bound_port);
        }
        if (auto next = admission.next_burst_check(); next != TimePoint::max()) push_timer(next, kBurstId, 0);
        continue;
      }
      if (t.conn == kListenId) {
        if (accept_paused) {
          epoll_event ev{};
          ev.events = EPOLLIN;
          ev.data.u64 = kListenId;
          ::epoll_ctl(ep.get(), EPOLL_CTL_MOD, listen_fd.get(), &ev);
          accept_paused = false;
        }
        continue;
      }
      auto it = conns.find(t.conn);
      if (it == conns.end() || it->second->doomed) continue;
      Conn& c = *it->second;
      auto secs = seconds(opt.io_timeout);
      if (c.handshake_deadline <= now) {
        refuse(c, fmt::format("did not authenticate within {:.1f} s", secs));
      } else if (c.frame_deadline <= now) {
        refuse(c, fmt::format("sent part of a frame and stalled for {:.1f} s", secs));
      } else if (c.write_deadline <= now) {
        refuse(c, fmt::format("did not read its replies for {:.1f} s", secs));
      }
    }
  }

  void expire_get(uint64_t id, TimePoint now) {
    auto it = gets.find(id);
    if (it == gets.end() || it->second.deadline > now) return;
    PendingGet g = it->second;
    drop_get(id);
    auto c = conns.find(g.conn);
    if (c == conns.end()) return;
    auto& v = c->second->gets;
    std::erase(v, id);
    send_error(*c->second, g.request_id,
               fmt::format("store: timed out after {:.1f} s waiting for key '{}' in generation {}: the rank that "
                           "sets it did not (it may have failed; see its log), or the timeout is too short",
                           seconds(g.waited), g.key, gen));
  }

  // Forgets a pending get (not the connection's list of it).
  void drop_get(uint64_t id) {
    auto it = gets.find(id);
    if (it == gets.end()) return;
    auto w = waiters.find(it->second.key);
    if (w != waiters.end()) {
      std::erase(w->second, id);
      if (w->second.empty()) waiters.erase(w);
    }
    gets.erase(it);
  }

  // ---- messages -------------------------------------------------------------

  void handle(Conn& c, const wire::Header& h, std::string_view payload) {
    auto type = static_cast<Type>(h.type);
    switch (c.phase) {
      case Phase::kHello:
        if (type != Type::kHello || !c.hs.hello(payload, &nonces)) {
          return refuse(c, fmt::format("expected HELLO, got {} ({} bytes)", wire::type_name(h.type),
                                       payload.size()));
        }
        c.phase = Phase::kAuth;
        return send_frame(c, Type::kChallenge, gen, h.request_id, c.hs.challenge());
      case Phase::kAuth: {
        if (type != Type::kAuth || payload.size() != wire::kMacBytes) {
          return refuse(c, fmt::format("expected AUTH, got {} ({} bytes)", wire::type_name(h.type),
                                       payload.size()));
        }
        if (!c.hs.verify(proofs, payload)) {
          return refuse(c, "authentication failed (wrong job secret)");
        }
        c.phase = Phase::kReady;
        c.handshake_deadline = kNever;
        admission.done(c.id);
        return send_frame(c, Type::kAuthOk, gen, h.request_id, c.hs.proof(proofs));
      }
      case Phase::kReady:
        break;
    }
    if (type == Type::kRelay || type == Type::kRelayClosed) return on_relay(c, type, payload);
    if (c.relay) {
      return refuse(c, fmt::format("{} on an agent's relay connection, which carries only RELAY frames",
                                   wire::type_name(h.type)));
    }
    switch (type) {
      case Type::kJoin: return on_join(c, h, payload);
      case Type::kKvSet:
      case Type::kKvGet:
      case Type::kKvCheck: return on_kv(c, h, type, payload);
      default:
        return refuse(c, fmt::format("unexpected {} after authentication", wire::type_name(h.type)));
    }
  }

  // A frame of an agent's relay connection (docs/protocol.md, "Relaying").
  // Its first RELAY frame makes a connection a relay connection; a stream id
  // not seen before opens a stream, already authenticated (the agent ran the
  // handshake with its worker); ids only grow, so a frame for a stream the
  // server closed (RELAY_CLOSED crossing it on the wire) is dropped.
  void on_relay(Conn& c, Type type, std::string_view payload) {
    if (c.parent != 0 || c.joined) {
      return refuse(c, fmt::format("{} on a worker's own connection", wire::type_name(static_cast<uint16_t>(type))));
    }
    if (type == Type::kRelayClosed) {
      auto id = wire::decode_relay_closed(payload);
      if (!id) return refuse(c, fmt::format("malformed RELAY_CLOSED payload ({} bytes)", payload.size()));
      auto it = c.streams.find(*id);
      if (it == c.streams.end()) return;
      Conn& s = *conns.at(it->second);
      s.closed_by_agent = true;
      return close_quietly(s, "its worker's connection to the agent closed");
    }
    wire::RelayedFrame f;
    if (auto why = wire::decode_relay(payload, job_hash, opt.max_frame_bytes, &f)) return refuse(c, *why);
    if (!c.relay) {
      c.relay = true;
      ++relays;
      ERUN_LOG_DEBUG("{}: agent relay connection from {} opened ({} relay connection(s) open)", log_prefix(), c.peer,
                    relays.load());
    }
    auto it = c.streams.find(f.stream);
    if (it == c.streams.end()) {
      if (f.stream <= c.last_stream) return;  // a stream already closed
      if (c.streams.size() >= wire::kMaxRelayStreams) {
        return refuse(c, fmt::format("opened more than {} streams at once", wire::kMaxRelayStreams));
      }
      auto s = std::make_unique<Conn>();
      s->id = next_conn++;
      s->peer = fmt::format("{} (relayed, stream {})", c.peer, f.stream);
      s->phase = Phase::kReady;
      s->parent = c.id;
      s->stream = f.stream;
      it = c.streams.emplace(f.stream, s->id).first;
      c.last_stream = f.stream;
      conns.emplace(s->id, std::move(s));
    }
    handle(*conns.at(it->second), f.header, f.payload);
  }

  // The relay connection of a stream; nullptr once it is closing.
  Conn* parent_of(const Conn& c) {
    auto it = conns.find(c.parent);
    return it == conns.end() || it->second->doomed ? nullptr : it->second.get();
  }

  void on_join(Conn& c, const wire::Header& h, std::string_view payload) {
    auto parsed = wire::decode_join(payload);
    if (!parsed) {
      return refuse(c, fmt::format("malformed JOIN payload ({} bytes; a worker built from another erun version?)",
                                   payload.size()));
    }
    JoinRequest req = std::move(*parsed);
    // A worker leaves the generation it last joined: one older than the
    // current is normal (it is answered at once), one never published is not.
    if (h.generation > gen) {
      return refuse(c, fmt::format("JOIN leaving generation {}, which was never published (current {})",
                                   h.generation, gen));
    }
    if (auto why = duplicate_of_live_slot(c, req, h.generation)) {
      // Two processes must never hold the same rank: a live owner in a newer
      // generation than the one this join names keeps the slot.
      ERUN_LOG_WARN("{}: refused the join of slot {} from {} (pid {}): {}", log_prefix(), slot_name(req.slot),
                    c.peer, req.pid, *why);
      return send_error(c, h.request_id, *why);
    }
    req.left_generation = h.generation;
    if (c.joined && !(c.join.slot == req.slot)) {
      return refuse(c, fmt::format("JOIN for slot {} on a connection of slot {}; one connection serves one slot",
                                   slot_name(req.slot), slot_name(c.join.slot)));
    }
    supersede_owner(c, req);
    if (c.member_gen >= 0 || req.reason != JoinReason::kStart) record_rejoin(req);
    c.joined = true;
    c.join = req;
    c.join_pending = true;
    c.join_request_id = h.request_id;
    c.join_after_gen = h.generation;
    c.member_gen = -1;
    unindex(members, member_list, c);
    waiting[req.slot] = Listed{c.id, req};
    waiting_list.touch(req.slot);
    slot_owner[req.slot] = c.id;
    try_assign(c);
  }

  // A JOIN for a slot that another live connection holds takes the slot over
  // (the driver starts a slot's next worker only once it gave up the last
  // one). The same pid: the process re-connected, the old connection is closed
  // quietly. Another pid: the old holder is told and closed; its slot is not
  // reported as disconnected (it has a live worker again).
  void supersede_owner(Conn& c, const JoinRequest& req) {
    auto o = slot_owner.find(req.slot);
    if (o == slot_owner.end() || o->second == c.id) return;
    auto other = conns.find(o->second);
    slot_owner.erase(o);
    if (other == conns.end() || other->second->doomed) return;
    Conn& old = *other->second;
    unindex(waiting, waiting_list, old);
    if (old.join.pid == req.pid) {
      close_quietly(old, fmt::format("process {} re-connected", req.pid));
      return;
    }
    ERUN_LOG_WARN("{}: slot {}: process {} from {} takes the slot over from process {} from {}, whose "
                  "connection is closed; if that process still runs, it is not erun's and should be stopped",
                  log_prefix(), slot_name(req.slot), req.pid, c.peer, old.join.pid, old.peer);
    std::string why = fmt::format("slot {} was taken over by process {}", slot_name(req.slot), req.pid);
    if (old.join_pending) {
      old.join_pending = false;
      send_error(old, old.join_request_id, why);
    }
    old.joined = false;  // its slot belongs to the new connection now
    close_quietly(old, why);
  }

  void record_rejoin(const JoinRequest& req) {
    if (rejoined.size() >= kMaxRejoins) {
      ERUN_LOG_WARN("{}: {} re-joins were not read by the driver; dropped the oldest half (their "
                    "workers still wait and are assigned normally; only why they re-joined is lost)",
                    log_prefix(), rejoined.size());
      rejoined.erase(rejoined.begin(), rejoined.begin() + static_cast<long>(rejoined.size() / 2));
    }
    rejoined.push_back(req);
  }

  // Why a JOIN from `c` for `req.slot` naming generation `after_gen` must be
  // refused: another connection, still open, holds that slot in a generation
  // newer than the one this join names (a second process for a live rank, e.g.
  // a stale copy restarted by hand). An owner whose peer already closed (its
  // process died, the close not handled yet) is let go instead.
  std::optional<std::string> duplicate_of_live_slot(Conn& c, const JoinRequest& req, int64_t after_gen) {
    auto o = slot_owner.find(req.slot);
    if (o == slot_owner.end() || o->second == c.id) return std::nullopt;
    auto it = conns.find(o->second);
    if (it == conns.end() || it->second->doomed) return std::nullopt;
    Conn& owner = *it->second;
    if (owner.join.pid == req.pid) return std::nullopt;  // the same process re-connecting
    int64_t owner_gen = std::max(owner.member_gen, owner.join_after_gen);
    if (owner_gen < 0 || after_gen >= owner_gen) return std::nullopt;
    char b;
    // A relayed owner is live until its agent says RELAY_CLOSED.
    ssize_t n = owner.parent != 0 ? 1 : ::recv(owner.fd.get(), &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      close_quietly(owner, "closed by the peer");
      return std::nullopt;
    }
    return fmt::format(
        "slot {} is held by a live worker (pid {} from {}) in generation {}, and this join names generation {}: "
        "two processes may not hold one rank. Stop the other process, or let erun launch workers",
        slot_name(req.slot), owner.join.pid, owner.peer, owner_gen, after_gen);
  }

  void try_assign(Conn& c) {
    if (!c.join_pending || c.doomed || gen <= c.join_after_gen) return;
    auto a = assignments.find(c.join.slot);
    if (a == assignments.end()) return;
    const RankAssignment& r = a->second;
    c.join_pending = false;
    c.member_gen = gen;
    unindex(waiting, waiting_list, c);
    members[c.join.slot] = Listed{c.id, c.join};
    member_list.touch(c.join.slot);
    send_frame(c, Type::kAssignment, gen, c.join_request_id, wire::encode_assignment(r, gen));
  }

  void on_kv(Conn& c, const wire::Header& h, Type type, std::string_view payload) {
    if (h.generation != gen) {
      return send_error(c, h.request_id,
                        fmt::format("{} generation {}, current {} (re-join to get the current generation's rank)",
                                    h.generation < gen ? "stale" : "unknown", h.generation, gen));
    }
    if (type == Type::kKvSet) {
      auto kvs = wire::decode_kv_set(payload);
      if (!kvs) return refuse(c, fmt::format("malformed KV_SET payload ({} bytes)", payload.size()));
      auto& [key, value] = *kvs;
      auto& slot = kv[key];
      slot.assign(value.begin(), value.end());
      send_frame(c, Type::kKvSetOk, gen, h.request_id, {});
      answer_waiters(key, slot);
      return;
    }
    if (type == Type::kKvGet) {
      auto kvg = wire::decode_kv_get(payload);
      if (!kvg) return refuse(c, fmt::format("malformed KV_GET payload ({} bytes)", payload.size()));
      auto& [key, timeout_ms] = *kvg;
      auto it = kv.find(key);
      if (it != kv.end()) {
        return send_frame(c, Type::kKvValue, gen, h.request_id,
                          wire::encode_str({it->second.data(), it->second.size()}));
      }
      Duration wait = std::chrono::milliseconds(std::min<uint64_t>(
          timeout_ms, std::chrono::duration_cast<std::chrono::milliseconds>(kMaxGetWait).count()));
      uint64_t id = next_get++;
      gets[id] = PendingGet{c.id, h.request_id, key, SteadyClock::now() + wait, wait};
      waiters[key].push_back(id);
      c.gets.push_back(id);
      push_timer(gets[id].deadline, c.id, id);
      return;
    }
    auto keys = wire::decode_kv_check(payload);
    if (!keys) return refuse(c, fmt::format("malformed KV_CHECK payload ({} bytes)", payload.size()));
    bool all = std::all_of(keys->begin(), keys->end(), [&](const std::string& k) { return kv.count(k) > 0; });
    send_frame(c, Type::kKvCheckResult, gen, h.request_id, wire::encode_check_result(all));
  }

  void answer_waiters(const std::string& key, const std::vector<char>& value) {
    auto w = waiters.find(key);
    if (w == waiters.end()) return;
    std::vector<uint64_t> ids = std::move(w->second);
    waiters.erase(w);
    std::string payload = wire::encode_str({value.data(), value.size()});
    for (uint64_t id : ids) {
      auto g = gets.find(id);
      if (g == gets.end()) continue;
      auto c = conns.find(g->second.conn);
      uint32_t req = g->second.request_id;
      gets.erase(g);
      if (c == conns.end()) continue;
      std::erase(c->second->gets, id);
      send_frame(*c->second, Type::kKvValue, gen, req, payload);
    }
  }

  // ---- the driver's calls -----------------------------------------------------

  void publish(long g, const std::vector<RankAssignment>& ranks) {
    {
      std::lock_guard<std::mutex> lock(mu);
      ERUN_CHECK(g > gen);
      int64_t old = gen;
      gen = g;
      assignments.clear();
      assignments.reserve(ranks.size());
      for (auto& r : ranks) assignments[r.slot] = r;
      members.clear();  // the last generation's members are not members of this one
      member_list.dirty = true;
      queue_sends = true;
      kv.clear();
      for (auto& [id, pg] : gets) {
        auto c = conns.find(pg.conn);
        if (c == conns.end()) continue;
        std::erase(c->second->gets, id);
        send_error(*c->second, pg.request_id,
                   fmt::format("stale generation {}, current {} (re-join to get the current generation's rank)",
                               old, g));
      }
      gets.clear();
      waiters.clear();
      for (auto& r : ranks) {
        auto w = waiting.find(r.slot);
        if (w == waiting.end()) continue;
        auto c = conns.find(w->second.conn);
        if (c != conns.end()) try_assign(*c->second);
      }
      queue_sends = false;
    }
    wake();
  }

  // The joins of an index's connections in slot order, brought up to date.
  std::shared_ptr<const std::vector<JoinRequest>> listed(const SlotIndex& index, CachedList& cache) {
    if (cache.dirty || cache.touched.empty()) {
      if (cache.dirty) {
        auto fresh = std::make_shared<std::vector<JoinRequest>>();
        fresh->reserve(index.size());
        for (auto& [slot, entry] : index) fresh->push_back(entry.join);
        cache.list = std::move(fresh);
        cache.dirty = false;
        cache.touched.clear();
      }
      return cache.list;
    }
    if (cache.list.use_count() > 1) cache.list = std::make_shared<std::vector<JoinRequest>>(*cache.list);
    std::vector<JoinRequest>& list = *cache.list;
    auto& t = cache.touched;
    std::sort(t.begin(), t.end());
    t.erase(std::unique(t.begin(), t.end()), t.end());
    auto by_slot = [](const JoinRequest& j, const SlotKey& s) { return j.slot < s; };
    // Everything before the first touched slot stays where it is; the rest
    // is rebuilt: untouched runs moved, each touched slot's old entry dropped
    // and its current one (if any) put in its place.
    auto from = std::lower_bound(list.begin(), list.end(), t.front(), by_slot);
    const size_t keep = static_cast<size_t>(from - list.begin());
    std::vector<JoinRequest> tail;
    tail.reserve(list.size() - keep + t.size());
    for (const SlotKey& slot : t) {
      auto pos = std::lower_bound(from, list.end(), slot, by_slot);
      tail.insert(tail.end(), std::make_move_iterator(from), std::make_move_iterator(pos));
      from = pos;
      if (from != list.end() && from->slot == slot) ++from;
      if (auto it = index.find(slot); it != index.end()) tail.push_back(it->second.join);
    }
    tail.insert(tail.end(), std::make_move_iterator(from), std::make_move_iterator(list.end()));
    list.resize(keep);
    list.insert(list.end(), std::make_move_iterator(tail.begin()), std::make_move_iterator(tail.end()));
    t.clear();
    return cache.list;
  }

  // Queues a push frame to every member of generation `g` (the member index
  // for the current one) for the I/O thread to send.
  void push_to_members(long g, Type type, std::string_view payload) {
    queue_sends = true;
    if (g == gen) {
      for (auto& [slot, entry] : members) send_frame(*conns.at(entry.conn), type, g, 0, payload);
    } else {
      for (auto& [id, c] : conns) {
        if (!c->doomed && c->member_gen == g) send_frame(*c, type, g, 0, payload);
      }
    }
    queue_sends = false;
  }

  void notify(long g) {
    {
      std::lock_guard<std::mutex> lock(mu);
      push_to_members(g, Type::kHostsUpdated, {});
    }
    wake();
  }

  // Closing a lost rank's connection matters when its process is alive but
  // cut off (a partitioned host): once it can reach us again it finds its
  // rendezvous gone and ends instead of waiting in a join.
  void notify_lost(long g, const std::vector<int>& ranks) {
    if (ranks.empty()) return;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (g != gen) return;
      const std::set<int> lost(ranks.begin(), ranks.end());
      std::vector<uint64_t> gone;  // closed after the walk: closing takes a connection out of `members`
      for (auto& [slot, entry] : members) {
        if (lost.count(assignments.at(slot).rank)) gone.push_back(entry.conn);
      }
      for (uint64_t id : gone) {
        close_quietly(*conns.at(id), fmt::format("its rank was reported lost in generation {}", g));
      }
      push_to_members(g, Type::kPeersLost, wire::encode_peers_lost(ranks));
    }
    wake();
  }
};

RendezvousServer::RendezvousServer(ServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}
RendezvousServer::~RendezvousServer() = default;

Status RendezvousServer::start() {
  ERUN_CHECK(!impl_->listen_fd);
  return impl_->start();
}

int RendezvousServer::port() const { return impl_->bound_port; }

std::vector<JoinRequest> RendezvousServer::waiting() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return *impl_->listed(impl_->waiting, impl_->waiting_list);
}

std::vector<JoinRequest> RendezvousServer::members() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return *impl_->listed(impl_->members, impl_->member_list);
}

void RendezvousServer::publish(long gen, const std::vector<RankAssignment>& ranks) {
  impl_->publish(gen, ranks);
}

long RendezvousServer::generation() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->gen;
}

void RendezvousServer::notify_hosts_updated(long gen) { impl_->notify(gen); }

void RendezvousServer::notify_peers_lost(long gen, const std::vector<int>& ranks) { impl_->notify_lost(gen, ranks); }

MembershipSnapshot RendezvousServer::snapshot() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  MembershipSnapshot s;
  s.generation = impl_->gen;
  s.members = SharedList<JoinRequest>(impl_->listed(impl_->members, impl_->member_list));
  s.waiting = SharedList<JoinRequest>(impl_->listed(impl_->waiting, impl_->waiting_list));
  s.rejoined = std::exchange(impl_->rejoined, {});
  s.disconnected.assign(impl_->disconnected.begin(), impl_->disconnected.end());
  impl_->disconnected.clear();
  return s;
}

long RendezvousServer::refused() const { return impl_->refused.load(); }

long RendezvousServer::relay_connections() const { return impl_->relays.load(); }

}  // namespace erun
