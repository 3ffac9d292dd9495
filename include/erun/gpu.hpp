// GpuCommunicator: collectives on device buffers among the ranks of the
// current generation, reached through Context::gpu(). Same contract as the
// CPU Communicator: every operation is collective (all ranks call it, in the
// same order, with the same counts and types), enqueued on the caller's CUDA
// stream and waited for by the calling thread, bounded by the collective
// timeout, and throws erun::CommError when a peer dies or hangs; erun::run()
// then restores and re-joins, and the next call builds the communicator of the
// new generation (lazily, on the first GPU collective of each generation).
//
// Backend (chosen collectively on that first call, the same on every rank):
// NCCL when every rank has a GPU of its own; the host-staged path (device ->
// pinned host -> erun's CPU communicator -> device, on the caller's stream,
// pipelined in chunks) when two ranks share a GPU (same device UUID on the same
// host: NCCL refuses that) or erun was built without NCCL. Device: the local
// rank modulo the visible devices (CUDA_VISIBLE_DEVICES narrows them; a
// launcher that gives each worker one device makes it device 0), unless
// set_device() chose one. Built without CUDA, every call throws erun::Error
// "erun was built without CUDA".
//
// This header needs no CUDA headers: a stream is passed as GpuStream (a
// cudaStream_t cast to void*; nullptr is the legacy default stream). Used from
// the training thread; abort() may be called from any thread.
#pragma once

#include <cstddef>
#include <memory>

#include "erun/communicator.hpp"
#include "erun/export.hpp"

namespace erun {

class Context;

using GpuStream = void*;

enum class GpuBackend { kAuto, kNccl, kStaged };
ERUN_API const char* to_string(GpuBackend b);

// What this build of erun can do (compile-time facts, no device needed).
ERUN_API bool built_with_cuda();
ERUN_API bool built_with_nccl();
// Number of CUDA devices this process sees (0 without a driver, a device, or CUDA).
ERUN_API int gpu_device_count();

class ERUN_API GpuCommunicator {
 public:
  explicit GpuCommunicator(Context& ctx);  // made by Context::gpu()
  ~GpuCommunicator();
  GpuCommunicator(const GpuCommunicator&) = delete;
  GpuCommunicator& operator=(const GpuCommunicator&) = delete;

  // This rank's CUDA device; selects it (and makes it current on the calling
  // thread) on the first call. Throws erun::Error without CUDA or a device.
  int device();
  // Before the first device() or collective: use this device instead.
  void set_device(int device);
  // Before a generation's first collective: force a backend (kAuto: choose).
  // kNccl where ranks share a GPU fails on every rank with an erun::Error.
  void set_backend(GpuBackend backend);
  // The current generation's backend; collective when it is not built yet.
  GpuBackend backend();
  int rank() const;
  int size() const;

  // Elementwise reduction of `count` elements of the device buffer `data`
  // across ranks, in place; returns when the result is in `data`.
  void allreduce(void* data, size_t count, DataType type, ReduceOp op, GpuStream stream = nullptr);
  // `bytes` bytes from `root`'s device buffer to every rank's.
  void broadcast(void* data, size_t bytes, int root, GpuStream stream = nullptr);
  // Every rank gives `bytes` device bytes; `out` (device) receives size()*bytes.
  void allgather(const void* in, void* out, size_t bytes, GpuStream stream = nullptr);
  // Makes blocked and later operations of this generation throw CommError.
  void abort() noexcept;

 private:
  friend class Context;
  // The Context leaves the generation: abort and release its backend.
  void release() noexcept;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace erun
