// NcclCommunicator: GPU collectives among a generation's ranks, one GPU each
// (docs/gpu.md, "Contract", "Backends"). Construction is collective; after an
// error or a timeout it is aborted and only throws CommError. abort() may be
// called from any thread. Built only with ERUN_HAVE_NCCL.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "erun/communicator.hpp"
#include "store/kv_store.h"

namespace erun {

// False when the CUDA runtime finds no device (no driver, no GPU): callers use
// the CPU communicator, tests skip.
bool nccl_available();
int cuda_device_count();

// The bytes of an ncclUniqueId (NCCL_UNIQUE_ID_BYTES).
using NcclId = std::array<char, 128>;
// A fresh unique id (rank 0 of a communicator); throws CommError.
NcclId nccl_unique_id();

struct NcclOptions {
  int rank = 0;
  int size = 1;
  int device = 0;  // CUDA device of this rank
  Duration timeout = std::chrono::seconds(60);
};

class NcclCommunicator {
 public:
  // Rank 0 sets a fresh unique id under "nccl_unique_id" in `store` (a view
  // the caller scopes); the other ranks wait for it there.
  NcclCommunicator(KvStore& store, const NcclOptions& options);
  // Every rank passes the id rank 0 got from nccl_unique_id().
  NcclCommunicator(const NcclId& id, const NcclOptions& options);
  ~NcclCommunicator();
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const { return options_.rank; }
  int size() const { return options_.size; }
  int device() const { return options_.device; }

  // Device pointers; each call returns when the result is in `data` (the
  // operation and what was on the stream before it are done; work queued on
  // the stream after it, by another thread, is not waited for).
  void allreduce(void* data, size_t count, DataType type, ReduceOp op, cudaStream_t stream);
  void broadcast(void* data, size_t bytes, int root, cudaStream_t stream);
  void allgather(const void* in, void* out, size_t bytes, cudaStream_t stream);
  void abort();

  // Nothing failed and no abort was asked for: shrink() may start from it.
  bool healthy() const;
  // The NCCL this process loaded (and the headers it was built with) has ncclCommShrink.
  static bool shrink_supported();
  // Collective over every rank of this communicator not in `exclude` (ranks
  // of this one; the excluded ones may be dead): the communicator of those
  // ranks, renumbered in order, on this one's device; `options` must give the
  // rank and size that renumbering yields (checked) and the timeout of the
  // new one's init. Bounded by options.timeout; CommError on failure or
  // timeout (the new one is aborted). This one is left as it was: abort it
  // afterwards, never destroy it while an excluded peer may hang.
  std::unique_ptr<NcclCommunicator> shrink(const std::vector<int>& exclude, const NcclOptions& options);

 private:
  struct Comm;
  struct Shrunk {};
  NcclCommunicator(const NcclOptions& options, Shrunk);
  static NcclId exchange_id(KvStore& store, const NcclOptions& o);
  void wait_ready(const char* what, TimePoint deadline);
  void wait_stream(const char* what, cudaStream_t stream);
  void check_usable(const char* what);
  [[noreturn]] void fail(const char* what, const std::string& cause);

  const NcclOptions options_;
  std::unique_ptr<Comm> comm_;
  std::atomic<bool> abort_requested_{false};
  bool broken_ = false;
};

}  // namespace erun
