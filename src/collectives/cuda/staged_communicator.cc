#include "collectives/cuda/staged_communicator.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/backoff.h"
#include "common/check.h"

namespace erun {

float half_to_float(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      uint32_t e = 0;
      while ((man & 0x400u) == 0) {
        man <<= 1;
        ++e;
      }
      bits = sign | ((127 - 14 - e) << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u, exp = (x >> 23) & 0xffu;
  uint32_t man = x & 0x7fffffu;
  if (exp == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (man != 0 ? 0x200u : 0));
  const int e = static_cast<int>(exp) - 127 + 15;
  if (e >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  if (e <= 0) {  // subnormal half (or zero)
    if (e < -10) return static_cast<uint16_t>(sign);
    man |= 0x800000u;
    const int shift = 14 - e;
    uint32_t h = man >> shift;
    const uint32_t rem = man & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = (static_cast<uint32_t>(e) << 10) | (man >> 13);
  const uint32_t rem = man & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry into the exponent is right, up to inf
  return static_cast<uint16_t>(sign | h);
}

float bf16_to_float(uint16_t h) {
  uint32_t bits = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

StagedGpuCommunicator::StagedGpuCommunicator(Communicator& cpu, const StagedOptions& o) : cpu_(cpu), options_(o) {
  ERUN_CHECK(o.chunk_bytes >= 64);
  check(cudaSetDevice(o.device), "cudaSetDevice");
  try {
    for (int i = 0; i < 2; ++i) {
      check(cudaEventCreateWithFlags(&down_[i], cudaEventDisableTiming), "cudaEventCreate");
      check(cudaEventCreateWithFlags(&up_[i], cudaEventDisableTiming), "cudaEventCreate");
    }
  } catch (...) {
    release();  // no destructor runs for an object whose constructor threw
    throw;
  }
}

StagedGpuCommunicator::~StagedGpuCommunicator() { release(); }

void StagedGpuCommunicator::release() noexcept {
  // Copies enqueued before a failed operation may still target the pinned
  // buffers: let them finish before the memory goes back.
  for (int i = 0; i < 2; ++i) {
    for (cudaEvent_t e : {down_[i], up_[i]}) {
      if (e == nullptr) continue;
      cudaEventSynchronize(e);
      cudaEventDestroy(e);
    }
    if (chunks_[i] != nullptr) cudaFreeHost(chunks_[i]);
  }
  if (scratch_ != nullptr) cudaFreeHost(scratch_);
  cudaGetLastError();
}

void StagedGpuCommunicator::abort() {
  aborted_ = true;
  cpu_.abort();
}

void StagedGpuCommunicator::check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  throw Error(std::string("erun: staged GPU collective on rank ") + std::to_string(rank()) + " (device " +
              std::to_string(options_.device) + "): " + what + " failed: " + cudaGetErrorString(e));
}

void StagedGpuCommunicator::reserve_chunks(size_t bytes) {
  if (bytes <= chunk_capacity_) return;
  for (char*& c : chunks_) {
    if (c != nullptr) {
      check(cudaFreeHost(c), "cudaFreeHost");
      c = nullptr;
    }
  }
  chunk_capacity_ = 0;
  for (char*& c : chunks_) check(cudaMallocHost(reinterpret_cast<void**>(&c), bytes), "cudaMallocHost");
  chunk_capacity_ = bytes;
}

char* StagedGpuCommunicator::reserve_scratch(size_t bytes) {
  if (bytes > scratch_capacity_) {
    if (scratch_ != nullptr) check(cudaFreeHost(scratch_), "cudaFreeHost");
    scratch_ = nullptr;
    scratch_capacity_ = 0;
    check(cudaMallocHost(reinterpret_cast<void**>(&scratch_), bytes), "cudaMallocHost");
    scratch_capacity_ = bytes;
  }
  return scratch_;
}

void StagedGpuCommunicator::wait_event(cudaEvent_t event, TimePoint deadline) {
  Backoff backoff(200, std::chrono::microseconds(10));
  for (;;) {
    cudaError_t q = cudaEventQuery(event);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) check(q, "waiting for a copy");
    if (aborted_) throw CommError("erun: staged GPU collective on rank " + std::to_string(rank()) + ": aborted");
    if (std::chrono::steady_clock::now() >= deadline) {
      throw CommError("erun: staged GPU collective on rank " + std::to_string(rank()) +
                      ": timed out waiting for the GPU stream (a kernel on it hangs or the GPU is stuck: check "
                      "nvidia-smi and the training code's own kernels)");
    }
    backoff.pause();
  }
}

void StagedGpuCommunicator::wait_stream(cudaStream_t stream, TimePoint deadline) {
  cudaEvent_t done = up_[0];
  check(cudaEventRecord(done, stream), "cudaEventRecord");
  wait_event(done, deadline);
}

void StagedGpuCommunicator::pipeline(char* dev, size_t bytes, size_t chunk, bool down, bool up, cudaStream_t stream,
                                     const HostOp& op, TimePoint deadline) {
  const size_t n = (bytes + chunk - 1) / chunk;
  reserve_chunks(std::min(bytes, chunk));
  auto len_of = [&](size_t i) { return std::min(chunk, bytes - i * chunk); };
  auto enqueue_down = [&](size_t i) {
    check(cudaMemcpyAsync(chunks_[i % 2], dev + i * chunk, len_of(i), cudaMemcpyDeviceToHost, stream),
          "cudaMemcpyAsync device->host");
    check(cudaEventRecord(down_[i % 2], stream), "cudaEventRecord");
  };
  if (down) enqueue_down(0);
  for (size_t i = 0; i < n; ++i) {
    char* buf = chunks_[i % 2];
    if (down) {
      // In stream order this copy comes after the upload of chunk i-2 from the same buffer.
      wait_event(down_[i % 2], deadline);
      if (i + 1 < n) enqueue_down(i + 1);
    } else if (up && i >= 2) {
      wait_event(up_[i % 2], deadline);  // the upload of chunk i-2 has left the buffer
    }
    op(buf, i * chunk, len_of(i));
    if (up) {
      check(cudaMemcpyAsync(dev + i * chunk, buf, len_of(i), cudaMemcpyHostToDevice, stream),
            "cudaMemcpyAsync host->device");
      check(cudaEventRecord(up_[i % 2], stream), "cudaEventRecord");
    }
  }
  wait_stream(stream, deadline);
}

void StagedGpuCommunicator::allreduce(void* data, size_t count, DataType type, ReduceOp op, cudaStream_t stream) {
  if (aborted_) throw CommError("erun: staged GPU allreduce on rank " + std::to_string(rank()) + ": aborted");
  const TimePoint until = deadline();
  if (count == 0 || size() == 1) {  // a world of one: the sum of one buffer is itself
    wait_stream(stream, until);
    return;
  }
  const size_t es = data_type_size(type);
  const size_t chunk = std::max<size_t>(es, options_.chunk_bytes / es * es);
  const bool half = type == DataType::kFloat16 || type == DataType::kBFloat16;
  std::vector<float> wide;
  HostOp host = [&](char* buf, size_t, size_t len) {
    const size_t n = len / es;
    if (!half) {
      cpu_.allreduce(buf, n, type, op);
      return;
    }
    wide.resize(n);
    auto* h = reinterpret_cast<uint16_t*>(buf);
    const bool f16 = type == DataType::kFloat16;
    for (size_t k = 0; k < n; ++k) wide[k] = f16 ? half_to_float(h[k]) : bf16_to_float(h[k]);
    cpu_.allreduce(wide.data(), n, DataType::kFloat32, op);
    for (size_t k = 0; k < n; ++k) h[k] = f16 ? float_to_half(wide[k]) : float_to_bf16(wide[k]);
  };
  pipeline(static_cast<char*>(data), count * es, chunk, /*down=*/true, /*up=*/true, stream, host, until);
}

void StagedGpuCommunicator::broadcast(void* data, size_t bytes, int root, cudaStream_t stream) {
  ERUN_CHECK(root >= 0 && root < size());
  if (aborted_) throw CommError("erun: staged GPU broadcast on rank " + std::to_string(rank()) + ": aborted");
  if (bytes == 0 || size() == 1) {
    wait_stream(stream, deadline());
    return;
  }
  const bool is_root = rank() == root;
  HostOp host = [&](char* buf, size_t, size_t len) { cpu_.broadcast(buf, len, root); };
  pipeline(static_cast<char*>(data), bytes, options_.chunk_bytes, is_root, !is_root, stream, host, deadline());
}

void StagedGpuCommunicator::allgather(const void* in, void* out, size_t bytes, cudaStream_t stream) {
  if (aborted_) throw CommError("erun: staged GPU allgather on rank " + std::to_string(rank()) + ": aborted");
  if (bytes == 0) return;
  const TimePoint until = deadline();
  const size_t total = bytes * static_cast<size_t>(size());
  if (size() == 1) {
    check(cudaMemcpyAsync(out, in, bytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync device->device");
    wait_stream(stream, until);
    return;
  }
  // One pass: this rank's bytes, then everyone's, in one pinned allocation.
  char* mine = reserve_scratch(bytes + total);
  char* all = mine + bytes;
  check(cudaMemcpyAsync(mine, in, bytes, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync device->host");
  wait_stream(stream, until);
  cpu_.allgather(mine, all, bytes);
  check(cudaMemcpyAsync(out, all, total, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync host->device");
  wait_stream(stream, until);
}

}  // namespace erun
