// RendezvousClient: the handshake runs on the caller's thread in connect();
// after it a reader thread owns every read of the socket. Requests carry an id
// in the frame header; the caller sends under a write mutex and waits on a
// condition variable, with a deadline, for the reader to hand over the reply.
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "common/fd.h"
#include "common/log.h"
#include "common/net.h"
#include "common/strings.h"
#include "erun/errors.hpp"
#include "rendezvous/rendezvous.h"
#include "rendezvous/wire.h"

namespace erun {
namespace {

using wire::Type;
using SteadyClock = std::chrono::steady_clock;
constexpr size_t kMaxHandshakeReply = 4096;

std::string slot_name(const SlotKey& s) { return fmt::format("{}:{}", s.host, s.local_index); }

std::string error_message(const wire::Frame& f) {
  auto m = wire::decode_str(f.payload);
  return m ? *m : std::string("(unreadable error message)");
}

// Connects to the rendezvous server at host:port, trying each address in turn.
Result<Fd> connect_tcp(const std::string& host, int port, TimePoint deadline) {
  auto addrs = net::resolve(host, std::to_string(port));
  if (!addrs) {
    return Result<Fd>::error(fmt::format("cannot resolve rendezvous address '{}': {}", host, addrs.message()));
  }
  std::string last = "no address";
  for (const net::Address& a : *addrs) {
    net::Socket s = net::connect(a, deadline);
    if (s.ok()) return std::move(s.fd);
    last = s.outcome.text();
  }
  return Result<Fd>::error(fmt::format(
      "cannot connect to the rendezvous server at {}:{}: {} (is the driver running and reachable?)", host, port,
      last));
}

// Connects to this host's erun agent's relay socket (docs/protocol.md, "Relaying").
Result<Fd> connect_unix(const std::string& path, TimePoint deadline) {
  net::Address a;
  if (!net::unix_address(path, &a)) {
    return Result<Fd>::error(fmt::format("the rendezvous socket path '{}' is empty or too long", path));
  }
  net::Socket s = net::connect_unix(a, deadline);
  if (s.ok()) return std::move(s.fd);
  if (s.outcome.call == "socket") {
    return Result<Fd>::error(fmt::format("socket: {}", s.outcome.text()));
  }
  return Result<Fd>::error(fmt::format(
      "cannot connect to the rendezvous relay of this host's erun agent at {}: {} (is the agent running?)", path,
      s.outcome.text()));
}

}  // namespace

struct RendezvousClient::Impl {
  explicit Impl(ClientOptions o) : opt(std::move(o)), job_hash(handshake::job_hash(opt.job_id)), store(this) {
    target = Target{opt.address, opt.port};
  }

  struct Pending {
    bool done = false;
    bool lost = false;  // sent on a connection that was lost before the reply
    wire::Frame frame;
  };

  class RemoteStore final : public KvStore {
   public:
    explicit RemoteStore(Impl* impl) : impl_(impl) {}
    void set(const std::string& key, const std::vector<char>& value) override {
      auto f = impl_->kv_call(Type::kKvSet, wire::encode_kv_set(key, {value.data(), value.size()}),
                              impl_->opt.io_timeout, "set '" + key + "'");
      impl_->expect(f, Type::kKvSetOk, "set '" + key + "'");
    }
    std::vector<char> get(const std::string& key, Duration timeout) override {
      if (timeout < Duration::zero()) timeout = Duration::zero();
      auto ms = std::chrono::ceil<std::chrono::milliseconds>(timeout).count();
      auto f = impl_->kv_call(Type::kKvGet, wire::encode_kv_get(key, static_cast<uint64_t>(ms)),
                              timeout + impl_->opt.io_timeout, "get '" + key + "'");
      impl_->expect(f, Type::kKvValue, "get '" + key + "'");
      auto v = wire::decode_str(f.payload);
      if (!v) throw CommError("store: malformed reply to get '" + key + "'");
      return std::vector<char>(v->begin(), v->end());
    }
    bool check(const std::vector<std::string>& keys) override {
      auto f = impl_->kv_call(Type::kKvCheck, wire::encode_kv_check(keys), impl_->opt.io_timeout, "check");
      impl_->expect(f, Type::kKvCheckResult, "check");
      auto all = wire::decode_check_result(f.payload);
      if (!all) throw CommError("store: malformed reply to check");
      return *all;
    }

   private:
    Impl* impl_;
  };

  ClientOptions opt;
  uint64_t job_hash;
  RemoteStore store;
  Fd sock, wake;
  int fd = -1;  // sock.get(), once connected
  std::thread reader;
  std::atomic<bool> stop{false};
  std::atomic<bool> hosts_updated{false};
  std::atomic<bool> drain_pending{false};  // the update is a host that drains
  std::atomic<long> gen{-1};
  std::atomic<long> lost_gen{-1};
  std::vector<int> lost_ranks;                     // guarded by mu: of lost_gen

  std::mutex write_mu;
  std::mutex mu;
  std::condition_variable cv;
  std::unordered_map<uint32_t, Pending*> pending;  // guarded by mu
  uint32_t next_request = 1;                       // guarded by mu
  bool broken = false;                             // guarded by mu
  bool reconnecting = false;                       // guarded by mu: the connection was lost, tried again
  TimePoint reconnect_until{};                     // guarded by mu
  std::string broken_reason;                       // guarded by mu
  std::string server_said;                         // guarded by mu: last pushed ERROR

  ~Impl() {
    stop = true;
    if (wake) {
      uint64_t one = 1;
      [[maybe_unused]] auto n = ::write(wake.get(), &one, sizeof(one));
    }
    if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
    if (reader.joinable()) reader.join();
    fail("the client was closed");
  }

  // Where the driver is: opt's, until follow() moves it (the reader
  // thread; the others read it for their messages).
  struct Target {
    std::string address;
    int port = 0;
    bool operator==(const Target&) const = default;
  };
  mutable std::mutex target_mu;  // a leaf: nothing else is taken under it
  Target target;                 // guarded by target_mu
  Target target_now() const {
    std::lock_guard<std::mutex> lock(target_mu);
    return target;
  }

  std::string where() const {
    Target t = target_now();
    return t.address.rfind("unix:", 0) == 0 ? t.address : fmt::format("{}:{}", t.address, t.port);
  }

  // Where opt.follow_file (written by this worker's agent when a new driver
  // took the job over elsewhere) says the driver is, as "HOST PORT\n";
  // nothing for no file, or anything else there.
  bool follows() const { return !opt.follow_file.empty() && opt.reconnect_within > Duration::zero(); }
  std::optional<Target> followed() const {
    if (!follows()) return std::nullopt;
    Fd f(::open(opt.follow_file.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    if (!f) return std::nullopt;
    char buf[300];
    ssize_t n = ::read(f.get(), buf, sizeof(buf));
    if (n <= 0 || static_cast<size_t>(n) >= sizeof(buf) || buf[n - 1] != '\n') return std::nullopt;
    std::string_view line(buf, static_cast<size_t>(n) - 1);
    size_t sp = line.find(' ');
    if (sp == 0 || sp == std::string_view::npos) return std::nullopt;
    std::string host(line.substr(0, sp));
    long port = 0;
    if (host.find_first_of(" \t\r\n") != std::string::npos || host.rfind("unix:", 0) == 0 ||
        !parse_int(line.substr(sp + 1), port) || port <= 0 || port > 65535) {
      return std::nullopt;
    }
    return Target{std::move(host), static_cast<int>(port)};
  }
  // The followed file names another driver than the target.
  bool driver_moved() const {
    auto t = followed();
    return t && *t != target_now();
  }
  // Aims at the driver the followed file names.
  void follow() {
    auto t = followed();
    if (!t) return;
    {
      std::lock_guard<std::mutex> lock(target_mu);
      if (target == *t) return;
      target = *t;
    }
    ERUN_LOG_WARN("rendezvous: a new driver took the job over at {}:{} (this worker's agent says so): trying it there",
                  t->address, t->port);
  }

  void fail(const std::string& reason) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (broken) return;
      broken = true;
      broken_reason = server_said.empty() ? reason : reason + " (server said: " + server_said + ")";
    }
    cv.notify_all();
  }

  // A connected and authenticated socket to the driver (or its relay).
  Result<Fd> open_connection(TimePoint deadline) {
    // "unix:PATH": this host's erun agent relays the connection (docs/protocol.md, "Relaying").
    const Target t = target_now();
    auto s = t.address.rfind("unix:", 0) == 0 ? connect_unix(t.address.substr(5), deadline)
                                              : connect_tcp(t.address, t.port, deadline);
    if (!s) return s;
    if (auto h = authenticate(s->get(), deadline); !h) {
      return Result<Fd>::error(fmt::format("rendezvous: handshake with {} failed: {}", where(), h.message()));
    }
    return s;
  }

  // The reader thread, its connection lost for `why`: without
  // reconnect_within the client fails; with it, requests in flight are
  // told they were lost and the driver is tried again every half second.
  // True once connected again.
  bool reconnect(const std::string& why) {
    if (opt.reconnect_within <= Duration::zero()) {
      fail(why);
      return false;
    }
    const TimePoint until = SteadyClock::now() + opt.reconnect_within;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (broken) return false;
      reconnecting = true;
      reconnect_until = until;
      for (auto& [id, p] : pending) p->lost = true;
    }
    cv.notify_all();
    ERUN_LOG_WARN("{}; trying {} again for up to {:.0f} s (--driver-grace: a new erun may take the job over)", why,
                  where(), seconds(opt.reconnect_within));
    while (!stop) {
      pollfd w{wake.get(), POLLIN, 0};
      ::poll(&w, 1, 500);
      if (stop) return false;
      if (SteadyClock::now() > until) {
        fail(fmt::format("{}; no driver took the job over within {:.0f} s", why, seconds(opt.reconnect_within)));
        return false;
      }
      follow();
      auto s = open_connection(std::min(until, SteadyClock::now() + std::chrono::seconds(2)));
      if (!s) continue;
      {
        std::lock_guard<std::mutex> wlock(write_mu);
        sock = std::move(s).value();
        fd = sock.get();
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        reconnecting = false;
      }
      hosts_updated = true;  // re-join the new driver at the next commit
      cv.notify_all();
      ERUN_LOG_WARN("rendezvous: connected to {} again: re-joining at the next commit", where());
      return true;
    }
    return false;
  }

  Status connect() {
    if (fd >= 0) return Status::error("rendezvous: connect() called twice");
    TimePoint deadline = SteadyClock::now() + opt.io_timeout;
    auto s = open_connection(deadline);
    if (!s) return s.status();
    wake.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (!wake) {
      return Status::error(
          fmt::format("rendezvous: handshake with {} failed: eventfd: {}", where(), std::strerror(errno)));
    }
    sock = std::move(s).value();
    fd = sock.get();
    reader = std::thread([this] { read_loop(); });
    return Status::ok();
  }

  // The client's side of the handshake (docs/protocol.md, "Handshake").
  Status authenticate(int conn, TimePoint deadline) {
    const auto proofs = wire::proofs(opt.secret, opt.job_id);
    handshake::Initiator hs;
    auto s = wire::send_all(conn, wire::encode_frame(Type::kHello, job_hash, -1, 0, hs.nonce()), deadline);
    if (!s) return s;
    auto ch = wire::recv_frame(conn, job_hash, kMaxHandshakeReply, deadline);
    if (!ch) return ch.status();
    if (ch->header.type == static_cast<uint16_t>(Type::kError)) return Status::error(error_message(*ch));
    if (ch->header.type != static_cast<uint16_t>(Type::kChallenge) || !hs.challenged(ch->payload)) {
      return Status::error(fmt::format("expected CHALLENGE, got {}", wire::type_name(ch->header.type)));
    }
    s = wire::send_all(conn, wire::encode_frame(Type::kAuth, job_hash, -1, 0, hs.proof(proofs)), deadline);
    if (!s) return s;
    auto ok = wire::recv_frame(conn, job_hash, kMaxHandshakeReply, deadline);
    if (!ok) return ok.status();
    if (ok->header.type == static_cast<uint16_t>(Type::kError)) {
      return Status::error(error_message(*ok) + " (check the job secret given to this worker)");
    }
    if (ok->header.type != static_cast<uint16_t>(Type::kAuthOk) || !hs.verify(proofs, ok->payload)) {
      return Status::error("the server did not prove it knows the job secret (another job, or an impostor)");
    }
    return Status::ok();
  }

  // The reader thread: frames from the driver to dispatch(), until stop, a
  // failure, or a lost connection that cannot be made again.
  void read_loop() {
    std::vector<char> buf;
    size_t len = 0;
    TimePoint frame_deadline = TimePoint::max();
    // A driver still connected may be one a new driver replaced (frozen, or
    // cut off): once a second, between frames, the followed file is looked
    // at, and a worker it points elsewhere leaves this one.
    const bool watch_file = follows();
    while (!stop) {
      pollfd fds[2] = {{fd, POLLIN, 0}, {wake.get(), POLLIN, 0}};
      int n = ::poll(fds, 2, read_wait_ms(len, frame_deadline, watch_file));
      if (n < 0) {
        if (errno == EINTR) continue;
        return fail(fmt::format("rendezvous: poll failed: {}", std::strerror(errno)));
      }
      if (stop || fds[1].revents) return;
      if (n == 0) {
        if (!on_read_timeout(len, frame_deadline, watch_file)) return;
        continue;
      }
      if (buf.size() - len < 65536) buf.resize(len + 65536);
      ssize_t r = ::recv(fd, buf.data() + len, buf.size() - len, 0);
      if (r < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
      if (r <= 0) {
        std::string why = r == 0 ? fmt::format("rendezvous: connection to the driver at {} closed (the driver exited "
                                               "or dropped this worker; its log says why)",
                                               where())
                                 : fmt::format("rendezvous: connection to the driver at {} lost: {}", where(),
                                               std::strerror(errno));
        if (!reconnect(why)) return;
        len = 0;
        frame_deadline = TimePoint::max();
        continue;
      }
      len += static_cast<size_t>(r);
      if (!dispatch_frames(buf, len, frame_deadline)) return;
    }
  }

  // How long the reader's poll waits: until a partial frame's deadline, else
  // a second while the followed file is watched, else until something comes.
  static int read_wait_ms(size_t len, TimePoint frame_deadline, bool watch_file) {
    if (len == 0) return watch_file ? 1000 : -1;
    auto left = frame_deadline - SteadyClock::now();
    return left <= Duration::zero() ? 0 : static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(left).count());
  }

  // A poll that found nothing: a partial frame past its deadline fails the
  // connection; between frames, a driver the followed file says was replaced
  // is left for the new one. False when the reader ends.
  bool on_read_timeout(size_t len, TimePoint& frame_deadline, bool watch_file) {
    if (len > 0 && SteadyClock::now() >= frame_deadline) {
      ::shutdown(fd, SHUT_RDWR);
      fail(fmt::format("rendezvous: the driver at {} stalled mid-message for {:.1f} s", where(),
                       seconds(opt.io_timeout)));
      return false;
    }
    if (len == 0 && watch_file && driver_moved()) {
      ::shutdown(fd, SHUT_RDWR);
      if (!reconnect(fmt::format("rendezvous: the driver at {} was replaced by a new one elsewhere (this "
                                 "worker's agent says so)",
                                 where()))) {
        return false;
      }
      frame_deadline = TimePoint::max();
    }
    return true;
  }

  // Dispatches every whole frame at the start of buf[0, len) and moves the
  // rest of a partial one to the start; its deadline runs from the last
  // progress. False (failed) on a bad frame.
  bool dispatch_frames(std::vector<char>& buf, size_t& len, TimePoint& frame_deadline) {
    size_t off = 0;
    while (len - off >= wire::kHeaderBytes) {
      wire::Header h = wire::decode_header(buf.data() + off);
      if (auto why = wire::check_header(h, job_hash, opt.max_frame_bytes)) {
        ::shutdown(fd, SHUT_RDWR);
        fail(fmt::format("rendezvous: the driver at {} sent a bad frame: {}", where(), *why));
        return false;
      }
      size_t total = wire::kHeaderBytes + h.length;
      if (len - off < total) {
        if (buf.size() < off + total) buf.resize(off + total);
        break;
      }
      wire::Frame f{h, std::string(buf.data() + off + wire::kHeaderBytes, h.length)};
      off += total;
      dispatch(std::move(f));
    }
    std::memmove(buf.data(), buf.data() + off, len - off);
    len -= off;
    if (len == 0) {
      frame_deadline = TimePoint::max();
    } else if (off > 0 || frame_deadline == TimePoint::max()) {
      frame_deadline = SteadyClock::now() + opt.io_timeout;
    }
    return true;
  }

  void dispatch(wire::Frame f) {
    auto type = static_cast<Type>(f.header.type);
    if (type == Type::kHostsUpdated) {
      if (f.header.generation >= gen.load()) {
        if (!f.payload.empty() && f.payload[0] == 1) drain_pending = true;
        hosts_updated = true;
      }
      return;
    }
    if (type == Type::kPeersLost) {
      // Pushed only to members of the generation, after its ASSIGNMENT in
      // the stream: an older generation is one this worker already left.
      long g = static_cast<long>(f.header.generation);
      auto ranks = wire::decode_peers_lost(f.payload);
      if (!ranks || g != gen.load()) return;
      {
        std::lock_guard<std::mutex> lock(mu);
        lost_ranks = *ranks;
        lost_gen = g;
      }
      if (opt.on_peers_lost) opt.on_peers_lost(g, *ranks);
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      if (f.header.request_id == 0) {
        if (type == Type::kError) server_said = error_message(f);
        return;
      }
      auto it = pending.find(f.header.request_id);
      if (it == pending.end()) return;  // its caller gave up waiting
      if (type == Type::kAssignment) {
        // Updated here, in stream order, so a HOSTS_UPDATED right behind the
        // assignment is measured against the new generation.
        gen = static_cast<long>(f.header.generation);
        hosts_updated = false;
        drain_pending = false;
      }
      it->second->frame = std::move(f);
      it->second->done = true;
    }
    cv.notify_all();
  }

  // Sends one request and waits for its reply until `deadline`.
  // With `resend`, a request whose connection was lost waits for the
  // driver to be back (reconnect_within) and is sent again.
  Result<wire::Frame> call(Type type, int64_t generation, const std::string& payload, TimePoint deadline,
                           bool resend = false) {
    if (fd < 0) return Result<wire::Frame>::error("rendezvous: not connected (call connect() first)");
    while (true) {
      Pending p;
      uint32_t id;
      {
        std::unique_lock<std::mutex> lock(mu);
        if (reconnecting && resend) {
          // A join waits for the driver through the whole grace.
          deadline = std::max(deadline, reconnect_until);
          cv.wait_until(lock, deadline, [&] { return !reconnecting || broken; });
        }
        if (broken) return Result<wire::Frame>::error(broken_reason);
        if (reconnecting) {
          return Result<wire::Frame>::error(
              fmt::format("rendezvous: the connection to the driver at {} is lost (trying it again)", where()));
        }
        id = next_request++;
        if (next_request == 0) next_request = 1;
        pending[id] = &p;
      }
      Status sent;
      {
        std::lock_guard<std::mutex> lock(write_mu);
        sent = wire::send_all(fd, wire::encode_frame(type, job_hash, generation, id, payload),
                              std::min(deadline, SteadyClock::now() + opt.io_timeout));
        // A partly written frame leaves the stream unusable: the reader sees
        // it closed and fails or reconnects.
        if (!sent) ::shutdown(fd, SHUT_RDWR);
      }
      if (!sent && opt.reconnect_within <= Duration::zero()) {
        fail(fmt::format("rendezvous: sending to the driver at {} failed: {}", where(), sent.message()));
      }
      std::unique_lock<std::mutex> lock(mu);
      cv.wait_until(lock, deadline, [&] { return p.done || p.lost || broken; });
      pending.erase(id);
      if (p.done) return std::move(p.frame);
      if (p.lost && resend) continue;
      if (p.lost) {
        return Result<wire::Frame>::error(
            fmt::format("rendezvous: the connection to the driver at {} was lost before the reply", where()));
      }
      if (broken) return Result<wire::Frame>::error(broken_reason);
      return Result<wire::Frame>::error(fmt::format("rendezvous: no reply from the driver at {} in time (the driver "
                                                    "is overloaded or unreachable; see its log)",
                                                    where()));
    }
  }

  // TIMING, no reply: dropped while no driver is connected; a send that
  // cannot finish within the I/O timeout breaks the connection as a
  // request's would.
  void report_timing(const wire::Timing& t) {
    const long g = gen.load();
    if (fd < 0 || g < 0) return;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (reconnecting || broken) return;
    }
    std::lock_guard<std::mutex> lock(write_mu);
    Status sent = wire::send_all(fd, wire::encode_frame(Type::kTiming, job_hash, g, 0, wire::encode_timing(t)),
                                 SteadyClock::now() + opt.io_timeout);
    if (!sent) ::shutdown(fd, SHUT_RDWR);
  }

  wire::Frame kv_call(Type type, const std::string& payload, Duration wait, const std::string& what) {
    long g = gen.load();
    if (g < 0) throw CommError("store: " + what + " before join (join a generation first)");
    auto f = call(type, g, payload, SteadyClock::now() + wait);
    if (!f) throw CommError("store: " + what + " failed: " + f.message());
    return std::move(f).value();
  }

  void expect(const wire::Frame& f, Type want, const std::string& what) {
    if (f.header.type == static_cast<uint16_t>(Type::kError)) {
      throw CommError("store: " + what + ": " + error_message(f));
    }
    if (f.header.type != static_cast<uint16_t>(want)) {
      throw CommError(fmt::format("store: {}: unexpected reply {}", what, wire::type_name(f.header.type)));
    }
  }

  Result<RankAssignment> join(const JoinRequest& req, long* generation_out) {
    auto f = call(Type::kJoin, gen.load(), wire::encode_join(req), SteadyClock::now() + opt.join_timeout,
                  /*resend=*/true);
    if (!f) {
      return Result<RankAssignment>::error(
          fmt::format("rendezvous: join of slot {} failed: {}", slot_name(req.slot), f.message()));
    }
    if (f->header.type == static_cast<uint16_t>(Type::kError)) {
      return Result<RankAssignment>::error(
          fmt::format("rendezvous: join of slot {} refused: {}", slot_name(req.slot), error_message(*f)));
    }
    int64_t g = -1;
    auto a = f->header.type == static_cast<uint16_t>(Type::kAssignment) ? wire::decode_assignment(f->payload, &g)
                                                                         : std::nullopt;
    if (!a || g != f->header.generation) {
      return Result<RankAssignment>::error(
          fmt::format("rendezvous: malformed reply {} to join", wire::type_name(f->header.type)));
    }
    a->slot = req.slot;
    if (generation_out) *generation_out = static_cast<long>(g);
    return *a;
  }
};

RendezvousClient::RendezvousClient(ClientOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}
RendezvousClient::~RendezvousClient() = default;
Status RendezvousClient::connect() { return impl_->connect(); }
Result<RankAssignment> RendezvousClient::join(const JoinRequest& request, long* generation_out) {
  return impl_->join(request, generation_out);
}
KvStore& RendezvousClient::store() { return impl_->store; }
bool RendezvousClient::hosts_updated() const { return impl_->hosts_updated.load(); }
bool RendezvousClient::drain_pending() const { return impl_->drain_pending.load(); }
void RendezvousClient::report_timing(uint64_t commit_id, uint64_t commits, uint64_t interval_us, uint64_t wait_us) {
  impl_->report_timing(wire::Timing{commit_id, std::max<uint64_t>(commits, 1), interval_us, std::min(wait_us, interval_us)});
}
long RendezvousClient::generation() const { return impl_->gen.load(); }
long RendezvousClient::peers_lost_generation() const { return impl_->lost_gen.load(); }
std::vector<int> RendezvousClient::peers_lost() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->lost_ranks;
}
bool RendezvousClient::connected() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->fd >= 0 && !impl_->broken;
}

}  // namespace erun
