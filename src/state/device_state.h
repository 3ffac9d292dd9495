// DeviceSlot: the committed copy of one device buffer registered in a State,
// kept in pinned host memory (never a second copy on the GPU, which is full of
// model). commit() copies device -> pinned: synchronously on the buffer's
// stream, or asynchronously on a side stream that waits for the work already
// on the buffer's stream, while the buffer's stream waits for the copy before
// any later work (so a kernel enqueued after commit() never races the copy);
// the host returns at once and the next commit, restore or read fences it.
// restore() copies pinned -> device. save_to()/load_from() move the commit
// through a byte vector for State's generic paths (sync over the CPU
// communicator, durable commits); sync over NCCL broadcasts the buffer itself
// (buffer(), bytes(), stream()) and then commit()s it.
// Waits are bounded by `timeout` (erun::Error: the GPU is stuck). Without
// CUDA the constructor throws "erun was built without CUDA".
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "erun/gpu.hpp"

namespace erun::state_internal {

class DeviceSlot {
 public:
  DeviceSlot(std::string name, void* device_ptr, size_t bytes, GpuStream stream, bool async,
             std::chrono::milliseconds timeout);
  ~DeviceSlot();
  DeviceSlot(const DeviceSlot&) = delete;
  DeviceSlot& operator=(const DeviceSlot&) = delete;

  void commit();
  void fence();
  void restore();
  // commit() and fence(), then the pinned bytes into `out`.
  void save_to(std::vector<char>& out);
  // `in` (checked to be the buffer's size) into pinned memory and the device.
  void load_from(const std::vector<char>& in);
  // fence(), then the pinned bytes into `out` (the last commit, for encoding).
  void mirror(std::vector<char>& out);
  // erun::Error naming the entry unless `got` (a snapshot's size) is bytes().
  void expect_bytes(size_t got) const;

  void* buffer() const { return dev_; }
  size_t bytes() const { return bytes_; }
  GpuStream stream() const { return stream_; }

 private:
  struct Cuda;
  std::string name_;
  void* dev_;
  size_t bytes_;
  GpuStream stream_;
  bool async_;
  std::chrono::milliseconds timeout_;
  int device_ = 0;
  char* pinned_ = nullptr;
  void* side_ = nullptr;   // cudaStream_t
  void* ready_ = nullptr;  // cudaEvent_t: the buffer's stream reached commit()
  void* done_ = nullptr;   // cudaEvent_t: the copy finished
  bool in_flight_ = false;
};

}  // namespace erun::state_internal
