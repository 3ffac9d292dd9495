// erun's worker API. A training program calls erun::init() once, keeps its
// training state in an erun::State, and runs its loop inside erun::run():
//
//   erun::Context& ctx = erun::init();
//   erun::State state(ctx);
//   state.register_value("epoch", &epoch);
//   state.register_vector("weights", &weights);
//   erun::run(state, [&](erun::State& s) {
//     for (; epoch < epochs; ++epoch) { ...; ctx.comm().allreduce(grads, erun::ReduceOp::kAverage);
//                                       s.commit(); }
//   });
//
// Device buffers: ctx.gpu().allreduce(ptr, n, type, op, stream) and
// state.register_device_buffer(...) (gpu.hpp, docs/gpu.md).
//
// Under the erun driver the worker joins the driver's rendezvous and is
// elastic; under mpirun/srun it bootstraps from MPI and is static; alone it is
// a world of one. All of that is hidden behind Context.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "erun/communicator.hpp"
#include "erun/errors.hpp"
#include "erun/export.hpp"
#include "erun/gpu.hpp"
#include "erun/state.hpp"

namespace erun {

struct WorkerInfo {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  int cross_rank = 0;
  int cross_size = 1;
  long generation = 0;
  std::string host;
};

// Why a worker leaves its generation.
struct RejoinCause {
  bool hosts_updated = false;  // the driver announced a change; otherwise a collective failed
  int failed_rank = -1;        // the rank that failed it (CommError::failed_rank()), -1 when unknown
  PeerFate fate = PeerFate::kUnknown;
};

// The worker's view of the job. Used from the training thread; only
// host_update_pending() may be called from any thread.
class ERUN_API Context {
 public:
  virtual ~Context() = default;
  virtual const WorkerInfo& info() const = 0;
  int rank() const { return info().rank; }
  int size() const { return info().size; }
  int local_rank() const { return info().local_rank; }
  virtual Communicator& comm() = 0;
  // Collectives on device buffers (see gpu.hpp); made on first use, rebuilt
  // for every generation on its first GPU collective.
  GpuCommunicator& gpu();
  // The bound on every collective (erun --collective-timeout).
  virtual std::chrono::milliseconds collective_timeout() const { return std::chrono::seconds(30); }
  // This worker's local view: the driver announced a membership change.
  // State::check_host_updates() turns it into an agreement among all ranks.
  virtual bool host_update_pending() const = 0;
  // Leaves the current generation and blocks until the driver publishes the
  // next one containing this worker; then info() and comm() are the new ones.
  // last_commit_id tells the driver which worker holds the newest state.
  virtual void rejoin(uint64_t last_commit_id) = 0;
  // The same, telling the driver why (erun::run() calls this one). The default
  // ignores the cause.
  virtual void rejoin_because(uint64_t last_commit_id, const RejoinCause& cause) {
    (void)cause;
    rejoin(last_commit_id);
  }
  // True under the erun driver (membership can change); false under MPI or alone.
  virtual bool elastic() const = 0;
  // Where durable commits go when the launcher asked for them (erun
  // --checkpoint-dir, i.e. ERUN_CHECKPOINT_DIR); empty otherwise. A State
  // adopts it at its first sync() unless set_checkpoint_dir() was called.
  virtual std::string checkpoint_dir() const { return {}; }
  // Where this worker keeps its newest commit in host memory, as a path stem
  // (STEM.a, STEM.b) in the job's private directory that erun's driver names
  // (ERUN_COMMIT_DIR); empty when the worker was not started by erun. A State
  // writes every commit there and, at its first sync(), restores the newest
  // commit its host holds when that is newer than its own (docs/state.md).
  virtual std::string host_commit_stem() const { return {}; }
  // The pending change is a host that drains (it got a notice to leave):
  // State::check_host_updates() between commits then commits first, so the
  // leaving workers take no step with them (docs/state.md, "Leaving on notice").
  virtual bool drain_pending() const { return false; }

 protected:
  // Where this worker's States serve its host's commit files to the job's
  // other workers while they reshard sharded entries (docs/state.md,
  // "Sharded entries"), and the credentials that guard them; an empty
  // address outside erun.
  struct PeerLink {
    std::string address;
    std::string job_id;
    std::string secret;
    // Hosts besides this one that keep a copy of each commit's pieces
    // (--commit-replicas): 0 means no buddy copies at all.
    int replicas = 1;
  };
  virtual PeerLink peer_link() const { return {}; }

  // Implementations call this when they leave a generation (rejoin): the GPU
  // communicator is aborted, never destroyed while a peer may hang.
  void abort_gpu() noexcept;
  // From any thread: makes the GPU collectives of the current generation,
  // blocked or later, throw CommError (when GPU collectives were used).
  void abort_gpu_collectives() noexcept;

 private:
  friend class State;
  friend class GpuCommunicator;
  // The numbers of this worker's States (state.cc): each State has its own
  // host-memory commit files. Per number: 0 never used, 1 held by a live
  // State, 2 held before by a State since destroyed. Shared with the States,
  // which may outlive the Context (erun::shutdown()).
  std::shared_ptr<std::vector<unsigned char>> state_numbers_ = std::make_shared<std::vector<unsigned char>>();
  // A State committed `commit_id` (State::commit calls it on every rank):
  // under erun the worker reports the commit interval's timing to the
  // driver, which finds stragglers with it (docs/design.md, "Stragglers").
  virtual void committed(uint64_t commit_id) { (void)commit_id; }
  // Time spent inside a collective that does not go through comm() (the
  // GPU communicator's NCCL path), for the straggler timing.
  virtual void collective_waited(std::chrono::nanoseconds waited) noexcept { (void)waited; }
  std::unique_ptr<GpuCommunicator> gpu_;
  // gpu_, published for abort_gpu_collectives() on other threads once made.
  std::atomic<GpuCommunicator*> gpu_live_{nullptr};
};

// Connects this process to its launcher (the erun driver, MPI, or nothing) once;
// later calls return the same Context. Throws erun::Error with a clear message
// when the environment is inconsistent or the rendezvous cannot be reached.
ERUN_API Context& init();
// Leaves the job cleanly (optional; also done at exit).
ERUN_API void shutdown();

}  // namespace erun
