// Cross-host allreduce (float32, sum): N processes bootstrapped over a
// FileKvStore, each "host" on its own loopback address (127.0.0.2, .3, ...) so
// that the traffic goes through TCP, not shared memory:
//   cross_allreduce_bench {tcp|tcp-thread|gloo|hier-tcp|hier-tcp-serial|hier-tcp-pipe|hier-gloo} NP [BYTES...]
// tcp / gloo: one rank per host, erun's TCP transport or Gloo's pairs;
// tcp-thread: the transport as if every rank had a CPU of its own (its large
// rings send on the sender thread even on an oversubscribed machine).
// hier-*: the hierarchical communicator with 2 ranks per host (NP/2 hosts),
// shared memory inside a host and the named transport between hosts;
// hier-tcp-serial / hier-tcp-pipe: its three phases one after the other, or
// pipelined in chunks even on a host without a CPU to spare (hier-tcp decides).
// Per size: warm-up, then 5 repetitions of about 0.3 s each; prints the median time per op (and
// min-max), algbw = bytes/time and busbw = algbw * 2(n-1)/n as nccl-tests
// define them, in the format of shm_allreduce_bench and mpi_allreduce_bench;
// then cpu = user + system CPU of all ranks per allreduce and runq = the time
// their threads spent runnable but waiting for a CPU, per allreduce (on an
// oversubscribed machine, the share of the wall time the scheduler withheld).
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "store/file_store.h"
#include "collectives/gloo/gloo_communicator.h"
#include "collectives/hierarchical.h"
#include "collectives/tcp/tcp_communicator.h"

using namespace erun;

namespace {

std::string host_address(int host) { return "127.0.0." + std::to_string(2 + host); }

// Seconds this process's threads spent runnable but waiting for a CPU
// (the scheduler's run delay, /proc/self/task/*/schedstat; 0 if unreadable).
double run_delay_seconds() {
  double total = 0;
  std::error_code ec;
  for (const auto& t : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    std::ifstream f(t.path() / "schedstat");
    unsigned long long on_cpu = 0, waiting = 0;
    if (f >> on_cpu >> waiting) total += static_cast<double>(waiting) * 1e-9;
  }
  return total;
}

// User + system CPU seconds of this process so far, all its threads.
double cpu_seconds() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

std::unique_ptr<Communicator> make(const std::string& backend, KvStore& store, int rank, int np,
                                   const std::string& secret) {
  const auto timeout = std::chrono::seconds(120);
  if (backend == "gloo") {
    GlooOptions o;
    o.rank = rank;
    o.size = np;
    o.timeout = timeout;
    o.hostname = host_address(rank);
    return make_gloo_communicator(store, o);
  }
  if (backend == "tcp" || backend == "tcp-thread") {
    TcpOptions o;
    o.rank = rank;
    o.size = np;
    o.timeout = timeout;
    o.address = host_address(rank);
    o.job_id = "bench";
    o.secret = secret;
    // Every "host" of this benchmark is this machine; tcp-thread claims a
    // CPU per rank, so that large rings use the sender thread regardless.
    o.machine_ranks = backend == "tcp-thread" ? 1 : np;
    return make_tcp_communicator(store, o);
  }
  // Hierarchical: ranks 2h and 2h+1 on host h.
  HierOptions o;
  o.rank = rank;
  o.size = np;
  o.local_rank = rank % 2;
  o.local_size = 2;
  o.cross_rank = rank / 2;
  o.cross_size = np / 2;
  o.timeout = timeout;
  o.hostname = host_address(rank / 2);
  o.segment_tag = "xbench" + std::to_string(::getppid());
  o.cross = backend == "hier-gloo" ? CrossTransport::kGloo : CrossTransport::kTcp;
  if (backend == "hier-tcp-serial") o.pipeline = HierPipeline::kOff;
  if (backend == "hier-tcp-pipe") o.pipeline = HierPipeline::kOn;
  o.job_id = "bench";
  o.secret = secret;
  return make_hierarchical_communicator(store, o);
}

int rank_main(const std::string& backend, const std::string& dir, int rank, int np, const std::vector<size_t>& sizes,
              const std::string& secret) {
  FileKvStore store(dir);
  auto comm = make(backend, store, rank, np, secret);
  constexpr int kReps = 5;
  for (size_t bytes : sizes) {
    std::vector<float> v(bytes / sizeof(float), 1.0f);
    // Warm up, then size each repetition to about 0.3 s (the slowest rank's
    // warm-up time decides, so that every rank runs the same count).
    auto w0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 3; ++i) comm->allreduce(v, ReduceOp::kSum);
    double per_op = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count() / 3;
    per_op = comm->allreduce_value(per_op, ReduceOp::kMax);
    const size_t iters = std::clamp<size_t>(static_cast<size_t>(0.3 / std::max(per_op, 1e-7)), 3, 2000);
    std::vector<double> times;
    const double cpu0 = cpu_seconds(), delay0 = run_delay_seconds();
    for (int rep = 0; rep < kReps; ++rep) {
      comm->barrier();
      auto start = std::chrono::steady_clock::now();
      for (size_t i = 0; i < iters; ++i) comm->allreduce(v, ReduceOp::kSum);
      double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
      times.push_back(comm->allreduce_value(t, ReduceOp::kMax));
    }
    // CPU of every rank per allreduce (the barriers and the timing
    // allreduces are a small share at the sizes where CPU matters).
    const double cpu = comm->allreduce_value((cpu_seconds() - cpu0) / (kReps * iters), ReduceOp::kSum);
    const double delay = comm->allreduce_value((run_delay_seconds() - delay0) / (kReps * iters), ReduceOp::kSum);
    std::sort(times.begin(), times.end());
    if (rank == 0) {
      const double t = times[kReps / 2];
      const double algbw = bytes / t / 1e9;
      const double busbw = algbw * 2.0 * (np - 1) / np;
      std::printf("np=%d bytes=%zu iters=%zu time=%.2f us min=%.2f us max=%.2f us algbw=%.3f GB/s busbw=%.3f GB/s "
                  "cpu=%.2f us runq=%.2f us backend=%s\n", np, bytes, iters, t * 1e6, times.front() * 1e6, times.back() * 1e6, algbw,
                  busbw, cpu * 1e6, delay * 1e6, backend.c_str());
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s {tcp|tcp-thread|gloo|hier-tcp|hier-tcp-serial|hier-tcp-pipe|hier-gloo} NP [BYTES...]\n", argv[0]);
    return 2;
  }
  const std::string backend = argv[1];
  if (backend != "tcp" && backend != "tcp-thread" && backend != "gloo" && backend != "hier-tcp" && backend != "hier-gloo" &&
      backend != "hier-tcp-serial" && backend != "hier-tcp-pipe") {
    std::fprintf(stderr, "cross_allreduce_bench: unknown backend '%s' (tcp, tcp-thread, gloo, hier-tcp, hier-tcp-serial, "
                 "hier-tcp-pipe or hier-gloo)\n", argv[1]);
    return 2;
  }
  const int np = std::atoi(argv[2]);
  if (np < 1 || (backend.rfind("hier", 0) == 0 && (np < 4 || np % 2))) {
    std::fprintf(stderr, "cross_allreduce_bench: NP=%s: give >= 1 (hier-*: an even number >= 4)\n", argv[2]);
    return 2;
  }
  std::vector<size_t> sizes;
  for (int i = 3; i < argc; ++i) sizes.push_back(std::strtoull(argv[i], nullptr, 10));
  if (sizes.empty()) sizes = {4096, size_t{64} << 10, size_t{1} << 20, size_t{16} << 20, size_t{64} << 20};
  char tmpl[] = "/tmp/erun_xbench_XXXXXX";
  if (!::mkdtemp(tmpl)) return 1;
  // The ranks' shared job secret, made before fork and never in argv.
  // (from /dev/urandom: OpenSSL used before fork leaves Gloo's children stuck)
  std::string secret(32, '\0');
  {
    std::ifstream urandom("/dev/urandom", std::ios::binary);
    if (!urandom.read(secret.data(), static_cast<std::streamsize>(secret.size()))) return 1;
  }
  std::vector<pid_t> pids;
  std::fflush(nullptr);
  for (int r = 0; r < np; ++r) {
    pid_t pid = ::fork();
    if (pid == 0) {
      int code = 1;
      try {
        code = rank_main(backend, tmpl, r, np, sizes, secret);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
      }
      std::_Exit(code);
    }
    pids.push_back(pid);
  }
  int failed = 0;
  for (pid_t p : pids) {
    int status = 0;
    ::waitpid(p, &status, 0);
    failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  std::filesystem::remove_all(tmpl);
  return failed ? 1 : 0;
}
