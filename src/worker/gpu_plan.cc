#include "worker/gpu_plan.h"

#include <fmt/format.h>

#include <cstring>
#include <map>
#include <utility>

#include "erun/errors.hpp"

namespace erun::gpu_plan {
namespace {

constexpr uint32_t kMagic = 0x67707531;  // "gpu1"

std::string uuid_text(const std::array<uint8_t, 16>& u) {
  std::string s;
  for (size_t i = 0; i < u.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    s += fmt::format("{:02x}", u[i]);
  }
  return "GPU-" + s;
}

}  // namespace

int select_device(int local_rank, int visible_devices) {
  if (visible_devices <= 0) {
    throw Error("erun: this worker sees no CUDA device (check the driver, nvidia-smi and CUDA_VISIBLE_DEVICES); "
                "GPU collectives need one");
  }
  if (local_rank < 0) throw Error(fmt::format("erun: local rank {} is negative", local_rank));
  return local_rank % visible_devices;
}

std::vector<char> encode(const Identity& id) {
  std::vector<char> out(4 + 1 + id.uuid.size() + id.host.size());
  std::memcpy(out.data(), &kMagic, 4);
  out[4] = id.has_device ? 1 : 0;
  std::memcpy(out.data() + 5, id.uuid.data(), id.uuid.size());
  std::memcpy(out.data() + 5 + id.uuid.size(), id.host.data(), id.host.size());
  return out;
}

Identity decode(const std::vector<char>& bytes, int rank) {
  Identity id;
  uint32_t magic = 0;
  if (bytes.size() >= 4) std::memcpy(&magic, bytes.data(), 4);
  if (bytes.size() < 5 + id.uuid.size() || magic != kMagic) {
    throw Error(fmt::format("erun: rank {} sent a GPU identity this worker cannot read ({} bytes); run the same "
                            "erun build on every host",
                            rank, bytes.size()));
  }
  id.has_device = bytes[4] != 0;
  std::memcpy(id.uuid.data(), bytes.data() + 5, id.uuid.size());
  id.host.assign(bytes.data() + 5 + id.uuid.size(), bytes.size() - 5 - id.uuid.size());
  return id;
}

Choice choose_backend(const std::vector<Identity>& ranks, bool nccl_built, GpuBackend forced) {
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (!ranks[r].has_device) {
      throw Error(fmt::format("erun: rank {} on {} has no CUDA device; every rank of a job that uses GPU "
                              "collectives needs one",
                              r, ranks[r].host));
    }
  }
  // The first rank seen on each (host, device); a second one means sharing.
  std::map<std::pair<std::string, std::array<uint8_t, 16>>, size_t> first;
  std::string shared;
  for (size_t r = 0; r < ranks.size(); ++r) {
    auto [it, fresh] = first.emplace(std::make_pair(ranks[r].host, ranks[r].uuid), r);
    if (!fresh && shared.empty()) {
      shared = fmt::format("ranks {} and {} share {} on {}", it->second, r, uuid_text(ranks[r].uuid),
                           ranks[r].host);
    }
  }
  Choice c;
  if (forced == GpuBackend::kNccl) {
    if (!nccl_built) throw Error("erun: the NCCL GPU backend was requested but erun was built without NCCL");
    if (!shared.empty()) {
      throw Error(fmt::format("erun: the NCCL GPU backend was requested but {}; NCCL needs one GPU per rank "
                              "(use the staged backend, or give each rank its own GPU)",
                              shared));
    }
    return {GpuBackend::kNccl, "requested"};
  }
  if (forced == GpuBackend::kStaged) return {GpuBackend::kStaged, "requested"};
  if (!nccl_built) return {GpuBackend::kStaged, "erun was built without NCCL"};
  if (!shared.empty()) return {GpuBackend::kStaged, shared + " (NCCL needs one GPU per rank)"};
  return {GpuBackend::kNccl, "every rank has its own GPU"};
}

}  // namespace erun::gpu_plan
