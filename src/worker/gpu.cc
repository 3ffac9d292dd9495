// GpuCommunicator: the public face of the GPU collectives. It keeps the
// device chosen on first use for the life of the process (the user's buffers
// live there), and one backend per generation: on the first GPU collective of
// a generation every rank allgathers (host, device UUID) over the
// generation's CPU communicator, all ranks make the same choice
// (gpu_plan::choose_backend), and NCCL's unique id is broadcast over the same
// CPU communicator (the rendezvous-built mesh under erun, MPI under
// mpirun/srun), so every step is bounded by the collective timeout.
// Leaving a generation keeps a healthy NCCL communicator aside (no operation
// is in flight then: every GPU collective waits for its stream); when the
// next generation only lost ranks, it is shrunk into that generation's
// (ncclCommShrink, NCCL 2.27+: gpu_plan::plan_shrink), with a new init as the
// fallback on any error; in every other case it is aborted.
#include <unistd.h>

#include <fmt/format.h>

#include <climits>
#include <cstring>
#include <mutex>

#include "common/log.h"
#include "erun/erun.hpp"
#include "worker/gpu_plan.h"

#if ERUN_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "collectives/cuda/staged_communicator.h"
#endif
#if ERUN_HAVE_NCCL
#include "collectives/nccl/nccl_communicator.h"
#endif

namespace erun {

const char* to_string(GpuBackend b) {
  switch (b) {
    case GpuBackend::kAuto: return "auto";
    case GpuBackend::kNccl: return "nccl";
    case GpuBackend::kStaged: return "staged";
  }
  return "?";
}

bool built_with_cuda() {
#if ERUN_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

bool built_with_nccl() {
#if ERUN_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

int gpu_device_count() {
#if ERUN_HAVE_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the "no device" error
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

namespace {

[[noreturn]] [[maybe_unused]] void no_cuda(const char* what) {
  throw Error(fmt::format("erun: GPU {}: erun was built without CUDA; rebuild it where the CUDA toolkit is "
                          "found (cmake -DERUN_WITH_NCCL=AUTO or ON, CUDA_HOME set)",
                          what));
}

[[maybe_unused]] std::string this_host() {
  char name[HOST_NAME_MAX + 1] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "unknown";
  return name;
}

#if ERUN_HAVE_CUDA
void cuda_check(cudaError_t e, const char* what, int device) {
  if (e == cudaSuccess) return;
  throw Error(fmt::format("erun: {} on device {} failed: {}", what, device, cudaGetErrorString(e)));
}
#endif

}  // namespace

struct GpuCommunicator::Impl {
  explicit Impl(Context& c) : ctx(c) {}
  Context& ctx;
  // Runs one NCCL collective (it returns once its stream finished it) and
  // adds its time to the context's time in collectives.
  template <class Collective>
  void timed(Collective&& collective) {
    const auto t0 = std::chrono::steady_clock::now();
    collective();
    ctx.collective_waited(std::chrono::steady_clock::now() - t0);
  }
  int device = -1;
  GpuBackend forced = GpuBackend::kAuto;
  GpuBackend backend = GpuBackend::kAuto;  // kAuto: none built for `generation`
  long generation = -1;
  std::mutex mu;  // the backend pointers, against abort() from another thread
#if ERUN_HAVE_NCCL
  std::unique_ptr<NcclCommunicator> nccl;
  // The NCCL communicator of generation kept_generation, kept for a shrink.
  std::unique_ptr<NcclCommunicator> kept;
  long kept_generation = -1;
#endif
#if ERUN_HAVE_CUDA
  std::unique_ptr<StagedGpuCommunicator> staged;
#endif

  void abort() noexcept {
    std::lock_guard<std::mutex> lock(mu);
#if ERUN_HAVE_NCCL
    if (nccl) nccl->abort();
    if (kept) kept->abort();
#endif
#if ERUN_HAVE_CUDA
    if (staged) staged->abort();
#endif
  }

  // Aborts and frees the backend: ncclCommAbort, never ncclCommDestroy,
  // because a peer of the generation being left may be hung. `keep`: a
  // healthy NCCL communicator is kept aside for a shrink instead.
  void drop(bool keep = false) noexcept {
    std::lock_guard<std::mutex> lock(mu);
#if ERUN_HAVE_NCCL
    if (keep && nccl && nccl->healthy() && NcclCommunicator::shrink_supported()) {
      discard_kept();
      kept = std::move(nccl);
      kept_generation = generation;
    }
    if (nccl) nccl->abort();
    nccl.reset();
    if (!keep) discard_kept();
#endif
#if ERUN_HAVE_CUDA
    staged.reset();
#endif
    backend = GpuBackend::kAuto;
    generation = -1;
  }

#if ERUN_HAVE_NCCL
  void discard_kept() noexcept {
    if (kept) kept->abort();
    kept.reset();
    kept_generation = -1;
  }
#endif

  int select_device() {
#if ERUN_HAVE_CUDA
    if (device < 0) device = gpu_plan::select_device(ctx.local_rank(), gpu_device_count());
    cuda_check(cudaSetDevice(device), "cudaSetDevice", device);
    return device;
#else
    no_cuda("device selection");
#endif
  }

  // The backend of the current generation, built on its first use: the
  // ranks swap their identities and agree on it (gpu_plan::choose_backend).
  void ensure(const char* what) {
#if ERUN_HAVE_CUDA
    const long gen = ctx.info().generation;
    if (backend != GpuBackend::kAuto && gen == generation) {
      cuda_check(cudaSetDevice(device), "cudaSetDevice", device);
      return;
    }
    drop(/*keep=*/true);
    const int dev = select_device();
    cudaDeviceProp prop{};
    cuda_check(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties", dev);
    std::vector<char> mine = gpu_plan::encode(identity(prop));
    std::vector<std::vector<char>> all = ctx.comm().allgatherv(mine.data(), mine.size());
    std::vector<gpu_plan::Identity> ids;
    for (size_t r = 0; r < all.size(); ++r) ids.push_back(gpu_plan::decode(all[r], static_cast<int>(r)));
    gpu_plan::Choice choice = gpu_plan::choose_backend(ids, built_with_nccl(), forced);
    const std::string tag = who(gen, ctx.info().host, ctx.rank());
    if (ctx.rank() == 0) {
      ERUN_LOG_INFO("{}: GPU collectives of generation {} use {}: {}", tag, gen, to_string(choice.backend),
                    choice.reason);
    }
    ERUN_LOG_DEBUG("{}: GPU device {} ({})", tag, dev, prop.name);
    build(choice.backend, dev, ids, tag);
    backend = choice.backend;
    generation = gen;
#else
    no_cuda(what);
#endif
  }

#if ERUN_HAVE_CUDA
  // What this rank tells the others for the choice of backend: its host, its
  // device's UUID, and the NCCL communicator it keeps for a shrink.
  gpu_plan::Identity identity(const cudaDeviceProp& prop) {
    gpu_plan::Identity me;
    me.host = this_host();
    std::memcpy(me.uuid.data(), prop.uuid.bytes, me.uuid.size());
    me.has_device = true;
#if ERUN_HAVE_NCCL
    me.can_shrink = NcclCommunicator::shrink_supported();
    if (kept && kept->healthy()) {
      me.kept_generation = kept_generation;
      me.kept_rank = kept->rank();
      me.kept_size = kept->size();
    }
#endif
    return me;
  }

  // Builds the chosen backend on device `dev`: NCCL (the kept communicator
  // shrunk when the ranks' identities allow it, else a new one), or
  // host-staged collectives over the CPU communicator.
  void build(GpuBackend chosen, int dev, [[maybe_unused]] const std::vector<gpu_plan::Identity>& ids,
             [[maybe_unused]] const std::string& tag) {
    Communicator& cpu = ctx.comm();
    const auto timeout = ctx.collective_timeout();
    if (chosen == GpuBackend::kNccl) {
#if ERUN_HAVE_NCCL
      NcclOptions o;
      o.rank = ctx.rank();
      o.size = ctx.size();
      o.device = dev;
      o.timeout = timeout;
      std::unique_ptr<NcclCommunicator> comm = shrink_kept(gpu_plan::plan_shrink(ids), o, cpu, tag);
      if (!comm) comm = init_nccl(o, cpu, tag);
      std::lock_guard<std::mutex> lock(mu);
      nccl = std::move(comm);
#endif
      return;
    }
#if ERUN_HAVE_NCCL
    {
      std::lock_guard<std::mutex> lock(mu);
      discard_kept();
    }
#endif
    StagedOptions o;
    o.device = dev;
    o.timeout = timeout;
    auto comm = std::make_unique<StagedGpuCommunicator>(cpu, o);
    std::lock_guard<std::mutex> lock(mu);
    staged = std::move(comm);
  }
#endif

#if ERUN_HAVE_NCCL
  // The kept communicator shrunk into this generation's when `plan` says so
  // and every rank's shrink succeeded (agreed over `cpu`, so that all ranks
  // fall back to an init together); nullptr otherwise. The kept one is
  // aborted either way.
  std::unique_ptr<NcclCommunicator> shrink_kept(const gpu_plan::ShrinkPlan& plan, const NcclOptions& o,
                                                Communicator& cpu, const std::string& tag) {
    std::unique_ptr<NcclCommunicator> shrunk;
    if (plan.shrink) {
      const auto t0 = std::chrono::steady_clock::now();
      std::string failure;
      try {
        shrunk = kept->shrink(plan.excluded, o);
      } catch (const CommError& e) {
        failure = e.what();
      }
      int32_t ok = shrunk ? 1 : 0;
      cpu.allreduce(&ok, 1, DataType::kInt32, ReduceOp::kMin);
      if (ok == 0) {
        ERUN_LOG_WARN("{}: shrinking the NCCL communicator failed{}{}; a new init follows", tag,
                      failure.empty() ? " on another rank" : ": ", failure);
        if (shrunk) shrunk->abort();
        shrunk.reset();
      } else {
        ERUN_LOG_INFO("{}: NCCL communicator shrunk in {:.3f} s ({})", tag,
                      seconds(std::chrono::steady_clock::now() - t0), plan.reason);
      }
    } else if (kept) {
      ERUN_LOG_DEBUG("{}: the kept NCCL communicator is not shrunk: {}", tag, plan.reason);
    }
    std::lock_guard<std::mutex> lock(mu);
    discard_kept();
    return shrunk;
  }

  // A new NCCL communicator: rank 0's unique id (or its failure) goes to
  // every rank over `cpu` as [ok][id], then the init.
  std::unique_ptr<NcclCommunicator> init_nccl(const NcclOptions& o, Communicator& cpu, const std::string& tag) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<char> msg(1 + sizeof(NcclId), 0);
    std::string failure;
    if (o.rank == 0) {
      try {
        NcclId id = nccl_unique_id();
        msg[0] = 1;
        std::memcpy(msg.data() + 1, id.data(), id.size());
      } catch (const CommError& e) {
        failure = e.what();
      }
    }
    cpu.broadcast(msg.data(), msg.size(), 0);
    if (msg[0] != 1) {
      throw CommError(fmt::format("erun: {}: rank 0 could not create the NCCL unique id{}{}", tag,
                                  failure.empty() ? "" : ": ", failure));
    }
    NcclId id;
    std::memcpy(id.data(), msg.data() + 1, id.size());
    auto comm = std::make_unique<NcclCommunicator>(id, o);
    ERUN_LOG_DEBUG("{}: NCCL communicator of {} ranks initialised in {:.3f} s", tag, o.size,
                   seconds(std::chrono::steady_clock::now() - t0));
    return comm;
  }
#endif
};

GpuCommunicator::GpuCommunicator(Context& ctx) : impl_(std::make_unique<Impl>(ctx)) {}
GpuCommunicator::~GpuCommunicator() { impl_->drop(); }

int GpuCommunicator::device() { return impl_->select_device(); }

void GpuCommunicator::set_device(int device) {
  if (impl_->device >= 0 && impl_->device != device) {
    throw Error(fmt::format("erun: set_device({}) after device {} was already in use; call it before the first "
                            "GPU collective or device()",
                            device, impl_->device));
  }
  if (device < 0 || (built_with_cuda() && device >= gpu_device_count())) {
    throw Error(fmt::format("erun: set_device({}): this worker sees {} CUDA devices", device, gpu_device_count()));
  }
  impl_->device = device;
}

void GpuCommunicator::set_backend(GpuBackend backend) { impl_->forced = backend; }

GpuBackend GpuCommunicator::backend() {
  impl_->ensure("backend");
  return impl_->backend;
}

int GpuCommunicator::rank() const { return impl_->ctx.rank(); }
int GpuCommunicator::size() const { return impl_->ctx.size(); }

// An NCCL collective returns once its stream has finished it: its time goes
// to the context's time in collectives (the straggler timing, docs/design.md
// "Stragglers"), as comm()'s collectives' does. The host-staged path needs
// nothing: its CPU collectives go through ctx.comm().
void GpuCommunicator::allreduce(void* data, size_t count, DataType type, ReduceOp op, GpuStream stream) {
  impl_->ensure("allreduce");
#if ERUN_HAVE_CUDA
  auto s = static_cast<cudaStream_t>(stream);
#if ERUN_HAVE_NCCL
  if (impl_->backend == GpuBackend::kNccl) {
    return impl_->timed([&] { impl_->nccl->allreduce(data, count, type, op, s); });
  }
#endif
  impl_->staged->allreduce(data, count, type, op, s);
#endif
}

void GpuCommunicator::broadcast(void* data, size_t bytes, int root, GpuStream stream) {
  if (root < 0 || root >= size()) {
    throw Error(fmt::format("erun: GPU broadcast root {} is not a rank of this world of {}", root, size()));
  }
  impl_->ensure("broadcast");
#if ERUN_HAVE_CUDA
  auto s = static_cast<cudaStream_t>(stream);
#if ERUN_HAVE_NCCL
  if (impl_->backend == GpuBackend::kNccl) return impl_->timed([&] { impl_->nccl->broadcast(data, bytes, root, s); });
#endif
  impl_->staged->broadcast(data, bytes, root, s);
#endif
}

void GpuCommunicator::allgather(const void* in, void* out, size_t bytes, GpuStream stream) {
  impl_->ensure("allgather");
#if ERUN_HAVE_CUDA
  auto s = static_cast<cudaStream_t>(stream);
#if ERUN_HAVE_NCCL
  if (impl_->backend == GpuBackend::kNccl) return impl_->timed([&] { impl_->nccl->allgather(in, out, bytes, s); });
#endif
  impl_->staged->allgather(in, out, bytes, s);
#endif
}

void GpuCommunicator::abort() noexcept { impl_->abort(); }
// Leaving a generation: a healthy NCCL communicator is kept for a shrink
// (nothing is in flight on it: every collective waited for its stream).
void GpuCommunicator::release() noexcept { impl_->drop(/*keep=*/true); }

GpuCommunicator& Context::gpu() {
  if (!gpu_) {
    gpu_ = std::make_unique<GpuCommunicator>(*this);
    gpu_live_.store(gpu_.get(), std::memory_order_release);
  }
  return *gpu_;
}

void Context::abort_gpu_collectives() noexcept {
  if (GpuCommunicator* g = gpu_live_.load(std::memory_order_acquire)) g->abort();
}

void Context::abort_gpu() noexcept {
  if (gpu_) gpu_->release();
}

}  // namespace erun
