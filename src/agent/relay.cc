#include "agent/relay.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "common/log.h"
#include "rendezvous/wire.h"

namespace erun::agent {

namespace {

using SteadyClock = std::chrono::steady_clock;
using wire::Type;
constexpr size_t kReadChunk = 64 * 1024;
constexpr size_t kPreAuthBytes = wire::kHeaderBytes + wire::kMaxHandshakeFrameBytes;
// Workers' frames waiting for the upstream beyond this: stop reading workers.
constexpr size_t kUpstreamBacklog = 16u << 20;
constexpr size_t kMaxHandshakeReply = 4096;

// Appends what one non-blocking read gives. Returns the bytes read, 0 at
// EOF, -1 on an error, -2 when nothing is there yet (EAGAIN).
ssize_t read_some(int fd, std::string& into, size_t max) {
  char chunk[kReadChunk];
  while (true) {
    ssize_t n = ::recv(fd, chunk, std::min(max, sizeof chunk), 0);
    if (n > 0) into.append(chunk, static_cast<size_t>(n));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return -2;
    return n;
  }
}

// Writes what the socket takes; false on an error (the peer is gone).
bool write_some(int fd, std::string& buf) {
  while (!buf.empty()) {
    ssize_t n = ::send(fd, buf.data(), buf.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      buf.erase(0, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
  return true;
}

}  // namespace

Relay::Relay(RelayOptions o)
    : o_(std::move(o)),
      job_hash_(handshake::job_hash(o_.job_id)),
      proofs_(wire::proofs(o_.secret, o_.job_id)) {}

Result<std::unique_ptr<Relay>> Relay::create(RelayOptions options) {
  using R = Result<std::unique_ptr<Relay>>;
  std::unique_ptr<Relay> r(new Relay(std::move(options)));
  std::string templ = r->o_.parent_dir + "/erun-relay-XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr) {  // mode 0700
    return R::error(fmt::format("cannot create a private directory for the relay socket ({}): {}", templ,
                                std::strerror(errno)));
  }
  r->dir_ = templ;
  r->path_ = r->dir_ + "/rdzv";
  net::Address a;
  if (!net::unix_address(r->path_, &a)) {
    return R::error(fmt::format("the relay socket path {} is too long for a unix socket: set TMPDIR on this host "
                                "to a shorter directory",
                                r->path_));
  }
  net::Socket s = net::listen(a, 1024);
  if (!s.ok()) return R::error(fmt::format("cannot listen on the relay socket {}: {}", r->path_, s.outcome.text()));
  r->listen_fd_ = std::move(s.fd);
  ::chmod(r->path_.c_str(), 0600);
  return r;
}

Relay::~Relay() {
  locals_.clear();
  up_fd_.reset();
  listen_fd_.reset();
  if (!path_.empty()) ::unlink(path_.c_str());
  if (!dir_.empty()) ::rmdir(dir_.c_str());
}

size_t Relay::add_fds(std::vector<pollfd>& fds) {
  size_t first = fds.size();
  fds.push_back({listen_fd_.get(), POLLIN, 0});
  short up_events = 0;
  if (up_ == Up::kConnecting || !up_wbuf_.empty()) up_events |= POLLOUT;
  if (up_ != Up::kNone && up_ != Up::kConnecting) up_events |= POLLIN;
  fds.push_back({up_fd_.get(), up_events, 0});
  bool backlog = up_wbuf_.size() + held_.size() > kUpstreamBacklog;
  for (auto& [id, l] : locals_) {
    short ev = backlog && l.phase == Phase::kReady ? 0 : POLLIN;
    if (!l.wbuf.empty()) ev |= POLLOUT;
    fds.push_back({l.fd.get(), ev, 0});
  }
  return first;
}

void Relay::on_events(const std::vector<pollfd>& fds, size_t first) {
  // The locals in the order add_fds() listed them (the map may change below).
  std::vector<std::pair<uint64_t, short>> ready;
  size_t i = first + 2;
  for (auto& [id, l] : locals_) {
    if (i < fds.size() && fds[i].fd == l.fd.get() && fds[i].revents) ready.push_back({id, fds[i].revents});
    ++i;
  }
  if (fds[first + 1].revents && up_fd_ && fds[first + 1].fd == up_fd_.get()) on_upstream(fds[first + 1].revents);
  for (auto& [id, ev] : ready) on_local(id, ev);
  if (fds[first].revents) accept_all();
  if (want_upstream_ && up_ == Up::kNone && !paused_) start_upstream();
  want_upstream_ = false;
}

void Relay::pause() {
  if (!paused_) paused_since_ = SteadyClock::now();
  paused_ = true;
  if (up_ != Up::kNone) lose_upstream("the driver is gone");
}

void Relay::resume(const std::string& host, int port) {
  if (port > 0 && port <= 65535) {
    if (!host.empty()) o_.upstream_host = host;
    o_.upstream_port = port;
  }
  paused_ = false;
  if (up_ != Up::kNone) lose_upstream("a new driver took over");
  want_upstream_ = !locals_.empty();
}

void Relay::accept_all() {
  while (true) {
    Fd fd = net::accept(listen_fd_.get());
    if (!fd) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        ERUN_LOG_WARN("{}: relay: cannot accept a worker's connection: {}", o_.log_prefix, std::strerror(errno));
      }
      return;
    }
    if (locals_.size() >= wire::kMaxRelayStreams) {
      // The driver takes at most this many streams per host: one more would
      // make it refuse the whole connection, and every worker on it.
      if (std::exchange(full_warned_, true)) continue;  // closes fd
      ERUN_LOG_WARN("{}: relay: refused a local connection: {} are open, the most one host may relay; "
                    "run fewer workers per host or start the job with --no-agent-relay",
                    o_.log_prefix, locals_.size());
      continue;
    }
    full_warned_ = false;
    Local l;
    l.fd = std::move(fd);
    l.deadline = SteadyClock::now() + o_.io_timeout;
    locals_.emplace(next_key_++, std::move(l));
  }
}

void Relay::on_local(uint64_t id, short revents) {
  auto it = locals_.find(id);
  if (it == locals_.end()) return;
  Local& l = it->second;
  if (revents & POLLOUT) {
    if (!write_local(l)) return close_local(id, true);
    if (l.close_after_write && l.wbuf.empty()) return close_local(id, false);
  }
  if (!(revents & (POLLIN | POLLHUP | POLLERR))) return;
  size_t room = kReadChunk;
  if (l.phase != Phase::kReady) {
    if (l.rbuf.size() >= kPreAuthBytes) return refuse_local(id, "sent more than a handshake frame");
    room = kPreAuthBytes - l.rbuf.size();
  }
  ssize_t n = read_some(l.fd.get(), l.rbuf, room);
  if (n == -2) return;
  if (n <= 0) {
    if (l.phase != Phase::kReady) return refuse_local(id, "closed the connection before authenticating");
    return close_local(id, true);
  }
  parse_local(id, l);
}

void Relay::parse_local(uint64_t id, Local& l) {
  size_t off = 0;
  while (l.rbuf.size() - off >= wire::kHeaderBytes) {
    wire::Header h = wire::decode_header(l.rbuf.data() + off);
    size_t limit = l.phase == Phase::kReady ? o_.max_frame_bytes : wire::kMaxHandshakeFrameBytes;
    if (auto why = wire::check_header(h, job_hash_, limit)) return refuse_local(id, *why);
    size_t total = wire::kHeaderBytes + h.length;
    if (l.rbuf.size() - off < total) break;
    std::string_view frame(l.rbuf.data() + off, total);
    std::string_view payload = frame.substr(wire::kHeaderBytes);
    off += total;
    auto type = static_cast<Type>(h.type);
    switch (l.phase) {
      case Phase::kHello:
        if (paused_) {
          // No driver to relay to: the worker's client tries again later.
          std::string f = wire::encode_frame(Type::kError, job_hash_, -1, h.request_id,
                                             wire::encode_str("no driver yet: waiting for one to take the job over"));
          [[maybe_unused]] auto n = ::send(l.fd.get(), f.data(), f.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
          return close_local(id, false);
        }
        if (type != Type::kHello || !l.hs.hello(payload)) {
          return refuse_local(id, fmt::format("expected HELLO, got {}", wire::type_name(h.type)));
        }
        l.wbuf += wire::encode_frame(Type::kChallenge, job_hash_, -1, h.request_id, l.hs.challenge());
        l.phase = Phase::kAuth;
        break;
      case Phase::kAuth:
        if (type != Type::kAuth || payload.size() != wire::kMacBytes) {
          return refuse_local(id, fmt::format("expected AUTH, got {}", wire::type_name(h.type)));
        }
        if (!l.hs.verify(proofs_, payload)) {
          return refuse_local(id, "authentication failed (wrong job secret)");
        }
        l.wbuf += wire::encode_frame(Type::kAuthOk, job_hash_, -1, h.request_id, l.hs.proof(proofs_));
        l.phase = Phase::kReady;
        l.deadline = TimePoint::max();
        want_upstream_ = true;  // connected after this round of events, never under a local's feet
        break;
      case Phase::kReady:
        if (l.stream == 0) {
          l.stream = next_stream_++;
          streams_[l.stream] = id;
        }
        send_upstream(wire::encode_relay(job_hash_, l.stream, frame));
        break;
    }
  }
  l.rbuf.erase(0, off);
  if (!write_local(l)) return close_local(id, true);
}

// Writes what the worker's socket takes. An authenticated stream with half a
// frame read or replies unsent has io_timeout to finish, counted from when
// its buffers stopped being empty (a trickle of bytes does not extend it).
bool Relay::write_local(Local& l) {
  if (!write_some(l.fd.get(), l.wbuf)) return false;
  if (l.phase == Phase::kReady) {
    if (l.wbuf.empty() && l.rbuf.empty()) {
      l.deadline = TimePoint::max();
    } else if (l.deadline == TimePoint::max()) {
      l.deadline = SteadyClock::now() + o_.io_timeout;
    }
  }
  return true;
}

void Relay::refuse_local(uint64_t id, const std::string& why) {
  auto it = locals_.find(id);
  if (it == locals_.end()) return;
  ++refused_;
  bool authenticated = it->second.phase == Phase::kReady;
  ERUN_LOG_WARN("{}: relay: refused a connection to the relay socket {}: {}{}", o_.log_prefix, path_, why,
                authenticated ? "" : " (not a worker of this job: nothing was relayed)");
  std::string f = wire::encode_frame(Type::kError, job_hash_, -1, 0, wire::encode_str("refused: " + why));
  [[maybe_unused]] auto n = ::send(it->second.fd.get(), f.data(), f.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  close_local(id, authenticated);
}

void Relay::close_local(uint64_t id, bool tell_upstream) {
  auto it = locals_.find(id);
  if (it == locals_.end()) return;
  uint32_t stream = it->second.stream;
  locals_.erase(it);  // closes its socket
  if (stream == 0) return;  // the server never heard of it
  streams_.erase(stream);
  if (tell_upstream) send_upstream(wire::encode_relay_closed(job_hash_, stream));
}

// ---- upstream ------------------------------------------------------------

void Relay::start_upstream() {
  auto addrs = net::resolve(o_.upstream_host, std::to_string(o_.upstream_port));
  if (!addrs) return lose_upstream(fmt::format("cannot resolve {}: {}", o_.upstream_host, addrs.message()));
  up_addrs_ = std::move(addrs).value();
  std::string why = "no address";
  if (!connect_next(&why)) return lose_upstream(why);
}

bool Relay::connect_next(std::string* why) {
  up_fd_.reset();
  while (!up_addrs_.empty()) {
    net::Address addr = up_addrs_.front();
    up_addrs_.erase(up_addrs_.begin());
    net::Socket s = net::start_connect(addr);
    if (!s.ok()) {
      *why = fmt::format("{}: {}", s.outcome.call, s.outcome.text());
      continue;
    }
    up_fd_ = std::move(s.fd);
    up_ = Up::kConnecting;
    up_deadline_ = SteadyClock::now() + o_.io_timeout;
    return true;
  }
  return false;
}

void Relay::on_upstream(short revents) {
  if (up_ == Up::kConnecting) {
    if (int err = net::connect_error(up_fd_.get()); err != 0) {
      std::string why = fmt::format("connect: {}", std::strerror(err));
      if (!connect_next(&why)) lose_upstream(why);
      return;  // the next address, if any, is polled from the next round
    }
    if (!(revents & POLLOUT)) return;
    up_hs_ = handshake::Initiator();
    up_wbuf_ = wire::encode_frame(Type::kHello, job_hash_, -1, 0, up_hs_.nonce());
    up_ = Up::kChallenge;
  }
  if (revents & (POLLIN | POLLHUP | POLLERR)) {
    ssize_t n = read_some(up_fd_.get(), up_rbuf_, kReadChunk);
    if (n == 0 || n == -1) {
      return lose_upstream(n == 0 ? "the driver closed the connection"
                                  : fmt::format("read: {}", std::strerror(errno)));
    }
    parse_upstream();
    if (up_ == Up::kNone) return;
  }
  write_upstream();
}

void Relay::parse_upstream() {
  size_t off = 0;
  while (up_ != Up::kNone && up_rbuf_.size() - off >= wire::kHeaderBytes) {
    wire::Header h = wire::decode_header(up_rbuf_.data() + off);
    size_t limit = up_ == Up::kReady ? o_.max_frame_bytes + wire::kRelayOverhead : kMaxHandshakeReply;
    if (auto why = wire::check_header(h, job_hash_, limit)) return lose_upstream(*why);
    size_t total = wire::kHeaderBytes + h.length;
    if (up_rbuf_.size() - off < total) break;
    std::string payload = up_rbuf_.substr(off + wire::kHeaderBytes, h.length);
    off += total;
    upstream_frame(h.type, h.generation, payload);
  }
  if (up_ != Up::kNone) up_rbuf_.erase(0, off);
}

void Relay::upstream_frame(uint16_t type_code, int64_t generation, std::string_view payload) {
  auto type = static_cast<Type>(type_code);
  if (type == Type::kError) {
    auto m = wire::decode_str(payload);
    return lose_upstream(fmt::format("the driver refused the relay: {}", m ? *m : "(unreadable)"));
  }
  switch (up_) {
    case Up::kChallenge: {
      if (type != Type::kChallenge || !up_hs_.challenged(payload)) {
        return lose_upstream(fmt::format("expected CHALLENGE, got {}", wire::type_name(type_code)));
      }
      up_wbuf_ += wire::encode_frame(Type::kAuth, job_hash_, -1, 0, up_hs_.proof(proofs_));
      up_ = Up::kAuthOk;
      return;
    }
    case Up::kAuthOk: {
      if (type != Type::kAuthOk || !up_hs_.verify(proofs_, payload)) {
        return lose_upstream("the driver's proof is wrong (not this job's driver)");
      }
      up_ = Up::kReady;
      up_deadline_ = TimePoint::max();
      ERUN_LOG_DEBUG("{}: relay: connected to the driver's rendezvous at {}:{} (generation {})", o_.log_prefix,
                     o_.upstream_host, o_.upstream_port, generation);
      send_upstream(std::exchange(held_, {}));
      return;
    }
    case Up::kReady: break;
    default: return lose_upstream(fmt::format("unexpected {}", wire::type_name(type_code)));
  }
  if (type == Type::kRelayClosed) {
    auto id = wire::decode_relay_closed(payload);
    if (!id) return lose_upstream("malformed RELAY_CLOSED");
    auto s = streams_.find(*id);
    if (s == streams_.end()) return;
    uint64_t key = s->second;
    Local& l = locals_.at(key);
    l.close_after_write = true;
    if (!write_local(l) || l.wbuf.empty()) close_local(key, false);
    return;
  }
  if (type != Type::kRelay) return lose_upstream(fmt::format("unexpected {} on the relay", wire::type_name(type_code)));
  wire::RelayedFrame f;
  if (auto why = wire::decode_relay(payload, job_hash_, o_.max_frame_bytes, &f)) return lose_upstream(*why);
  auto s = streams_.find(f.stream);
  if (s == streams_.end()) return;  // the worker went; its RELAY_CLOSED is on the way
  uint64_t key = s->second;
  Local& l = locals_.at(key);
  l.wbuf.append(payload.substr(4));
  if (l.wbuf.size() > 2 * o_.max_frame_bytes + (1u << 20)) {
    ERUN_LOG_WARN("{}: relay: stream {} does not read its replies ({} bytes queued): closing it", o_.log_prefix,
                  f.stream, l.wbuf.size());
    return close_local(key, true);
  }
  if (!write_local(l)) close_local(key, true);
}

void Relay::send_upstream(std::string bytes) {
  if (bytes.empty()) return;
  if (up_ != Up::kReady) {
    held_ += bytes;
    return;
  }
  // Written when poll() says the socket takes it (add_fds asks for POLLOUT):
  // a write error here would close workers' connections under the caller.
  if (up_wbuf_.empty()) up_deadline_ = SteadyClock::now() + o_.io_timeout;
  up_wbuf_ += bytes;
}

void Relay::write_upstream() {
  if (!up_fd_ || up_ == Up::kConnecting) return;
  if (!write_some(up_fd_.get(), up_wbuf_)) return lose_upstream(fmt::format("write: {}", std::strerror(errno)));
  if (up_ == Up::kReady && up_wbuf_.empty()) up_deadline_ = TimePoint::max();
}

void Relay::lose_upstream(const std::string& why) {
  size_t relayed = 0;
  for (auto it = locals_.begin(); it != locals_.end();) {
    if (it->second.phase == Phase::kReady) {
      it = locals_.erase(it);  // closes its socket
      ++relayed;
    } else {
      ++it;
    }
  }
  // With no worker on it (the job ending) this is routine.
  if (relayed > 0) {
    ERUN_LOG_WARN("{}: relay: the connection to the driver's rendezvous at {}:{} is lost: {}; closed {} worker "
                  "connection(s) (they see their rendezvous connection lost)",
                  o_.log_prefix, o_.upstream_host, o_.upstream_port, why, relayed);
  } else {
    ERUN_LOG_DEBUG("{}: relay: the connection to the driver's rendezvous at {}:{} closed: {}", o_.log_prefix,
                   o_.upstream_host, o_.upstream_port, why);
  }
  streams_.clear();  // every stream the server knew is closed above
  if (o_.pause_on_loss && !paused_) {
    paused_ = true;
    paused_since_ = SteadyClock::now();
  }
  up_fd_.reset();
  up_ = Up::kNone;
  up_rbuf_.clear();
  up_wbuf_.clear();
  held_.clear();
  up_deadline_ = TimePoint::max();
}

void Relay::tick(TimePoint now) {
  if (up_ != Up::kNone && now >= up_deadline_) {
    lose_upstream(up_ == Up::kReady ? fmt::format("it did not read for {:.1f} s", seconds(o_.io_timeout))
                                    : fmt::format("no handshake within {:.1f} s", seconds(o_.io_timeout)));
  }
  std::vector<std::pair<uint64_t, bool>> late;
  for (auto& [key, l] : locals_) {
    if (now >= l.deadline) late.push_back({key, l.phase == Phase::kReady});
  }
  for (auto& [key, ready] : late) {
    if (!ready) {
      refuse_local(key, fmt::format("did not authenticate within {:.1f} s", seconds(o_.io_timeout)));
    } else {
      ERUN_LOG_WARN("{}: relay: stream {} stalled (half a frame, or replies unread) for {:.1f} s: closing it",
                    o_.log_prefix, locals_.at(key).stream, seconds(o_.io_timeout));
      close_local(key, true);
    }
  }
}

}  // namespace erun::agent
