// Control-plane scale of erun's driver side, in-process.
//   rdzv_scale_bench join N [--connect-parallel P=64]
//     N simulated workers (RendezvousClient objects, one joining thread each,
//     spread over client processes of --per-process 2500 to stay under the
//     fd limit) connect to a real RendezvousServer in a child process, P=64
//     at a time in all; all block in join(), the
//     server side publishes one generation containing all of them as soon as
//     waiting() lists N, and every join returns. Measured on CLOCK_MONOTONIC
//     from the release of the pre-created threads to the last join returned.
//   rdzv_scale_bench plan HOSTS [--reps R=7]
//     The driver's discovery cycle on HOSTS hosts (4 slots each):
//     parse_discovery_output + diff_hosts against the previous set (one host
//     gone, one new) + make_plan over all slots.
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
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

#include "discovery/host_set.h"
#include "rendezvous/rendezvous.h"
#include "runner/planner.h"

using namespace erun;

namespace {

using SteadyClock = std::chrono::steady_clock;
constexpr int kSlotsPerHost = 8;
const char* kJob = "bench-job";
const char* kSecret = "bench-secret-0123456789abcdef";


SlotKey slot_of(int i) { return {"sim" + std::to_string(i / kSlotsPerHost), i % kSlotsPerHost}; }

struct ServerTimes {
  int port = 0;
  double waiting_at = 0, published_at = 0;  // seconds on CLOCK_MONOTONIC
};

double mono_now() { return std::chrono::duration<double>(SteadyClock::now().time_since_epoch()).count(); }

// Child: serves the rendezvous, publishes when all N are waiting, exits when
// the parent closes `quit_fd`.
[[noreturn]] void server_main(int n, int report_fd, int quit_fd) {
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
  auto deadline = SteadyClock::now() + std::chrono::seconds(120);
  while (static_cast<int>(server.waiting().size()) < n) {
    if (SteadyClock::now() > deadline) {
      std::fprintf(stderr, "rdzv_scale_bench: only %zu of %d workers waiting after 120 s\n", server.waiting().size(),
                   n);
      std::_Exit(1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  st.waiting_at = mono_now();
  server.publish(1, ranks);
  st.published_at = mono_now();
  if (::write(report_fd, &st, sizeof(st)) != sizeof(st)) std::_Exit(1);
  char c;
  while (::read(quit_fd, &c, 1) > 0) {
  }
  std::_Exit(0);
}

struct ClientReport {
  int joined = 0, failed = 0;
  double done_at = 0;  // CLOCK_MONOTONIC seconds when its last join returned
};

// A client process: workers [lo, hi). Fds per client (socket, eventfd) keep
// one process to a few thousand under RLIMIT_NOFILE, so the N workers are
// spread over several processes that start together.
[[noreturn]] void clients_main(int lo, int hi, int port, int parallel, pid_t server, int ready_fd, int go_fd,
                               int report_fd) {
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
  ClientReport rep{joined.load(), failed.load(), mono_now()};
  if (::write(report_fd, &rep, sizeof(rep)) != sizeof(rep)) std::_Exit(1);
  std::fflush(stderr);
  std::_Exit(0);  // the clients' sockets close with the process
}

int join_bench(int n, int parallel, int per_process) {
  rlimit rl;
  ::getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = rl.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &rl);
  if (rl.rlim_cur < static_cast<rlim_t>(n) + 64 || rl.rlim_cur < static_cast<rlim_t>(3 * per_process) + 64) {
    std::fprintf(stderr, "rdzv_scale_bench: RLIMIT_NOFILE %llu is too low for %d workers; raise it (ulimit -n)\n",
                 static_cast<unsigned long long>(rl.rlim_cur), n);
    return 1;
  }
  // Two threads per client (the joining one and the client's reader): small stacks.
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 256 << 10);
  pthread_setattr_default_np(&attr);

  int report[2], quit[2], ready[2], go[2], creport[2];
  if (::pipe(report) != 0 || ::pipe(quit) != 0 || ::pipe(ready) != 0 || ::pipe(go) != 0 || ::pipe(creport) != 0)
    return 1;
  pid_t server = ::fork();
  if (server == 0) {
    ::close(report[0]);
    ::close(quit[1]);
    server_main(n, report[1], quit[0]);
  }
  ::close(report[1]);
  ::close(quit[0]);
  ServerTimes st;
  if (::read(report[0], &st, sizeof(st)) != sizeof(st)) return 1;

  const int procs = (n + per_process - 1) / per_process;
  const int par = std::max(1, parallel / procs);
  std::vector<pid_t> kids;
  for (int p = 0; p < procs; ++p) {
    int lo = p * n / procs, hi = (p + 1) * n / procs;
    pid_t pid = ::fork();
    if (pid == 0) clients_main(lo, hi, st.port, par, server, ready[1], go[0], creport[1]);
    kids.push_back(pid);
  }
  ::close(ready[1]);
  ::close(creport[1]);
  char b;
  for (int p = 0; p < procs; ++p)
    if (::read(ready[0], &b, 1) != 1) return 1;
  const double t0 = mono_now();
  std::string gos(procs, 'g');
  if (::write(go[1], gos.data(), gos.size()) != static_cast<ssize_t>(gos.size())) return 1;
  int joined = 0, failed = 0;
  double done = t0;
  for (int p = 0; p < procs; ++p) {
    ClientReport rep;
    if (::read(creport[0], &rep, sizeof(rep)) != sizeof(rep)) {
      failed += 1;
      continue;
    }
    joined += rep.joined;
    failed += rep.failed;
    done = std::max(done, rep.done_at);
  }
  for (pid_t k : kids) ::waitpid(k, nullptr, 0);
  ServerTimes st2;
  bool have_times = ::read(report[0], &st2, sizeof(st2)) == sizeof(st2);
  ::close(quit[1]);
  ::kill(server, SIGKILL);
  ::waitpid(server, nullptr, 0);
  std::printf("JOIN workers=%d joined=%d failed=%d total=%.3f s all_waiting=%.3f s publish=%.3f s "
              "after_publish=%.3f s connect_parallel=%d client_processes=%d\n",
              n, joined, failed, done - t0, have_times ? st2.waiting_at - t0 : -1.0,
              have_times ? st2.published_at - st2.waiting_at : -1.0, have_times ? done - st2.published_at : -1.0,
              par * procs, procs);
  return failed == 0 && joined == n ? 0 : 1;
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
    std::fprintf(stderr, "usage: rdzv_scale_bench join N [--connect-parallel P] | plan HOSTS [--reps R]\n");
    return 2;
  }
  std::string mode = argv[1];
  int n = std::atoi(argv[2]);
  int parallel = 64, reps = 7, per_process = 2500;
  for (int i = 3; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--connect-parallel") == 0) parallel = std::max(1, std::atoi(argv[i + 1]));
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::max(1, std::atoi(argv[i + 1]));
    if (std::strcmp(argv[i], "--per-process") == 0) per_process = std::max(1, std::atoi(argv[i + 1]));
  }
  if (mode == "join") return join_bench(n, parallel, per_process);
  if (mode == "plan") return plan_bench(n, reps);
  std::fprintf(stderr, "rdzv_scale_bench: unknown mode '%s'\n", mode.c_str());
  return 2;
}
