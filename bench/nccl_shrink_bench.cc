// The cost of a generation that loses one rank, on the GPU side: shrinking the
// old NCCL communicator (ncclCommShrink, what erun does when every survivor
// kept its communicator) against a new init of the survivors (what it does
// otherwise). One thread per GPU, all GPUs of this machine (at most 8; needs
// 2 and NCCL 2.27+), through erun's NcclCommunicator, so that both numbers
// include the same nonblocking waits.
//   nccl_shrink_bench [--repeat N=5]
// Prints, per repeat and then the medians:
//   SHRINKBENCH ranks=N init_s=T shrink_s=T ratio=init/shrink
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "collectives/nccl/nccl_communicator.h"
#include "store/memory_store.h"
#include "store/prefix_store.h"

namespace {

using Clock = std::chrono::steady_clock;
using erun::NcclCommunicator;
using erun::NcclOptions;

// Runs fn(rank) on `n` threads; returns the slowest thread's seconds.
double on_threads(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  std::vector<double> took(n, 0);
  std::mutex mu;
  std::exception_ptr first;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto t0 = Clock::now();
        fn(r);
        took[r] = std::chrono::duration<double>(Clock::now() - t0).count();
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
  return *std::max_element(took.begin(), took.end());
}

NcclOptions options(int rank, int size, int device) {
  NcclOptions o;
  o.rank = rank;
  o.size = size;
  o.device = device;
  o.timeout = std::chrono::seconds(120);
  return o;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int repeat = 5;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--repeat") == 0 && i + 1 < argc) {
      repeat = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: nccl_shrink_bench [--repeat N]\n");
      return 2;
    }
  }
  const int n = std::min(erun::cuda_device_count(), 8);
  if (n < 2) {
    std::printf("SHRINKBENCH skipped: needs 2 or more GPUs (this machine has %d)\n", n);
    return 0;
  }
  if (!NcclCommunicator::shrink_supported()) {
    std::printf("SHRINKBENCH skipped: this NCCL has no ncclCommShrink (2.27 or newer needed)\n");
    return 0;
  }
  std::vector<double> inits, shrinks;
  try {
    for (int k = 0; k < repeat; ++k) {
      erun::MemoryKvStore base;
      // The old generation: n ranks; the last one leaves.
      std::vector<std::unique_ptr<NcclCommunicator>> old(n);
      erun::PrefixStore full(base, "full" + std::to_string(k));
      on_threads(n, [&](int r) { old[r] = std::make_unique<NcclCommunicator>(full, options(r, n, r)); });
      old[n - 1]->abort();
      // A new init of the survivors, the same devices; then the shrink. Only
      // the making is timed: each is aborted afterwards.
      auto drop = [](std::vector<std::unique_ptr<NcclCommunicator>>& v) {
        for (auto& c : v) c->abort();
        v.clear();
      };
      std::vector<std::unique_ptr<NcclCommunicator>> made(n - 1);
      erun::PrefixStore fresh(base, "fresh" + std::to_string(k));
      const double init_s = on_threads(
          n - 1, [&](int r) { made[r] = std::make_unique<NcclCommunicator>(fresh, options(r, n - 1, r)); });
      drop(made);
      made.resize(n - 1);
      const double shrink_s =
          on_threads(n - 1, [&](int r) { made[r] = old[r]->shrink({n - 1}, options(r, n - 1, r)); });
      drop(made);
      for (auto& c : old) c->abort();
      old.clear();
      inits.push_back(init_s);
      shrinks.push_back(shrink_s);
      std::printf("SHRINKBENCH repeat=%d ranks=%d init_s=%.4f shrink_s=%.4f ratio=%.2f\n", k, n - 1, init_s,
                  shrink_s, init_s / shrink_s);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nccl_shrink_bench: %s\n", e.what());
    return 1;
  }
  const double mi = median(inits), ms = median(shrinks);
  std::printf("SHRINKBENCH median ranks=%d init_s=%.4f shrink_s=%.4f ratio=%.2f\n", n - 1, mi, ms, mi / ms);
  return 0;
}
