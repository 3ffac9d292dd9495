// Allreduce (float32, sum) of erun's CPU communicators among N local
// processes bootstrapped over a FileKvStore in a temp dir:
//   shm_allreduce_bench [shm|tcp|gloo|hier|hier2] [--step B] [--small B] [--reduce-scatter] NP [BYTES...]
// (backend default: shm; --step/--small set ShmOptions' staging sizes;
// --reduce-scatter also times Communicator::reduce_scatter of the same
// BYTES in all, split evenly, right after the allreduce of each size:
// busbw = algbw * (n-1)/n for it, as nccl-tests define it; and then the
// base class's reduce-scatter, an allreduce of a copy, as op
// reduce_scatter_fallback: what a backend without its own one runs)
// (default sizes 4 KiB, 64 KiB, 1 MiB, 16 MiB, 64 MiB, 256 MiB). "hier" is the
// hierarchical factory with every rank on one host (what erun::init() builds);
// "hier2" the hierarchical communicator of two simulated hosts, 127.0.0.2
// (ranks 0 .. NP/2-1) and 127.0.0.3 (the rest), each its own shm segment,
// their leaders over erun's TCP transport;
// "tcp" is erun's TCP transport with rank r on 127.0.0.(2+r), every rank
// counted on this machine (TcpOptions::machine_ranks = NP).
// Per size: warm-up, then 5 repetitions; prints the median time per op (and
// min-max over repetitions), algbw = bytes/time and busbw = algbw * 2(n-1)/n,
// as nccl-tests define them. The slowest rank's time counts.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "store/file_store.h"
#include "collectives/gloo/gloo_communicator.h"
#include "collectives/hierarchical.h"
#include "collectives/shm/shm_communicator.h"
#include "collectives/tcp/tcp_communicator.h"

using namespace erun;

namespace {

size_t g_step = 0, g_small = 0;
bool g_reduce_scatter = false;

std::unique_ptr<Communicator> make(const std::string& backend, KvStore& store, int rank, int np) {
  const auto timeout = std::chrono::seconds(120);
  if (backend == "gloo") {
    GlooOptions o;
    o.rank = rank;
    o.size = np;
    o.timeout = timeout;
    return make_gloo_communicator(store, o);
  }
  if (backend == "tcp") {
    TcpOptions o;
    o.rank = rank;
    o.size = np;
    o.timeout = timeout;
    o.address = "127.0.0." + std::to_string(2 + rank);
    o.job_id = "bench";
    o.secret = "shm-allreduce-bench-secret-0123456789";
    o.machine_ranks = np;
    return make_tcp_communicator(store, o);
  }
  if (backend == "hier2") {
    const int first = np / 2, host = rank < first ? 0 : 1;
    HierOptions o;
    o.rank = rank;
    o.size = np;
    o.local_rank = host == 0 ? rank : rank - first;
    o.local_size = host == 0 ? first : np - first;
    o.cross_rank = host;
    o.cross_size = o.local_rank < std::min(first, np - first) ? 2 : 1;
    o.hostname = "127.0.0." + std::to_string(2 + host);
    o.timeout = timeout;
    o.job_id = "bench";
    o.secret = "shm-allreduce-bench-secret-0123456789";
    o.segment_tag = "bench";
    return make_hierarchical_communicator(store, o);
  }
  if (backend == "hier") {
    HierOptions o;
    o.rank = o.local_rank = rank;
    o.size = o.local_size = np;
    o.cross_rank = 0;
    o.cross_size = 1;
    o.timeout = timeout;
    return make_hierarchical_communicator(store, o);
  }
  ShmOptions o;
  o.rank = rank;
  o.size = np;
  o.timeout = timeout;
  o.segment_tag = "bench";
  if (g_step) o.step_bytes = g_step;
  if (g_small) o.small_bytes = g_small;
  return make_shm_communicator(store, o);
}

int rank_main(const std::string& backend, const std::string& dir, int rank, int np, const std::vector<size_t>& sizes) {
  FileKvStore store(dir);
  auto comm = make(backend, store, rank, np);
  constexpr int kReps = 5;
  for (size_t bytes : sizes) {
    std::vector<float> v(bytes / sizeof(float), 1.0f);
    std::vector<size_t> counts(static_cast<size_t>(np));
    for (size_t r = 0; r < counts.size(); ++r) counts[r] = v.size() / np + (r < v.size() % np ? 1 : 0);
    std::vector<float> mine(counts[static_cast<size_t>(rank)]);
    for (int kind : {0, 1, 2}) {
      const bool scatter = kind != 0;
      if (scatter && !g_reduce_scatter) break;
      auto op = [&] {
        if (kind == 1) {
          comm->reduce_scatter(v.data(), mine.data(), counts, DataType::kFloat32, ReduceOp::kSum);
        } else if (kind == 2) {
          comm->Communicator::reduce_scatter(v.data(), mine.data(), counts, DataType::kFloat32, ReduceOp::kSum);
        } else {
          comm->allreduce(v, ReduceOp::kSum);
        }
      };
      // About 0.2 s of work per repetition at 1 GB/s, at least 3 ops.
      const int iters =
          static_cast<int>(std::clamp<size_t>((size_t{200} << 20) / std::max<size_t>(bytes, 1), 3, 2000));
      for (int i = 0; i < std::max(3, iters / 10); ++i) op();
      std::vector<double> times;
      for (int rep = 0; rep < kReps; ++rep) {
        comm->barrier();
        auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; ++i) op();
        double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
        times.push_back(comm->allreduce_value(t, ReduceOp::kMax));
      }
      std::sort(times.begin(), times.end());
      if (rank == 0) {
        const double t = times[kReps / 2];
        const double algbw = static_cast<double>(bytes) / t / 1e9;
        const double busbw = algbw * (scatter ? 1.0 : 2.0) * (np - 1) / np;
        std::printf("np=%d bytes=%zu iters=%d time=%.2f us min=%.2f us max=%.2f us algbw=%.3f GB/s busbw=%.3f GB/s "
                    "backend=%s op=%s\n",
                    np, bytes, iters, t * 1e6, times.front() * 1e6, times.back() * 1e6, algbw, busbw,
                    backend.c_str(), kind == 0 ? "allreduce" : kind == 1 ? "reduce_scatter" : "reduce_scatter_fallback");
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int arg = 1;
  std::string backend = "shm";
  if (arg < argc && (!std::strcmp(argv[arg], "shm") || !std::strcmp(argv[arg], "tcp") || !std::strcmp(argv[arg], "gloo") ||
                     !std::strcmp(argv[arg], "hier") || !std::strcmp(argv[arg], "hier2"))) {
    backend = argv[arg++];
  }
  while (arg < argc && (!std::strcmp(argv[arg], "--step") || !std::strcmp(argv[arg], "--small") ||
                        !std::strcmp(argv[arg], "--reduce-scatter"))) {
    if (!std::strcmp(argv[arg], "--reduce-scatter")) {
      g_reduce_scatter = true;
      ++arg;
      continue;
    }
    if (arg + 1 >= argc) break;
    (argv[arg][2] == 's' && argv[arg][3] == 't' ? g_step : g_small) = std::strtoull(argv[arg + 1], nullptr, 10);
    arg += 2;
  }
  const int np = arg < argc ? std::atoi(argv[arg++]) : 0;
  if (np < 1) {
    std::fprintf(stderr, "usage: %s [shm|tcp|gloo|hier|hier2] NP [BYTES...]\n", argv[0]);
    return 2;
  }
  std::vector<size_t> sizes;
  for (; arg < argc; ++arg) sizes.push_back(std::strtoull(argv[arg], nullptr, 10));
  if (sizes.empty()) {
    sizes = {size_t{4} << 10, size_t{64} << 10, size_t{1} << 20, size_t{16} << 20, size_t{64} << 20, size_t{256} << 20};
  }
  char tmpl[] = "/tmp/erun_bench_XXXXXX";
  if (!::mkdtemp(tmpl)) return 1;
  std::vector<pid_t> pids;
  for (int r = 0; r < np; ++r) {
    pid_t pid = ::fork();
    if (pid == 0) {
      int code = 1;
      try {
        code = rank_main(backend, tmpl, r, np, sizes);
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
