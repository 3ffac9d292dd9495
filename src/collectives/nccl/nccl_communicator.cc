#include "collectives/nccl/nccl_communicator.h"

#include <nccl.h>

#include <cstring>
#include <thread>

#include "common/backoff.h"
#include "common/check.h"

namespace erun {
namespace {

ncclDataType_t nccl_type(DataType t) {
  switch (t) {
    case DataType::kFloat32: return ncclFloat32;
    case DataType::kFloat64: return ncclFloat64;
    case DataType::kInt32: return ncclInt32;
    case DataType::kInt64: return ncclInt64;
    case DataType::kUInt8: return ncclUint8;
    case DataType::kFloat16: return ncclFloat16;
    case DataType::kBFloat16: return ncclBfloat16;
  }
  ERUN_CHECK(false);
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAverage: return ncclAvg;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kProduct: return ncclProd;
  }
  ERUN_CHECK(false);
  return ncclSum;
}

}  // namespace

struct NcclCommunicator::Comm {
  ncclComm_t handle = nullptr;
  bool aborted = false;
  // Recorded after each operation: a call waits for its own operation, not
  // for work another thread queued on the same stream after it.
  cudaEvent_t done = nullptr;

  ~Comm() {
    if (done) cudaEventDestroy(done);
  }
  void abort_now() {
    if (handle && !aborted) ncclCommAbort(handle);
    aborted = true;
  }
};

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

bool nccl_available() { return cuda_device_count() > 0; }

static_assert(sizeof(ncclUniqueId) == sizeof(NcclId), "NcclId must hold an ncclUniqueId");

NcclId nccl_unique_id() {
  ncclUniqueId id;
  if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
    throw CommError(std::string("nccl: ncclGetUniqueId failed: ") + ncclGetErrorString(r));
  }
  NcclId out;
  std::memcpy(out.data(), id.internal, out.size());
  return out;
}

NcclId NcclCommunicator::exchange_id(KvStore& store, const NcclOptions& o) {
  ERUN_CHECK(o.size >= 1 && o.rank >= 0 && o.rank < o.size);
  const std::string key = "nccl_unique_id";
  if (o.rank == 0) {
    NcclId id = nccl_unique_id();
    store.set(key, std::vector<char>(id.begin(), id.end()));
    return id;
  }
  std::vector<char> bytes = store.get(key, o.timeout);  // CommError on timeout
  if (bytes.size() != sizeof(NcclId)) {
    throw CommError("nccl init failed on rank " + std::to_string(o.rank) + ": the unique id under '" + key +
                    "' has " + std::to_string(bytes.size()) + " bytes, not " + std::to_string(sizeof(NcclId)) +
                    " (do all ranks use the same NCCL and erun build?)");
  }
  NcclId id;
  std::memcpy(id.data(), bytes.data(), id.size());
  return id;
}

NcclCommunicator::NcclCommunicator(KvStore& store, const NcclOptions& o)
    : NcclCommunicator(exchange_id(store, o), o) {}

NcclCommunicator::NcclCommunicator(const NcclId& id_bytes, const NcclOptions& o)
    : options_(o), comm_(std::make_unique<Comm>()) {
  ERUN_CHECK(o.size >= 1 && o.rank >= 0 && o.rank < o.size);
  const TimePoint deadline = std::chrono::steady_clock::now() + o.timeout;
  if (cudaError_t e = cudaSetDevice(o.device); e != cudaSuccess) {
    fail("init", std::string("cudaSetDevice(") + std::to_string(o.device) + "): " + cudaGetErrorString(e));
  }
  ncclUniqueId id;
  std::memcpy(id.internal, id_bytes.data(), sizeof(id.internal));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t r = ncclCommInitRankConfig(&comm_->handle, o.size, id, o.rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    comm_->abort_now();
    fail("init", ncclGetErrorString(r));
  }
  wait_ready("init", deadline);
}

NcclCommunicator::~NcclCommunicator() {
  if (!comm_->handle || comm_->aborted) return;
  if (abort_requested_) {
    comm_->abort_now();
    return;
  }
  // Finalize flushes outstanding work; give it the timeout, then abort.
  cudaSetDevice(options_.device);
  ncclResult_t r = ncclCommFinalize(comm_->handle);
  const TimePoint deadline = std::chrono::steady_clock::now() + options_.timeout;
  Backoff backoff;
  while (r == ncclSuccess || r == ncclInProgress) {
    ncclResult_t state = ncclInProgress;
    if (ncclCommGetAsyncError(comm_->handle, &state) != ncclSuccess) break;
    if (state == ncclSuccess) {
      ncclCommDestroy(comm_->handle);
      return;
    }
    if (state != ncclInProgress || std::chrono::steady_clock::now() >= deadline) break;
    backoff.pause();
  }
  comm_->abort_now();
}

void NcclCommunicator::abort() { abort_requested_ = true; }

bool NcclCommunicator::healthy() const { return !broken_ && !abort_requested_ && comm_->handle && !comm_->aborted; }

bool NcclCommunicator::shrink_supported() {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
  int version = 0;
  return ncclGetVersion(&version) == ncclSuccess && version >= NCCL_VERSION(2, 27, 0);
#else
  return false;
#endif
}

NcclCommunicator::NcclCommunicator(const NcclOptions& o, Shrunk) : options_(o), comm_(std::make_unique<Comm>()) {}

std::unique_ptr<NcclCommunicator> NcclCommunicator::shrink(const std::vector<int>& exclude, const NcclOptions& o) {
  NcclOptions child_options = o;
  child_options.device = options_.device;
  std::unique_ptr<NcclCommunicator> child(new NcclCommunicator(child_options, Shrunk{}));
  ERUN_CHECK(o.size >= 1 && o.rank >= 0 && o.rank < o.size);
  if (!shrink_supported()) child->fail("shrink", "this NCCL has no ncclCommShrink (2.27 or newer needed)");
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
  check_usable("shrink");
  const TimePoint deadline = std::chrono::steady_clock::now() + o.timeout;
  std::vector<int> excluded(exclude);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t r = ncclCommShrink(comm_->handle, excluded.data(), static_cast<int>(excluded.size()),
                                  &child->comm_->handle, &config, NCCL_SHRINK_DEFAULT);
  if (r != ncclSuccess && r != ncclInProgress) {
    child->comm_->abort_now();
    child->broken_ = true;
    child->fail("shrink", ncclGetErrorString(r));
  }
  child->wait_ready("shrink", deadline);
  int rank = -1, count = -1;
  ncclCommUserRank(child->comm_->handle, &rank);
  ncclCommCount(child->comm_->handle, &count);
  if (rank != o.rank || count != o.size) {
    child->comm_->abort_now();
    child->broken_ = true;
    child->fail("shrink", "NCCL made rank " + std::to_string(rank) + " of " + std::to_string(count) + ", not rank " +
                              std::to_string(o.rank) + " of " + std::to_string(o.size));
  }
#endif
  return child;
}

void NcclCommunicator::check_usable(const char* what) {
  if (abort_requested_) {
    comm_->abort_now();
    broken_ = true;
    fail(what, "the communicator was aborted");
  }
  if (broken_) fail(what, "an earlier operation failed");
  cudaSetDevice(options_.device);
}

// Nonblocking communicators return ncclInProgress from calls that are still
// being set up; wait until NCCL reports success or an error.
void NcclCommunicator::wait_ready(const char* what, TimePoint deadline) {
  Backoff backoff;
  for (;;) {
    ncclResult_t state = ncclInProgress;
    ncclResult_t r = ncclCommGetAsyncError(comm_->handle, &state);
    if (r != ncclSuccess) state = r;
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) {
      std::string cause = std::string(ncclGetErrorString(state)) + ": " + ncclGetLastError(comm_->handle);
      comm_->abort_now();
      broken_ = true;
      fail(what, cause);
    }
    if (abort_requested_ || std::chrono::steady_clock::now() >= deadline) {
      comm_->abort_now();
      broken_ = true;
      fail(what, abort_requested_ ? "the communicator was aborted" : "timed out");
    }
    backoff.pause();
  }
}

void NcclCommunicator::wait_stream(const char* what, cudaStream_t stream) {
  const TimePoint deadline = std::chrono::steady_clock::now() + options_.timeout;
  wait_ready(what, deadline);  // the operation is on the stream (a nonblocking communicator enqueues late)
  cudaError_t e = comm_->done ? cudaSuccess : cudaEventCreateWithFlags(&comm_->done, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventRecord(comm_->done, stream);
  if (e != cudaSuccess) {
    cudaGetLastError();
    comm_->abort_now();
    broken_ = true;
    fail(what, std::string("cannot record a CUDA event on the stream: ") + cudaGetErrorString(e));
  }
  Backoff backoff;
  for (;;) {
    cudaError_t q = cudaEventQuery(comm_->done);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) {
      comm_->abort_now();
      broken_ = true;
      fail(what, std::string("CUDA stream error: ") + cudaGetErrorString(q));
    }
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(comm_->handle, &state);
    if (state != ncclSuccess && state != ncclInProgress) {
      std::string cause = std::string(ncclGetErrorString(state)) + ": " + ncclGetLastError(comm_->handle);
      comm_->abort_now();
      broken_ = true;
      fail(what, cause);
    }
    if (abort_requested_ || std::chrono::steady_clock::now() >= deadline) {
      comm_->abort_now();
      broken_ = true;
      fail(what, abort_requested_ ? "the communicator was aborted" : "timed out waiting for the GPU stream");
    }
    backoff.pause();
  }
}

void NcclCommunicator::allreduce(void* data, size_t count, DataType type, ReduceOp op, cudaStream_t stream) {
  check_usable("allreduce");
  if (count == 0) return;
  ncclResult_t r = ncclAllReduce(data, data, count, nccl_type(type), nccl_op(op), comm_->handle, stream);
  if (r != ncclSuccess && r != ncclInProgress) {
    broken_ = true;
    comm_->abort_now();
    fail("allreduce", ncclGetErrorString(r));
  }
  wait_stream("allreduce", stream);
}

void NcclCommunicator::broadcast(void* data, size_t bytes, int root, cudaStream_t stream) {
  ERUN_CHECK(root >= 0 && root < size());
  check_usable("broadcast");
  if (bytes == 0) return;
  ncclResult_t r = ncclBroadcast(data, data, bytes, ncclUint8, root, comm_->handle, stream);
  if (r != ncclSuccess && r != ncclInProgress) {
    broken_ = true;
    comm_->abort_now();
    fail("broadcast", ncclGetErrorString(r));
  }
  wait_stream("broadcast", stream);
}

void NcclCommunicator::allgather(const void* in, void* out, size_t bytes, cudaStream_t stream) {
  check_usable("allgather");
  if (bytes == 0) return;
  ncclResult_t r = ncclAllGather(in, out, bytes, ncclUint8, comm_->handle, stream);
  if (r != ncclSuccess && r != ncclInProgress) {
    broken_ = true;
    comm_->abort_now();
    fail("allgather", ncclGetErrorString(r));
  }
  wait_stream("allgather", stream);
}

void NcclCommunicator::fail(const char* what, const std::string& cause) {
  throw CommError("nccl " + std::string(what) + " failed on rank " + std::to_string(rank()) + " of " +
                  std::to_string(size()) + " (device " + std::to_string(options_.device) + "): " + cause + "; rebuild the communicator (restore and re-join)");
}

}  // namespace erun
