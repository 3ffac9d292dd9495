// StagedGpuCommunicator: GPU collectives through pinned host memory and a CPU
// communicator, for ranks that share a GPU or a build without NCCL
// (docs/gpu.md, "Contract", "Backends"). abort() may be called from any
// thread; the CPU communicator must outlive this. Built only with CUDA.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <functional>

#include "common/clock.h"
#include "erun/communicator.hpp"

namespace erun {

struct StagedOptions {
  int device = 0;
  Duration timeout = std::chrono::seconds(30);
  size_t chunk_bytes = size_t{8} << 20;  // per pinned buffer; two are used
};

class StagedGpuCommunicator {
 public:
  StagedGpuCommunicator(Communicator& cpu, const StagedOptions& options);
  ~StagedGpuCommunicator();
  StagedGpuCommunicator(const StagedGpuCommunicator&) = delete;
  StagedGpuCommunicator& operator=(const StagedGpuCommunicator&) = delete;

  int rank() const { return cpu_.rank(); }
  int size() const { return cpu_.size(); }

  void allreduce(void* data, size_t count, DataType type, ReduceOp op, cudaStream_t stream);
  void broadcast(void* data, size_t bytes, int root, cudaStream_t stream);
  void allgather(const void* in, void* out, size_t bytes, cudaStream_t stream);
  void abort();

 private:
  void release() noexcept;  // the events and pinned buffers made so far
  using HostOp = std::function<void(char* buf, size_t offset, size_t len)>;
  // Streams `bytes` at `dev` through the pinned buffers in chunks of `chunk`:
  // device->host when `down`, op(), host->device when `up`.
  void pipeline(char* dev, size_t bytes, size_t chunk, bool down, bool up, cudaStream_t stream, const HostOp& op,
                TimePoint deadline);
  void wait_event(cudaEvent_t event, TimePoint deadline);
  void wait_stream(cudaStream_t stream, TimePoint deadline);
  void reserve_chunks(size_t bytes);
  char* reserve_scratch(size_t bytes);
  void check(cudaError_t e, const char* what);
  TimePoint deadline() const { return std::chrono::steady_clock::now() + options_.timeout; }

  Communicator& cpu_;
  const StagedOptions options_;
  char* chunks_[2] = {nullptr, nullptr};
  size_t chunk_capacity_ = 0;
  char* scratch_ = nullptr;
  size_t scratch_capacity_ = 0;
  cudaEvent_t down_[2] = {nullptr, nullptr};
  cudaEvent_t up_[2] = {nullptr, nullptr};
  std::atomic<bool> aborted_{false};
};

// IEEE half and bfloat16 to float and back, rounding to nearest even.
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
float bf16_to_float(uint16_t h);
uint16_t float_to_bf16(float f);

}  // namespace erun
