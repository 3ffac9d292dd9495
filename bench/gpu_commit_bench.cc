// Commit bandwidth of a device buffer registered in an erun::State against a
// plain cudaMemcpy device -> pinned host of the same bytes on the same GPU.
//   gpu_commit_bench [--reps R=10] [BYTES=1073741824]
// Lines from rank 0:
//   GPUCOMMIT op=OP where=W bytes=B median_s=S bw=GB/s
// W: host-memory under erun (commits land in the host-memory commit file,
// registered with CUDA), worker-memory outside it (the slot's pinned buffer).
// OP: cudaMemcpy-d2h-pinned (the reference), commit and restore (synchronous
// device buffer), commit-async-call (how long commit() blocks the host with
// DeviceBufferOptions::async), commit-async-plus-restore-half (an async commit
// and the restore that fences it, halved). bw for commit-async-call is bytes
// over the blocking time, i.e. not a copy rate.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "erun/erun.hpp"

namespace {

using Clock = std::chrono::steady_clock;

void cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

double median_of(int reps, const std::function<void()>& fn) {
  fn();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto t0 = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void line(const erun::Context& ctx, const char* op, size_t bytes, double secs) {
  if (ctx.rank() == 0) {
    std::printf("GPUCOMMIT op=%s where=%s bytes=%zu median_s=%.6f bw=%.2f\n", op,
                ctx.host_commit_stem().empty() ? "worker-memory" : "host-memory", bytes, secs, bytes / secs / 1e9);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  int reps = 10;
  size_t bytes = size_t{1} << 30;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
    else bytes = static_cast<size_t>(std::strtoull(argv[i], nullptr, 10));
  }
  try {
    erun::Context& ctx = erun::init();
    ctx.gpu().device();
    cudaStream_t stream;
    cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    void* dev = nullptr;
    void* pinned = nullptr;
    cuda(cudaMalloc(&dev, bytes), "cudaMalloc");
    cuda(cudaMemset(dev, 1, bytes), "cudaMemset");
    cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");  // the memset runs on the legacy stream
    cuda(cudaMallocHost(&pinned, bytes), "cudaMallocHost");
    line(ctx, "cudaMemcpy-d2h-pinned", bytes, median_of(reps, [&] {
           cuda(cudaMemcpyAsync(pinned, dev, bytes, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
           cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
         }));
    cudaFreeHost(pinned);
    {
      erun::State state(ctx);
      erun::State::DeviceBufferOptions o;
      o.stream = stream;
      state.register_device_buffer("w", dev, bytes, o);
      state.sync();
      line(ctx, "commit", bytes, median_of(reps, [&] { state.commit(); }));
      line(ctx, "restore", bytes, median_of(reps, [&] { state.restore(); }));
    }
    {
      erun::State state(ctx);
      erun::State::DeviceBufferOptions o;
      o.stream = stream;
      o.async = true;
      state.register_device_buffer("w", dev, bytes, o);
      state.sync();
      std::vector<double> call, total;
      for (int i = 0; i <= reps; ++i) {
        state.restore();  // fences the previous commit (untimed)
        auto t0 = Clock::now();
        state.commit();
        auto t1 = Clock::now();
        state.restore();  // fence, then the copy back
        auto t2 = Clock::now();
        if (i == 0) continue;  // warm-up
        call.push_back(std::chrono::duration<double>(t1 - t0).count());
        total.push_back(std::chrono::duration<double>(t2 - t0).count());
      }
      std::sort(call.begin(), call.end());
      std::sort(total.begin(), total.end());
      line(ctx, "commit-async-call", bytes, call[call.size() / 2]);
      // commit + restore of the same bytes in both directions: half is the commit.
      line(ctx, "commit-async-plus-restore-half", bytes, total[total.size() / 2] / 2);
    }
    cudaFree(dev);
    cudaStreamDestroy(stream);
    erun::shutdown();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_commit_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
