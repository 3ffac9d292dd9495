// The decisions of the GPU communicator that need no device, kept apart so
// that they are unit-tested on machines without one: which device a rank uses,
// what a rank tells its peers about its GPU, which backend a generation
// uses given what every rank told, and whether the NCCL communicator the
// ranks kept from their last generation can be shrunk into this one's.
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

// One rank's GPU: the host it runs on and the device's UUID
// (cudaDeviceProp::uuid); and the NCCL communicator it kept from its last
// generation, if any (a process keeps its device for life, so a kept
// communicator is on the same GPU).
struct Identity {
  std::string host;
  std::array<uint8_t, 16> uuid{};
  bool has_device = false;
  bool can_shrink = false;     // its NCCL has ncclCommShrink
  long kept_generation = -1;   // the generation of the kept communicator; -1: none
  int kept_rank = -1;          // its rank in the kept communicator
  int kept_size = 0;           // the kept communicator's size
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

struct ShrinkPlan {
  bool shrink = false;
  std::vector<int> excluded;  // ranks of the kept communicator that are not in this generation
  std::string reason;         // for the log: why (not)
};
// The same answer on every rank: shrink when every rank of this generation
// kept a healthy communicator of the same generation and size, can shrink,
// the generation lost ranks and gained none, and the survivors keep their
// order (ncclCommShrink renumbers them in order, which must give this
// generation's ranks). Otherwise a new init.
ShrinkPlan plan_shrink(const std::vector<Identity>& ranks);

}  // namespace erun::gpu_plan
