// Allreduce (float32, sum) bandwidth of the Gloo communicator among N local
// processes bootstrapped over a FileKvStore in a temp dir.
//   allreduce_bench NP [BYTES...]      (default sizes: 4 KiB, 1 MiB, 64 MiB)
// Prints one line per size: time per op, algbw = bytes/time and
// busbw = algbw * 2(n-1)/n (the bytes each rank moves in a ring), as in nccl-tests.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "store/file_store.h"
#include "collectives/gloo/gloo_communicator.h"

using namespace erun;

static int rank_main(const std::string& dir, int rank, int np, const std::vector<size_t>& sizes) {
  FileKvStore store(dir);
  GlooOptions o;
  o.rank = rank;
  o.size = np;
  o.timeout = std::chrono::seconds(120);
  auto comm = make_gloo_communicator(store, o);
  for (size_t bytes : sizes) {
    std::vector<float> v(bytes / sizeof(float), 1.0f);
    const int iters = static_cast<int>(std::clamp<size_t>((size_t{256} << 20) / std::max<size_t>(bytes, 1), 5, 1000));
    for (int i = 0; i < 3; ++i) comm->allreduce(v, ReduceOp::kSum);
    comm->barrier();
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) comm->allreduce(v, ReduceOp::kSum);
    double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
    // The slowest rank defines the time.
    t = comm->allreduce_value(t, ReduceOp::kMax);
    if (rank == 0) {
      double algbw = bytes / t / 1e9;
      double busbw = algbw * 2.0 * (np - 1) / np;
      std::printf("np=%d bytes=%zu iters=%d time=%.1f us algbw=%.3f GB/s busbw=%.3f GB/s\n", np, bytes, iters,
                  t * 1e6, algbw, busbw);
      std::fflush(stdout);
    }
  }
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s NP [BYTES...]\n", argv[0]);
    return 2;
  }
  int np = std::atoi(argv[1]);
  std::vector<size_t> sizes;
  for (int i = 2; i < argc; ++i) sizes.push_back(std::strtoull(argv[i], nullptr, 10));
  if (sizes.empty()) sizes = {4096, size_t{1} << 20, size_t{64} << 20};
  char tmpl[] = "/tmp/erun_bench_XXXXXX";
  if (!::mkdtemp(tmpl)) return 1;
  std::vector<pid_t> pids;
  for (int r = 0; r < np; ++r) {
    pid_t pid = ::fork();
    if (pid == 0) {
      int code = 1;
      try {
        code = rank_main(tmpl, r, np, sizes);
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
