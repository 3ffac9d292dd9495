// erun's GPU allreduce (Context::gpu()) against raw NCCL with the same ranks,
// devices and buffers. Run alone (a world of one) or under erun; needs a GPU.
//   gpu_allreduce_bench [--iters N=50] [--backend auto|staged|nccl] BYTES...
// For each size, rank 0 prints one line:
//   GPUBENCH impl=erun-BACKEND|nccl|nccl-pipelined|copy-d2h2d bytes=B ranks=N time_us=T algbw=GB/s busbw=GB/s
// erun and "nccl" wait for each operation before the next (erun's contract:
// a call returns when the result is there); "nccl-pipelined" enqueues all
// iterations and waits once (nccl-tests' way), the upper bound. With the
// staged backend, "copy-d2h2d" is its floor: every rank at once copies the
// buffer to pinned host memory and back on its stream, nothing reduced. busbw is
// algbw * 2(n-1)/n (nccl-tests' convention; 0 in a world of one, where algbw
// is what to compare).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "erun/erun.hpp"

#if ERUN_HAVE_NCCL
#include <nccl.h>
#endif

namespace {

using Clock = std::chrono::steady_clock;

void cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

void report(const erun::Context& ctx, const std::string& impl, size_t bytes, double secs) {
  if (ctx.rank() != 0) return;
  const int n = ctx.size();
  const double algbw = static_cast<double>(bytes) / secs / 1e9;
  const double busbw = algbw * 2.0 * (n - 1) / n;
  std::printf("GPUBENCH impl=%s bytes=%zu ranks=%d time_us=%.1f algbw=%.2f busbw=%.2f\n", impl.c_str(), bytes, n,
              secs * 1e6, algbw, busbw);
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  int iters = 50;
  erun::GpuBackend backend = erun::GpuBackend::kAuto;
  std::vector<size_t> sizes;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--iters" && i + 1 < argc) {
      iters = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--backend" && i + 1 < argc) {
      std::string b = argv[++i];
      backend = b == "staged" ? erun::GpuBackend::kStaged : b == "nccl" ? erun::GpuBackend::kNccl
                                                                         : erun::GpuBackend::kAuto;
    } else {
      sizes.push_back(static_cast<size_t>(std::strtoull(a.c_str(), nullptr, 10)));
    }
  }
  if (sizes.empty()) sizes = {size_t{1} << 12, size_t{1} << 16, size_t{1} << 20, size_t{1} << 24, size_t{1} << 28};
  try {
    erun::Context& ctx = erun::init();
    erun::GpuCommunicator& gpu = ctx.gpu();
    gpu.set_backend(backend);
    const int dev = gpu.device();
    cudaStream_t stream;
    cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    const size_t max_bytes = *std::max_element(sizes.begin(), sizes.end());
    float* buf = nullptr;
    cuda(cudaMalloc(reinterpret_cast<void**>(&buf), max_bytes), "cudaMalloc");
    cuda(cudaMemset(buf, 0, max_bytes), "cudaMemset");
    cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");  // the memset runs on the legacy stream
    const std::string erun_impl = std::string("erun-") + erun::to_string(gpu.backend());
    for (size_t bytes : sizes) {
      const size_t count = bytes / sizeof(float);
      gpu.allreduce(buf, count, erun::DataType::kFloat32, erun::ReduceOp::kSum, stream);  // warm-up
      ctx.comm().barrier();
      auto t0 = Clock::now();
      for (int k = 0; k < iters; ++k) gpu.allreduce(buf, count, erun::DataType::kFloat32, erun::ReduceOp::kSum, stream);
      report(ctx, erun_impl, bytes, std::chrono::duration<double>(Clock::now() - t0).count() / iters);
    }
    if (gpu.backend() == erun::GpuBackend::kStaged) {
      void* host = nullptr;
      cuda(cudaMallocHost(&host, max_bytes), "cudaMallocHost");
      for (size_t bytes : sizes) {
        auto down_and_up = [&] {
          cuda(cudaMemcpyAsync(host, buf, bytes, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
          cuda(cudaMemcpyAsync(buf, host, bytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
          cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
        };
        down_and_up();
        ctx.comm().barrier();
        auto t0 = Clock::now();
        for (int k = 0; k < iters; ++k) down_and_up();
        ctx.comm().barrier();  // the slowest rank's time, as the collective's
        report(ctx, "copy-d2h2d", bytes, std::chrono::duration<double>(Clock::now() - t0).count() / iters);
      }
      cudaFreeHost(host);
    }
#if ERUN_HAVE_NCCL
    if (gpu.backend() == erun::GpuBackend::kNccl) {
      // Raw NCCL on the same devices: the id over erun's CPU communicator.
      ncclUniqueId id;
      if (ctx.rank() == 0 && ncclGetUniqueId(&id) != ncclSuccess) throw std::runtime_error("ncclGetUniqueId");
      ctx.comm().broadcast(&id, sizeof(id), 0);
      cuda(cudaSetDevice(dev), "cudaSetDevice");
      ncclComm_t comm;
      if (ncclCommInitRank(&comm, ctx.size(), id, ctx.rank()) != ncclSuccess) throw std::runtime_error("ncclCommInitRank");
      for (size_t bytes : sizes) {
        const size_t count = bytes / sizeof(float);
        for (bool pipelined : {false, true}) {
          ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, comm, stream);
          cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
          ctx.comm().barrier();
          auto t0 = Clock::now();
          for (int k = 0; k < iters; ++k) {
            if (ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, comm, stream) != ncclSuccess)
              throw std::runtime_error("ncclAllReduce");
            if (!pipelined) cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
          }
          cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
          report(ctx, pipelined ? "nccl-pipelined" : "nccl", bytes,
                 std::chrono::duration<double>(Clock::now() - t0).count() / iters);
        }
      }
      ncclCommDestroy(comm);
    }
#endif
    cudaFree(buf);
    cudaStreamDestroy(stream);
    erun::shutdown();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_allreduce_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
