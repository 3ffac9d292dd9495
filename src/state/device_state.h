// DeviceSlot: one device buffer registered in a State, its commit in host
// memory (docs/gpu.md, "Device buffers in the State"): the host-memory
// commit file's own bytes when the State has one (registered with CUDA,
// commit_into), else a pinned buffer of the slot's own (commit); a commit
// received at sync() or loaded from a file waits in pageable memory until
// the next commit. Every wait is bounded by `timeout` (erun::Error: the GPU
// is stuck).
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "commits/host_commits.h"
#include "erun/gpu.hpp"

namespace erun::state_internal {

class DeviceSlot {
 public:
  DeviceSlot(std::string name, void* device_ptr, size_t bytes, GpuStream stream, bool async,
             std::chrono::milliseconds timeout);
  ~DeviceSlot();
  DeviceSlot(const DeviceSlot&) = delete;
  DeviceSlot& operator=(const DeviceSlot&) = delete;

  // Copies the buffer into the slot's own pinned memory (allocated at the
  // first such commit, kept until the slot goes).
  void commit();
  // Copies the buffer straight into `dst` (a host-memory commit file's bytes
  // for this entry, kept until the commit after the next) and calls
  // `landed` on a CUDA thread once they are there (it must not call CUDA).
  // The commit then lives at `dst`.
  void commit_into(char* dst, std::function<void()> landed);
  // The buffer's bytes now, as they are, become its commit (into pageable
  // memory, waited for): what sync() received into the buffer.
  void take();
  // The registration of commit files' mappings with CUDA; null without CUDA.
  static std::shared_ptr<MappingPinner> pinner();
  void fence();
  void restore();
  // take(), then its bytes into `out`.
  void save_to(std::vector<char>& out);
  // `in` (checked to be the buffer's size) into pinned memory and the device.
  void load_from(const std::vector<char>& in);
  // fence(), then the last commit's bytes into `out` (for encoding).
  void mirror(std::vector<char>& out);
  // erun::Error naming the entry unless `got` (a snapshot's size) is bytes().
  void expect_bytes(size_t got) const;

  void* buffer() const { return dev_; }
  size_t bytes() const { return bytes_; }
  GpuStream stream() const { return stream_; }

 private:
  void create_handles();  // done_ (and side_, ready_, copied_ when async_)
  void release() noexcept;  // what create_handles() and own_pinned() made
  void own_pinned();  // own_ allocated
  void copy_to_host(char* dst, std::function<void()>* landed);
  void release_kept();  // kept_ freed unless the commit lies there

  std::string name_;
  void* dev_;
  size_t bytes_;
  GpuStream stream_;
  bool async_;
  std::chrono::milliseconds timeout_;
  int device_ = 0;
  char* own_ = nullptr;     // pinned, the slot's own (commit())
  std::vector<char> kept_;  // a commit received or loaded (take(), load_from())
  char* last_ = nullptr;    // where the last commit lies: own_, kept_ or a commit file's bytes
  void* side_ = nullptr;    // cudaStream_t
  void* ready_ = nullptr;   // cudaEvent_t: the buffer's stream reached commit()
  void* copied_ = nullptr;  // cudaEvent_t: the async copy finished (the buffer's stream waits for it)
  void* done_ = nullptr;    // cudaEvent_t: the copy finished and landed() ran
  bool in_flight_ = false;
};

}  // namespace erun::state_internal
