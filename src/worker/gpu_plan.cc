#include "worker/gpu_plan.h"

#include <fmt/format.h>

#include <cstring>
#include <map>
#include <utility>

#include "common/codec.h"
#include "erun/errors.hpp"

namespace erun::gpu_plan {
namespace {

// Then has_device, the UUID, can_shrink, the kept communicator's generation,
// rank and size, and the host (common/codec.h's little-endian encoding).
constexpr uint32_t kMagic = 0x67707533;  // "gpu3"

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
  PayloadWriter w;
  w.u32(kMagic)
      .u8(id.has_device ? 1 : 0)
      .fixed({reinterpret_cast<const char*>(id.uuid.data()), id.uuid.size()})
      .u8(id.can_shrink ? 1 : 0)
      .i64(id.kept_generation)
      .i32(id.kept_rank)
      .i32(id.kept_size)
      .bytes(id.host);
  return {w.str().begin(), w.str().end()};
}

Identity decode(const std::vector<char>& bytes, int rank) {
  PayloadReader r({bytes.data(), bytes.size()});
  Identity id;
  const bool magic_ok = r.u32() == kMagic;
  id.has_device = r.u8() != 0;
  const std::string uuid = r.fixed(id.uuid.size());
  id.can_shrink = r.u8() != 0;
  id.kept_generation = static_cast<long>(r.i64());
  id.kept_rank = r.i32();
  id.kept_size = r.i32();
  id.host = r.bytes();
  if (!magic_ok || !r.done()) {
    throw Error(fmt::format("erun: rank {} sent a GPU identity this worker cannot read ({} bytes); run the same "
                            "erun build on every host",
                            rank, bytes.size()));
  }
  std::memcpy(id.uuid.data(), uuid.data(), id.uuid.size());
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

ShrinkPlan plan_shrink(const std::vector<Identity>& ranks) {
  ShrinkPlan plan;
  if (ranks.empty()) return plan;
  const Identity& first = ranks.front();
  for (size_t r = 0; r < ranks.size(); ++r) {
    const Identity& id = ranks[r];
    if (!id.can_shrink) {
      plan.reason = fmt::format("rank {}'s NCCL has no ncclCommShrink", r);
      return plan;
    }
    if (id.kept_generation < 0) {
      plan.reason = fmt::format("rank {} kept no NCCL communicator (new, or its last one failed)", r);
      return plan;
    }
    if (id.kept_generation != first.kept_generation || id.kept_size != first.kept_size) {
      plan.reason = fmt::format("rank {} kept the communicator of generation {} ({} ranks), rank 0 that of {} ({})",
                                r, id.kept_generation, id.kept_size, first.kept_generation, first.kept_size);
      return plan;
    }
    if (id.kept_rank < 0 || id.kept_rank >= id.kept_size || (r > 0 && id.kept_rank <= ranks[r - 1].kept_rank)) {
      plan.reason = fmt::format("the ranks did not keep their order (rank {} was rank {})", r, id.kept_rank);
      return plan;
    }
  }
  if (static_cast<int>(ranks.size()) >= first.kept_size) {
    plan.reason = "no rank left";
    return plan;
  }
  size_t next = 0;
  for (int k = 0; k < first.kept_size; ++k) {
    if (next < ranks.size() && ranks[next].kept_rank == k) {
      ++next;
    } else {
      plan.excluded.push_back(k);
    }
  }
  plan.shrink = true;
  plan.reason = fmt::format("{} of generation {}'s {} ranks left", plan.excluded.size(), first.kept_generation,
                            first.kept_size);
  return plan;
}

}  // namespace erun::gpu_plan
