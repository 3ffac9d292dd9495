// The decisions of the GPU communicator that need no device, kept apart so
// that they are unit-tested on machines without one: which device a rank uses,
// what a rank tells its peers about its GPU, and which backend a generation
// uses given what every rank told.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "erun/gpu.hpp"

namespace erun::gpu_plan {

// The usual convention: local rank modulo the devices this process sees
// (CUDA_VISIBLE_DEVICES narrows them; one device per worker makes it 0).
// Throws erun::Error when no device is visible.
int select_device(int local_rank, int visible_devices);

// One rank's GPU: the host it runs on and the device's UUID (cudaDeviceProp::uuid).
struct Identity {
  std::string host;
  std::array<uint8_t, 16> uuid{};
  bool has_device = false;
};
std::vector<char> encode(const Identity& id);
// Throws erun::Error when `bytes` is not an encoded Identity (a peer of another build).
Identity decode(const std::vector<char>& bytes, int rank);

struct Choice {
  GpuBackend backend = GpuBackend::kStaged;
  std::string reason;  // for the log: why this backend
};
// The same answer on every rank (it depends only on the allgathered
// identities): NCCL when it is built and no two ranks share a device (same
// UUID on the same host), staged otherwise. `forced` != kAuto overrides,
// except that forcing NCCL on a shared device is an erun::Error naming the
// ranks. A rank without a device is an erun::Error naming it.
Choice choose_backend(const std::vector<Identity>& ranks, bool nccl_built, GpuBackend forced);

}  // namespace erun::gpu_plan
