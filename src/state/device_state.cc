#include "state/device_state.h"

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "common/backoff.h"
#include "common/log.h"
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
  try {
    create_handles();
  } catch (...) {
    release();  // no destructor runs for an object whose constructor threw
    throw;
  }
}

void DeviceSlot::create_handles() {
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
    cudaEvent_t copied;
    ERUN_CUDA(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming));
    copied_ = copied;
  }
}

DeviceSlot::~DeviceSlot() { release(); }

void DeviceSlot::release() noexcept {
  if (done_ != nullptr) cudaEventSynchronize(as_event(done_));  // a copy in flight targets last_
  if (ready_ != nullptr) cudaEventDestroy(as_event(ready_));
  if (copied_ != nullptr) cudaEventDestroy(as_event(copied_));
  if (done_ != nullptr) cudaEventDestroy(as_event(done_));
  if (side_ != nullptr) cudaStreamDestroy(as_stream(side_));
  if (own_ != nullptr) cudaFreeHost(own_);
  cudaGetLastError();
}

void DeviceSlot::own_pinned() {
  if (own_ != nullptr) return;
  ERUN_CUDA(cudaSetDevice(device_));
  ERUN_CUDA(cudaMallocHost(reinterpret_cast<void**>(&own_), bytes_));
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

namespace {

void CUDART_CB run_landed(void* arg) {
  std::unique_ptr<std::function<void()>> landed(static_cast<std::function<void()>*>(arg));
  (*landed)();
}

}  // namespace

// The buffer into `dst` once the buffer's stream reached this point: on a
// side stream that the buffer's stream then waits for (async), or on the
// buffer's stream, waited for here. `landed` runs after the copy, before
// done_. Once the copy is queued it is waited for, even when a later call
// fails (its destination must not be reused under it).
void DeviceSlot::copy_to_host(char* dst, std::function<void()>* landed) {
  ERUN_CUDA(cudaSetDevice(device_));
  cudaStream_t on = as_stream(async_ ? side_ : stream_);
  if (async_) {
    ERUN_CUDA(cudaEventRecord(as_event(ready_), as_stream(stream_)));
    ERUN_CUDA(cudaStreamWaitEvent(on, as_event(ready_), 0));
  }
  ERUN_CUDA(cudaMemcpyAsync(dst, dev_, bytes_, cudaMemcpyDeviceToHost, on));
  last_ = dst;
  try {
    if (async_) {
      // The buffer may change once its bytes are copied; the landing need not hold its stream.
      ERUN_CUDA(cudaEventRecord(as_event(copied_), on));
      ERUN_CUDA(cudaStreamWaitEvent(as_stream(stream_), as_event(copied_), 0));
    }
    if (landed != nullptr) {
      auto* fn = new std::function<void()>(std::move(*landed));
      if (cudaError_t e = cudaLaunchHostFunc(on, run_landed, fn); e != cudaSuccess) {
        delete fn;
        ERUN_CUDA(e);
      }
    }
    ERUN_CUDA(cudaEventRecord(as_event(done_), on));
  } catch (...) {
    cudaStreamSynchronize(on);
    cudaGetLastError();
    throw;
  }
  in_flight_ = true;
  if (!async_) fence();
}

void DeviceSlot::release_kept() {
  if (last_ != kept_.data()) std::vector<char>().swap(kept_);
}

void DeviceSlot::commit() {
  if (bytes_ == 0) return;
  fence();
  own_pinned();
  copy_to_host(own_, nullptr);
  release_kept();
}

void DeviceSlot::commit_into(char* dst, std::function<void()> landed) {
  if (bytes_ == 0) {
    landed();
    return;
  }
  fence();
  copy_to_host(dst, &landed);
  release_kept();
}

void DeviceSlot::take() {
  if (bytes_ == 0) return;
  fence();
  kept_.resize(bytes_);
  ERUN_CUDA(cudaSetDevice(device_));
  ERUN_CUDA(cudaMemcpyAsync(kept_.data(), dev_, bytes_, cudaMemcpyDeviceToHost, as_stream(stream_)));
  last_ = kept_.data();
  ERUN_CUDA(cudaEventRecord(as_event(done_), as_stream(stream_)));
  in_flight_ = true;
  fence();
}

void DeviceSlot::restore() {
  if (bytes_ == 0 || last_ == nullptr) return;
  fence();
  ERUN_CUDA(cudaSetDevice(device_));
  ERUN_CUDA(cudaMemcpyAsync(dev_, last_, bytes_, cudaMemcpyHostToDevice, as_stream(stream_)));
  ERUN_CUDA(cudaEventRecord(as_event(done_), as_stream(stream_)));
  in_flight_ = true;
  fence();
}

void DeviceSlot::save_to(std::vector<char>& out) {
  take();
  mirror(out);
}

void DeviceSlot::mirror(std::vector<char>& out) {
  fence();
  out.resize(bytes_);
  if (bytes_ != 0 && last_ != nullptr) std::memcpy(out.data(), last_, bytes_);
}

void DeviceSlot::load_from(const std::vector<char>& in) {
  expect_bytes(in.size());
  if (bytes_ == 0) return;
  fence();
  kept_ = in;
  last_ = kept_.data();
  restore();
}

namespace {

// Pins a commit file's mapping for every CUDA context (the mapping is page
// aligned; its last page is whole in the mapping).
class CudaPinner final : public MappingPinner {
 public:
  bool pin(void* p, size_t n) override {
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    n = (n + page - 1) / page * page;
    cudaError_t e = cudaHostRegister(p, n, cudaHostRegisterPortable);
    if (e == cudaSuccess) return true;
    cudaGetLastError();
    if (!warned_.exchange(true)) {
      ERUN_LOG_WARN("cannot register a host-memory commit file's {} bytes with CUDA ({}): device buffers "
                    "are copied into it through CUDA's staging buffers, more slowly, and an async commit "
                    "waits for its copy",
                    n, cudaGetErrorString(e));
    }
    return false;
  }
  void unpin(void* p) override {
    cudaHostUnregister(p);
    cudaGetLastError();
  }

 private:
  std::atomic<bool> warned_{false};
};

}  // namespace

std::shared_ptr<MappingPinner> DeviceSlot::pinner() {
  static const std::shared_ptr<MappingPinner> cuda = std::make_shared<CudaPinner>();
  return cuda;
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
void DeviceSlot::commit_into(char*, std::function<void()>) {}
void DeviceSlot::take() {}
std::shared_ptr<MappingPinner> DeviceSlot::pinner() { return nullptr; }
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
