#include "state/device_state.h"

#include <fmt/format.h>

#include <cstring>

#include "common/backoff.h"
#include "erun/errors.hpp"

#if ERUN_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace erun::state_internal {

#if ERUN_HAVE_CUDA
namespace {

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
cudaEvent_t as_event(void* e) { return static_cast<cudaEvent_t>(e); }

}  // namespace

#define ERUN_CUDA(call)                                                                                          \
  do {                                                                                                          \
    if (cudaError_t e_ = (call); e_ != cudaSuccess) {                                                           \
      throw Error(fmt::format("erun: device state entry '{}': {} failed: {}", name_, #call,                     \
                              cudaGetErrorString(e_)));                                                         \
    }                                                                                                           \
  } while (0)

DeviceSlot::DeviceSlot(std::string name, void* device_ptr, size_t bytes, GpuStream stream, bool async,
                       std::chrono::milliseconds timeout)
    : name_(std::move(name)), dev_(device_ptr), bytes_(bytes), stream_(stream), async_(async), timeout_(timeout) {
  if (bytes_ == 0) return;
  cudaPointerAttributes attr{};
  cudaError_t e = cudaPointerGetAttributes(&attr, dev_);
  if (e != cudaSuccess || (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)) {
    cudaGetLastError();
    throw Error(fmt::format("erun: state entry '{}': {} is not CUDA device memory{}{}; register host memory "
                            "with register_buffer",
                            name_, dev_, e != cudaSuccess ? ": " : "",
                            e != cudaSuccess ? cudaGetErrorString(e) : ""));
  }
  device_ = attr.device;
  ERUN_CUDA(cudaSetDevice(device_));
  ERUN_CUDA(cudaMallocHost(reinterpret_cast<void**>(&pinned_), bytes_));
  cudaEvent_t done;
  ERUN_CUDA(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  done_ = done;
  if (async_) {
    cudaStream_t side;
    cudaEvent_t ready;
    ERUN_CUDA(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    side_ = side;
    ERUN_CUDA(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    ready_ = ready;
  }
}

DeviceSlot::~DeviceSlot() {
  if (done_ != nullptr) cudaEventSynchronize(as_event(done_));  // a copy in flight targets pinned_
  if (ready_ != nullptr) cudaEventDestroy(as_event(ready_));
  if (done_ != nullptr) cudaEventDestroy(as_event(done_));
  if (side_ != nullptr) cudaStreamDestroy(as_stream(side_));
  if (pinned_ != nullptr) cudaFreeHost(pinned_);
  cudaGetLastError();
}

void DeviceSlot::fence() {
  if (!in_flight_) return;
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  Backoff backoff(100, std::chrono::microseconds(10));
  for (;;) {
    cudaError_t q = cudaEventQuery(as_event(done_));
    if (q == cudaSuccess) break;
    if (q != cudaErrorNotReady) ERUN_CUDA(q);
    if (std::chrono::steady_clock::now() >= deadline) {
      throw Error(fmt::format("erun: device state entry '{}': the copy to host memory did not finish within {} "
                              "ms; the GPU is stuck",
                              name_, timeout_.count()));
    }
    backoff.pause();
  }
  in_flight_ = false;
}

void DeviceSlot::commit() {
  if (bytes_ == 0) return;
  fence();
  ERUN_CUDA(cudaSetDevice(device_));
  if (async_) {
    ERUN_CUDA(cudaEventRecord(as_event(ready_), as_stream(stream_)));
    ERUN_CUDA(cudaStreamWaitEvent(as_stream(side_), as_event(ready_), 0));
    ERUN_CUDA(cudaMemcpyAsync(pinned_, dev_, bytes_, cudaMemcpyDeviceToHost, as_stream(side_)));
    ERUN_CUDA(cudaEventRecord(as_event(done_), as_stream(side_)));
    ERUN_CUDA(cudaStreamWaitEvent(as_stream(stream_), as_event(done_), 0));
  } else {
    ERUN_CUDA(cudaMemcpyAsync(pinned_, dev_, bytes_, cudaMemcpyDeviceToHost, as_stream(stream_)));
    ERUN_CUDA(cudaEventRecord(as_event(done_), as_stream(stream_)));
  }
  in_flight_ = true;
  if (!async_) fence();
}

void DeviceSlot::restore() {
  if (bytes_ == 0) return;
  fence();
  ERUN_CUDA(cudaSetDevice(device_));
  ERUN_CUDA(cudaMemcpyAsync(dev_, pinned_, bytes_, cudaMemcpyHostToDevice, as_stream(stream_)));
  ERUN_CUDA(cudaEventRecord(as_event(done_), as_stream(stream_)));
  in_flight_ = true;
  fence();
}

void DeviceSlot::save_to(std::vector<char>& out) {
  commit();
  mirror(out);
}

void DeviceSlot::mirror(std::vector<char>& out) {
  fence();
  out.resize(bytes_);
  if (bytes_ != 0) std::memcpy(out.data(), pinned_, bytes_);
}

void DeviceSlot::load_from(const std::vector<char>& in) {
  expect_bytes(in.size());
  if (bytes_ == 0) return;
  fence();
  std::memcpy(pinned_, in.data(), bytes_);
  restore();
}

#else  // no CUDA

DeviceSlot::DeviceSlot(std::string name, void*, size_t, GpuStream, bool, std::chrono::milliseconds)
    : name_(std::move(name)) {
  throw Error(fmt::format("erun: state entry '{}': device buffers need CUDA, and erun was built without CUDA; "
                          "rebuild it where the CUDA toolkit is found",
                          name_));
}
DeviceSlot::~DeviceSlot() = default;
void DeviceSlot::commit() {}
void DeviceSlot::fence() {}
void DeviceSlot::restore() {}
void DeviceSlot::save_to(std::vector<char>&) {}
void DeviceSlot::load_from(const std::vector<char>&) {}
void DeviceSlot::mirror(std::vector<char>&) {}

#endif

void DeviceSlot::expect_bytes(size_t got) const {
  if (got != bytes_) {
    throw Error(fmt::format("erun: device state entry '{}' has {} bytes in the snapshot but the registered "
                            "buffer has {}; register the same sizes on every worker",
                            name_, got, bytes_));
  }
}

}  // namespace erun::state_internal
