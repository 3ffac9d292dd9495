// Control-plane scale of erun's driver side, in-process.
//   rdzv_scale_bench join N [--clients raw|threads] [--inflight P=512]
//                           [--connect-parallel P=64] [--per-process 2500]
//                           [--via-agents K]
//     N simulated workers join one generation of a real RendezvousServer in a
//     child process that acts as the driver does: one snapshot() every 5 ms
//     tick, and publish() of one generation with all N as soon as the snapshot
//     lists N waiting. Measured on CLOCK_MONOTONIC from the release of the
//     clients to the last join returned.
//     --clients raw (default): one client process, one epoll loop driving N
//       raw connections through the real handshake (HMAC proofs both ways),
//       JOIN and ASSIGNMENT with wire.h's codec; at most P=512 of them between
//       connect() and JOIN at a time. The server is what is measured. Source
//       addresses are spread over 127.0.0.2, .3, ... (2,000 workers each) so
//       that 100,000 connections fit the ephemeral ports.
//     --via-agents K: the N workers join through simulated agents, K per
//       host: one raw connection per host, through the real handshake once,
//       then K JOINs as RELAY frames in one write, and K ASSIGNMENTs back on
//       it (docs/protocol.md, "Relaying"). The same invocation first measures
//       N direct raw workers as the peer (skipped, and said, when N direct
//       connections are over the open-file limit).
//     --clients threads: RendezvousClient objects, each with its joining
//       thread (and the client's reader thread), spread over client processes
//       of --per-process 2500, 64 connecting at a time: the real client, at a
//       smaller N, as a check.
//   rdzv_scale_bench plan HOSTS [--reps R=7]
//     The driver's discovery cycle on HOSTS hosts (4 slots each):
//     parse_discovery_output + diff_hosts against the previous set (one host
//     gone, one new) + make_plan over all slots.
//   rdzv_scale_bench auth [--reps R=20000]
//     The server's authentication cost per connection: a nonce, the client's
//     proof checked, its own proof made.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <latch>
#include <memory>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "discovery/host_set.h"
#include "rendezvous/rendezvous.h"
#include "rendezvous/wire.h"
#include "runner/hosts/planner.h"

using namespace erun;

namespace {

using SteadyClock = std::chrono::steady_clock;
constexpr int kSlotsPerHost = 8;
constexpr int kWorkersPerSource = 2000;  // raw clients per source address (the kernel searches free ports linearly)
constexpr auto kDriverTick = std::chrono::milliseconds(5);  // runner/driver.cc's kTick
const char* kJob = "bench-job";
const char* kSecret = "bench-secret-0123456789abcdef";


SlotKey slot_of(int i) { return {"sim" + std::to_string(i / kSlotsPerHost), i % kSlotsPerHost}; }

struct ServerTimes {
  int port = 0;
  double waiting_at = 0, published_at = 0;  // seconds on CLOCK_MONOTONIC
  double max_snapshot_ms = 0;      // the most CPU one snapshot() took while workers joined
  double median_snapshot_ms = 0;   // the median of those
  double members_snapshot_ms = 0;  // CPU of snapshot() with all N members (median of 5)
  double cpu_s = 0;             // the server process's user + system CPU until the last member showed
};

double cpu_seconds() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

// Raises the open-file limit to `want` (the hard limit too: the benchmark runs
// as root on the test machines); false when it stays below.
bool raise_nofile(rlim_t want) {
  rlimit rl{};
  ::getrlimit(RLIMIT_NOFILE, &rl);
  if (rl.rlim_cur >= want) return true;
  rlimit more{std::max(rl.rlim_cur, want), std::max(rl.rlim_max, want)};
  if (::setrlimit(RLIMIT_NOFILE, &more) == 0) return true;
  more = {rl.rlim_max, rl.rlim_max};
  ::setrlimit(RLIMIT_NOFILE, &more);
  return more.rlim_cur >= want;
}

double mono_now() { return std::chrono::duration<double>(SteadyClock::now().time_since_epoch()).count(); }

// Child: serves the rendezvous, publishes when all N are waiting, exits when
// the parent closes `quit_fd`.
[[noreturn]] void server_main(int n, int connections, int report_fd, int quit_fd) {
  if (!raise_nofile(static_cast<rlim_t>(connections) + 256)) {
    std::fprintf(stderr, "rdzv_scale_bench: cannot raise the open-file limit to %d for the server\n",
                 connections + 256);
    std::_Exit(1);
  }
  ServerOptions so;
  so.job_id = kJob;
  so.secret = kSecret;
  so.bind_address = "127.0.0.1";
  so.io_timeout = std::chrono::seconds(60);
  RendezvousServer server(so);
  ServerTimes st;
  if (!server.start().is_ok()) {
    std::fprintf(stderr, "rdzv_scale_bench: server did not start\n");
    std::_Exit(1);
  }
  st.port = server.port();
  if (::write(report_fd, &st, sizeof(st)) != sizeof(st)) std::_Exit(1);
  std::vector<RankAssignment> ranks(n);
  for (int i = 0; i < n; ++i) {
    ranks[i].slot = slot_of(i);
    ranks[i].rank = i;
    ranks[i].size = n;
    ranks[i].local_rank = i % kSlotsPerHost;
    ranks[i].local_size = kSlotsPerHost;
    ranks[i].cross_rank = i / kSlotsPerHost;
    ranks[i].cross_size = (n + kSlotsPerHost - 1) / kSlotsPerHost;
  }
  // The driver's loop: one snapshot per tick.
  // CPU time of the calling thread: on a shared machine a wall-clock time
  // would also count the waits for a core.
  auto thread_ms = [] {
    timespec ts{};
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
  };
  auto timed_snapshot = [&](double* ms) {
    double t = thread_ms();
    MembershipSnapshot snap = server.snapshot();
    *ms = thread_ms() - t;
    return snap;
  };
  auto deadline = SteadyClock::now() + std::chrono::seconds(300);
  std::vector<double> joining_ms;
  while (true) {
    double ms = 0;
    auto snap = timed_snapshot(&ms);
    joining_ms.push_back(ms);
    st.max_snapshot_ms = std::max(st.max_snapshot_ms, ms);
    if (static_cast<int>(snap.waiting.size()) >= n) break;
    if (SteadyClock::now() > deadline) {
      std::fprintf(stderr, "rdzv_scale_bench: only %zu of %d workers waiting after 300 s\n", snap.waiting.size(), n);
      std::_Exit(1);
    }
    std::this_thread::sleep_for(kDriverTick);
  }
  st.waiting_at = mono_now();
  std::sort(joining_ms.begin(), joining_ms.end());
  st.median_snapshot_ms = joining_ms[joining_ms.size() / 2];
  server.publish(1, ranks);
  st.published_at = mono_now();
  std::vector<double> member_ms;
  while (true) {
    double ms = 0;
    auto snap = timed_snapshot(&ms);
    if (static_cast<int>(snap.members.size()) >= n) {
      member_ms.push_back(ms);
      if (member_ms.size() == 1) st.cpu_s = cpu_seconds();
      if (member_ms.size() == 5) break;
    }
    if (SteadyClock::now() > deadline) {
      std::fprintf(stderr, "rdzv_scale_bench: only %zu of %d members after 300 s\n", snap.members.size(), n);
      std::_Exit(1);
    }
    std::this_thread::sleep_for(kDriverTick);
  }
  std::sort(member_ms.begin(), member_ms.end());
  st.members_snapshot_ms = member_ms[2];
  if (::write(report_fd, &st, sizeof(st)) != sizeof(st)) std::_Exit(1);
  char c;
  while (::read(quit_fd, &c, 1) > 0) {
  }
  std::_Exit(0);
}

// A client process keeps its connections open until the parent closes the
// hold pipe (after the server saw every worker as a member).
void hold_until_closed(int hold_fd) {
  char c;
  while (::read(hold_fd, &c, 1) > 0) {
  }
}

struct ClientReport {
  int joined = 0, failed = 0;
  double done_at = 0;  // CLOCK_MONOTONIC seconds when its last join returned
  double cpu_s = 0;    // the client process's user + system CPU
};

// A client process: workers [lo, hi). Fds per client (socket, eventfd) keep
// one process to a few thousand under RLIMIT_NOFILE, so the N workers are
// spread over several processes that start together.
[[noreturn]] void clients_main(int lo, int hi, int port, int parallel, pid_t server, int ready_fd, int go_fd,
                               int report_fd, int hold_fd) {
  std::vector<std::unique_ptr<RendezvousClient>> clients;
  clients.reserve(hi - lo);
  for (int i = lo; i < hi; ++i) {
    ClientOptions co;
    co.address = "127.0.0.1";
    co.port = port;
    co.job_id = kJob;
    co.secret = kSecret;
    co.io_timeout = std::chrono::seconds(60);
    co.join_timeout = std::chrono::seconds(120);
    clients.push_back(std::make_unique<RendezvousClient>(co));
  }
  // `parallel` connector threads connect the clients in order and hand each
  // to its own joining thread (one futex wake per hand-off, no herd).
  const int count = hi - lo;
  std::vector<std::promise<bool>> connected(count);
  std::latch go(1);
  std::atomic<int> failed{0}, joined{0}, next{0};
  std::vector<std::thread> joiners, connectors;
  joiners.reserve(count);
  for (int k = 0; k < count; ++k) {
    joiners.emplace_back([&, k, fut = connected[k].get_future()]() mutable {
      if (!fut.get()) return;
      JoinRequest req;
      req.slot = slot_of(lo + k);
      req.pid = lo + k + 1;  // a positive, distinct pid per simulated worker (0 is refused)
      long gen = -1;
      auto r = clients[k]->join(req, &gen);
      if (!r.is_ok()) {
        if (failed++ == 0) std::fprintf(stderr, "client %d: join: %s\n", lo + k, r.message().c_str());
        return;
      }
      joined++;
    });
  }
  for (int t = 0; t < parallel; ++t) {
    connectors.emplace_back([&] {
      go.wait();
      for (int k = next++; k < count; k = next++) {
        Status s = clients[k]->connect();
        if (!s.is_ok()) {
          // The generation can never complete: stop the server so that every join fails fast.
          if (failed++ == 0) std::fprintf(stderr, "client %d: connect: %s\n", lo + k, s.message().c_str());
          ::kill(server, SIGKILL);
        }
        connected[k].set_value(s.is_ok());
      }
    });
  }
  char b = 'r';
  if (::write(ready_fd, &b, 1) != 1 || ::read(go_fd, &b, 1) != 1) std::_Exit(1);
  go.count_down();
  for (auto& t : connectors) t.join();
  for (auto& t : joiners) t.join();
  ClientReport rep{joined.load(), failed.load(), mono_now(), cpu_seconds()};
  if (::write(report_fd, &rep, sizeof(rep)) != sizeof(rep)) std::_Exit(1);
  std::fflush(stderr);
  hold_until_closed(hold_fd);
  std::_Exit(0);  // the clients' sockets close with the process
}

// ---- raw simulated workers ---------------------------------------------------

// One simulated worker's connection, or one simulated agent's relay
// connection carrying `count` workers, driven by the raw client's event loop
// through the real handshake and JOIN of docs/protocol.md (wire.h's codec and
// HMAC proofs), without a RendezvousClient and its two threads.
struct RawConn {
  enum class Step { kConnecting, kChallenge, kAuthOk, kAssignment, kDone };
  int fd = -1;
  int index = 0;     // the (first) simulated worker
  int count = 1;     // workers on this connection
  bool relayed = false;
  int assigned = 0;  // of them
  Step step = Step::kConnecting;
  std::string client_nonce, server_nonce;
  std::string rbuf;
};

// Sends a whole (small) frame on a fresh socket; a short write of a frame this
// small only happens when the socket is broken.
bool send_small(int fd, const std::string& f) {
  return ::send(fd, f.data(), f.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(f.size());
}

// The source address of simulated worker i: Linux routes all of 127/8 to the
// loopback device, and each source address has its own ~28,000 ephemeral
// ports towards the server's one address and port.
in_addr_t source_of(int i) { return htonl((127u << 24) + 2u + static_cast<uint32_t>(i / kWorkersPerSource)); }

// Workers [lo, hi), `per_conn` on each connection (0: each its own, direct;
// K: relayed, K per simulated agent): at most `inflight` connections between
// connect() and their JOINs sent at any time (a burst of workers starting
// together); every joined connection stays open until its ASSIGNMENTs
// arrive and are checked.
[[noreturn]] void raw_clients_main(int lo, int hi, int n, int per_conn, int port, int inflight, int ready_fd,
                                   int go_fd, int report_fd, int hold_fd) {
  const uint64_t jh = handshake::job_hash(kJob);
  int ep = ::epoll_create1(EPOLL_CLOEXEC);
  const int k = std::max(1, per_conn);
  std::vector<RawConn> conns((hi - lo + k - 1) / k);
  int next = 0, handshaking = 0, joined = 0, failed = 0;
  std::string first_error;
  auto fail = [&](RawConn& c, std::string why) {
    if (failed == 0) first_error = fmt::format("worker {}: {}", c.index, why);
    failed += c.count - c.assigned;
    if (c.fd >= 0) ::close(c.fd);
    c.fd = -1;
    if (c.step != RawConn::Step::kAssignment) --handshaking;
    c.step = RawConn::Step::kDone;
  };
  auto start_one = [&]() {
    RawConn& c = conns[next];
    c.index = lo + next++ * k;
    c.count = std::min(k, hi - c.index);
    c.relayed = per_conn > 0;
    ++handshaking;
    c.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c.fd < 0) return fail(c, fmt::format("socket: {}", std::strerror(errno)));
    int one = 1;
    ::setsockopt(c.fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one));
    ::setsockopt(c.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    sockaddr_in src{};
    src.sin_family = AF_INET;
    src.sin_addr.s_addr = source_of(c.index);
    if (::bind(c.fd, reinterpret_cast<sockaddr*>(&src), sizeof(src)) != 0) {
      return fail(c, fmt::format("bind: {}", std::strerror(errno)));
    }
    sockaddr_in dst{};
    dst.sin_family = AF_INET;
    dst.sin_port = htons(static_cast<uint16_t>(port));
    dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(c.fd, reinterpret_cast<sockaddr*>(&dst), sizeof(dst)) != 0 && errno != EINPROGRESS) {
      return fail(c, fmt::format("connect: {}", std::strerror(errno)));
    }
    epoll_event ev{};
    ev.events = EPOLLOUT;
    ev.data.u32 = static_cast<uint32_t>(&c - conns.data());
    ::epoll_ctl(ep, EPOLL_CTL_ADD, c.fd, &ev);
  };
  // One frame arrived for `c`: the next step of its handshake or its assignment.
  auto on_frame = [&](RawConn& c, const wire::Header& h, std::string_view payload) {
    using wire::Type;
    auto type = static_cast<Type>(h.type);
    if (type == Type::kError) {
      auto m = wire::decode_str(payload);
      return fail(c, "server said: " + (m ? *m : std::string("?")));
    }
    switch (c.step) {
      case RawConn::Step::kChallenge: {
        if (type != Type::kChallenge || payload.size() != wire::kNonceBytes) return fail(c, "expected CHALLENGE");
        c.server_nonce.assign(payload);
        auto proof = wire::client_proof(kSecret, c.server_nonce, kJob, c.client_nonce);
        if (!send_small(c.fd, wire::encode_frame(Type::kAuth, jh, -1, 2, proof))) return fail(c, "send AUTH");
        c.step = RawConn::Step::kAuthOk;
        return;
      }
      case RawConn::Step::kAuthOk: {
        if (type != Type::kAuthOk) return fail(c, "expected AUTH_OK");
        if (!handshake::equal_ct(payload, wire::server_proof(kSecret, c.client_nonce, kJob, c.server_nonce))) {
          return fail(c, "the server's proof is wrong");
        }
        std::string joins;
        for (int w = 0; w < c.count; ++w) {
          JoinRequest req;
          req.slot = slot_of(c.index + w);
          req.pid = c.index + w + 1;
          std::string f = wire::encode_frame(Type::kJoin, jh, -1, 3, wire::encode_join(req));
          joins += c.relayed ? wire::encode_relay(jh, static_cast<uint32_t>(w + 1), f) : f;
        }
        if (!send_small(c.fd, joins)) return fail(c, "send JOIN");
        c.step = RawConn::Step::kAssignment;
        --handshaking;
        return;
      }
      case RawConn::Step::kAssignment: {
        int worker = c.index;
        wire::RelayedFrame inner;
        if (c.relayed) {
          if (type != Type::kRelay || wire::decode_relay(payload, jh, 1 << 20, &inner) || inner.stream < 1 ||
              static_cast<int>(inner.stream) > c.count) {
            return fail(c, "expected a RELAY frame of one of its streams");
          }
          type = static_cast<Type>(inner.header.type);
          payload = inner.payload;
          worker += static_cast<int>(inner.stream) - 1;
        }
        int64_t g = -1;
        auto a = type == Type::kAssignment ? wire::decode_assignment(payload, &g) : std::nullopt;
        if (!a || a->rank != worker || a->size != n || g != 1) return fail(c, "wrong or malformed ASSIGNMENT");
        ++joined;
        if (++c.assigned == c.count) c.step = RawConn::Step::kDone;
        return;
      }
      default: return fail(c, "unexpected frame");
    }
  };
  char b = 'r';
  if (::write(ready_fd, &b, 1) != 1 || ::read(go_fd, &b, 1) != 1) std::_Exit(1);
  const int count = hi - lo;
  const int nconns = static_cast<int>(conns.size());
  std::vector<epoll_event> events(1024);
  std::vector<char> buf(4096);
  while (joined + failed < count) {
    while (next < nconns && handshaking < inflight) start_one();
    int k = ::epoll_wait(ep, events.data(), static_cast<int>(events.size()), 120'000);
    if (k <= 0) {
      if (k < 0 && errno == EINTR) continue;
      std::fprintf(stderr, "raw clients: nothing happened for 120 s (%d of %d joined)\n", joined, count);
      break;
    }
    for (int e = 0; e < k; ++e) {
      RawConn& c = conns[events[e].data.u32];
      if (c.fd < 0) continue;
      if (c.step == RawConn::Step::kConnecting) {
        int err = 0;
        socklen_t len = sizeof(err);
        ::getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0) {
          fail(c, fmt::format("connect: {}", std::strerror(err)));
          continue;
        }
        c.client_nonce = handshake::random_bytes(wire::kNonceBytes);
        if (!send_small(c.fd, wire::encode_frame(wire::Type::kHello, jh, -1, 1, c.client_nonce))) {
          fail(c, "send HELLO");
          continue;
        }
        c.step = RawConn::Step::kChallenge;
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.u32 = events[e].data.u32;
        ::epoll_ctl(ep, EPOLL_CTL_MOD, c.fd, &ev);
        continue;
      }
      ssize_t got = ::recv(c.fd, buf.data(), buf.size(), 0);
      if (got <= 0) {
        if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        fail(c, got == 0 ? std::string("closed by the server") : fmt::format("recv: {}", std::strerror(errno)));
        continue;
      }
      c.rbuf.append(buf.data(), static_cast<size_t>(got));
      size_t off = 0;
      while (c.fd >= 0 && c.rbuf.size() - off >= wire::kHeaderBytes) {
        wire::Header h = wire::decode_header(c.rbuf.data() + off);
        if (auto why = wire::check_header(h, jh, 1 << 20)) {
          fail(c, *why);
          break;
        }
        if (c.rbuf.size() - off < wire::kHeaderBytes + h.length) break;
        on_frame(c, h, std::string_view(c.rbuf).substr(off + wire::kHeaderBytes, h.length));
        off += wire::kHeaderBytes + h.length;
      }
      c.rbuf.erase(0, off);
    }
  }
  ClientReport rep{joined, failed, mono_now(), cpu_seconds()};
  if (!first_error.empty()) std::fprintf(stderr, "raw clients: %d failed; the first: %s\n", failed, first_error.c_str());
  if (::write(report_fd, &rep, sizeof(rep)) != sizeof(rep)) std::_Exit(1);
  std::fflush(stderr);
  hold_until_closed(hold_fd);
  std::_Exit(0);
}

// per_conn: 0 direct workers, K workers per simulated agent's relay connection.
int join_bench(int n, bool raw, int per_conn, int parallel, int inflight, int per_process) {
  const int connections = per_conn > 0 ? (n + per_conn - 1) / per_conn : n;
  if (!raise_nofile(static_cast<rlim_t>(connections) + 256)) {
    rlimit rl{};
    ::getrlimit(RLIMIT_NOFILE, &rl);
    std::fprintf(stderr, "rdzv_scale_bench: %d connections need %d open files in the server process, over the "
                 "open-file hard limit %llu, which this process cannot raise (it needs CAP_SYS_RESOURCE): run as "
                 "root with `ulimit -Hn %d`, use fewer workers, or join through agents (--via-agents 8)\n",
                 connections, connections + 256, static_cast<unsigned long long>(rl.rlim_max), connections + 256);
    return 1;
  }
  // Two threads per client (the joining one and the client's reader): small stacks.
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 256 << 10);
  pthread_setattr_default_np(&attr);

  int report[2], quit[2], ready[2], go[2], creport[2], hold[2];
  if (::pipe(report) != 0 || ::pipe(quit) != 0 || ::pipe(ready) != 0 || ::pipe(go) != 0 || ::pipe(creport) != 0)
    return 1;
  pid_t server = ::fork();
  if (server == 0) {
    ::close(report[0]);
    ::close(quit[1]);
    server_main(n, connections, report[1], quit[0]);
  }
  ::close(report[1]);
  ::close(quit[0]);
  ServerTimes st;
  if (::read(report[0], &st, sizeof(st)) != sizeof(st)) return 1;
  if (::pipe(hold) != 0) return 1;  // after the server's fork: only the parent holds its write end

  const int procs = raw ? 1 : (n + per_process - 1) / per_process;
  const int par = std::max(1, parallel / procs);
  std::vector<pid_t> kids;
  for (int p = 0; p < procs; ++p) {
    int lo = p * n / procs, hi = (p + 1) * n / procs;
    pid_t pid = ::fork();
    if (pid == 0) {
      ::close(hold[1]);
      if (raw) raw_clients_main(lo, hi, n, per_conn, st.port, inflight, ready[1], go[0], creport[1], hold[0]);
      clients_main(lo, hi, st.port, par, server, ready[1], go[0], creport[1], hold[0]);
    }
    kids.push_back(pid);
  }
  ::close(ready[1]);
  ::close(creport[1]);
  ::close(hold[0]);
  char b;
  for (int p = 0; p < procs; ++p)
    if (::read(ready[0], &b, 1) != 1) return 1;
  const double t0 = mono_now();
  std::string gos(procs, 'g');
  if (::write(go[1], gos.data(), gos.size()) != static_cast<ssize_t>(gos.size())) return 1;
  int joined = 0, failed = 0;
  double done = t0, client_cpu = 0;
  for (int p = 0; p < procs; ++p) {
    ClientReport rep;
    if (::read(creport[0], &rep, sizeof(rep)) != sizeof(rep)) {
      failed += 1;
      continue;
    }
    joined += rep.joined;
    client_cpu += rep.cpu_s;
    failed += rep.failed;
    done = std::max(done, rep.done_at);
  }
  ServerTimes st2;
  bool have_times = failed == 0 && ::read(report[0], &st2, sizeof(st2)) == sizeof(st2);
  ::close(hold[1]);
  for (pid_t k : kids) ::waitpid(k, nullptr, 0);
  ::close(quit[1]);
  ::kill(server, SIGKILL);
  ::waitpid(server, nullptr, 0);
  double load[1] = {-1};
  ::getloadavg(load, 1);
  std::printf("JOIN workers=%d via=%s connections=%d joined=%d failed=%d total=%.3f s all_waiting=%.3f s "
              "publish=%.3f s after_publish=%.3f s clients=%s %s=%d client_processes=%d server_cpu=%.3f s "
              "client_cpu=%.3f s snapshot_median=%.2f ms snapshot_max=%.2f ms snapshot_members=%.2f ms load=%.2f\n",
              n, per_conn > 0 ? fmt::format("agents(K={})", per_conn).c_str() : "direct", connections, joined, failed,
              done - t0, have_times ? st2.waiting_at - t0 : -1.0,
              have_times ? st2.published_at - st2.waiting_at : -1.0, have_times ? done - st2.published_at : -1.0,
              raw ? "raw" : "threads", raw ? "inflight" : "connect_parallel", raw ? inflight : par * procs, procs,
              have_times ? st2.cpu_s : -1.0, client_cpu, have_times ? st2.median_snapshot_ms : -1.0,
              have_times ? st2.max_snapshot_ms : -1.0,
              have_times ? st2.members_snapshot_ms : -1.0, load[0]);
  return failed == 0 && joined == n ? 0 : 1;
}

// What one connection's authentication costs the server: the nonce it sends,
// the client's proof it checks, and its own proof; as the server does it (the
// secret's HMAC pads computed once, nonces drawn 128 at a time) and with the
// one-shot functions (an HMAC key setup and a CSPRNG call each).
int auth_bench(int reps) {
  const std::string client_nonce = handshake::random_bytes(wire::kNonceBytes);
  const std::string client_says = wire::client_proof(kSecret, std::string(wire::kNonceBytes, 'x'), kJob, client_nonce);
  auto per_connection_us = [&](auto&& one) {
    int ok = 0;
    auto t0 = SteadyClock::now();
    for (int i = 0; i < reps; ++i) ok += one(i);
    double us = std::chrono::duration<double, std::micro>(SteadyClock::now() - t0).count() / reps;
    return ok == reps ? us : -1.0;
  };
  // One shot: HMAC() per proof over the documented message (docs/protocol.md, "Handshake").
  const std::string job = PayloadWriter().bytes(kJob).str();
  double oneshot = per_connection_us([&](int) {
    std::string server_nonce = handshake::random_bytes(wire::kNonceBytes);
    bool match = handshake::equal_ct(
        handshake::hmac_sha256(kSecret, "erun-client-v1" + server_nonce + job + client_nonce), client_says);
    return !match && handshake::hmac_sha256(kSecret, "erun-server-v1" + client_nonce + job + server_nonce).size() ==
                         wire::kMacBytes;
  });
  // The server's way: the secret keyed once, nonces drawn 128 at a time.
  const handshake::Proofs proofs = wire::proofs(kSecret, kJob);
  handshake::NoncePool nonces;
  double server = per_connection_us([&](int) {
    handshake::Responder hs;
    bool match = hs.hello(client_nonce, &nonces) && hs.verify(proofs, client_says);
    return !match && hs.proof(proofs).size() == wire::kMacBytes;
  });
  std::printf("AUTH reps=%d server=%.2f us oneshot=%.2f us (per connection: 1 nonce + 2 HMAC-SHA256)\n", reps, server,
              oneshot);
  return server > 0 && oneshot > 0 ? 0 : 1;
}

int plan_bench(int hosts, int reps) {
  auto host_text = [](int first, int count) {
    std::string s;
    for (int i = first; i < first + count; ++i) s += "node" + std::to_string(i) + ":4\n";
    return s;
  };
  const std::string before_text = host_text(0, hosts), after_text = host_text(1, hosts);
  auto before = parse_discovery_output(before_text, 1);
  if (!before.is_ok()) return 1;
  Plan previous = make_plan(1, *before, hosts * 4, nullptr);
  std::vector<double> parse_t, diff_t, plan_t, total_t;
  for (int r = 0; r < reps + 1; ++r) {
    auto t0 = SteadyClock::now();
    auto after = parse_discovery_output(after_text, 1);
    auto t1 = SteadyClock::now();
    HostDiff d = diff_hosts(*before, *after);
    auto t2 = SteadyClock::now();
    Plan p = make_plan(2, *after, hosts * 4, &previous);
    auto t3 = SteadyClock::now();
    if (!after.is_ok() || d.added.size() != 1 || d.removed.size() != 1 || p.size() != hosts * 4) {
      std::fprintf(stderr, "rdzv_scale_bench: unexpected plan cycle result\n");
      return 1;
    }
    if (r == 0) continue;  // warm-up
    auto sec = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
    parse_t.push_back(sec(t0, t1));
    diff_t.push_back(sec(t1, t2));
    plan_t.push_back(sec(t2, t3));
    total_t.push_back(sec(t0, t3));
  }
  auto med = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::sort(total_t.begin(), total_t.end());
  std::printf("PLAN hosts=%d slots=%d reps=%d parse=%.3f ms diff=%.3f ms plan=%.3f ms total=%.3f ms min=%.3f ms "
              "max=%.3f ms\n",
              hosts, hosts * 4, reps, med(parse_t) * 1e3, med(diff_t) * 1e3, med(plan_t) * 1e3, med(total_t) * 1e3,
              total_t.front() * 1e3, total_t.back() * 1e3);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc < 3) {
    std::fprintf(stderr, "usage: rdzv_scale_bench join N [--clients raw|threads] [--inflight P] [--connect-parallel P] "
                 "[--via-agents K] | plan HOSTS "
                 "[--reps R] | auth REPS\n");
    return 2;
  }
  std::string mode = argv[1];
  int n = std::atoi(argv[2]);
  int parallel = 64, reps = 7, per_process = 2500, inflight = 512, via_agents = 0;
  bool raw = true;
  for (int i = 3; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--clients") == 0) raw = std::strcmp(argv[i + 1], "threads") != 0;
    if (std::strcmp(argv[i], "--inflight") == 0) inflight = std::max(1, std::atoi(argv[i + 1]));
    if (std::strcmp(argv[i], "--connect-parallel") == 0) parallel = std::max(1, std::atoi(argv[i + 1]));
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::max(1, std::atoi(argv[i + 1]));
    if (std::strcmp(argv[i], "--per-process") == 0) per_process = std::max(1, std::atoi(argv[i + 1]));
    if (std::strcmp(argv[i], "--via-agents") == 0) via_agents = std::max(1, std::atoi(argv[i + 1]));
  }
  if (mode == "join" && via_agents > 0) {
    // The peer first: N direct workers, when N connections fit the open-file limit.
    rlimit rl{};
    ::getrlimit(RLIMIT_NOFILE, &rl);
    int direct = 0;
    if (static_cast<rlim_t>(n) + 256 <= rl.rlim_max) {
      direct = join_bench(n, true, 0, parallel, inflight, per_process);
    } else {
      std::printf("JOIN workers=%d via=direct skipped: %d connections are over the open-file hard limit %llu\n", n,
                  n, static_cast<unsigned long long>(rl.rlim_max));
    }
    int relayed = join_bench(n, true, via_agents, parallel, inflight, per_process);
    return direct != 0 ? direct : relayed;
  }
  if (mode == "join") return join_bench(n, raw, 0, parallel, inflight, per_process);
  if (mode == "auth") return auth_bench(n > 0 ? n : 20000);
  if (mode == "plan") return plan_bench(n, reps);
  std::fprintf(stderr, "rdzv_scale_bench: unknown mode '%s'\n", mode.c_str());
  return 2;
}
