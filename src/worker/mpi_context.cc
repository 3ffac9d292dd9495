#include "worker/mpi_context.h"

#include <cstdlib>
#include <string>

#include <fmt/format.h>

#include "common/strings.h"
#include "common/topology.h"
#include "worker/worker_info.h"

#if ERUN_HAVE_MPI
#include <mpi.h>

#include "collectives/mpi/mpi_communicator.h"
#include "common/log.h"
#endif

namespace erun {

bool launched_by_mpi(const EnvLookup& env) {
  auto set = [&](const char* name) {
    const char* v = env(name);
    return v != nullptr && *v != '\0';
  };
  if (set("ERUN_RDZV_ADDR")) return false;
  if (set("OMPI_COMM_WORLD_SIZE") || set("PMI_SIZE") || set("PMIX_RANK")) return true;
  if (set("SLURM_PROCID") && set("SLURM_NTASKS")) {
    long n = 0;
    return parse_int(env("SLURM_NTASKS"), n) && n > 1;
  }
  return false;
}

bool launched_by_mpi() {
  return launched_by_mpi([](const char* name) { return std::getenv(name); });
}

#if ERUN_HAVE_MPI
namespace {

[[noreturn]] void mpi_fail(const char* what, int rc) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw Error(fmt::format("erun: {} failed: {}", what, std::string(text, static_cast<size_t>(len))));
}

class MpiContext final : public Context {
 public:
  explicit MpiContext(int expected_size) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      if (int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided); rc != MPI_SUCCESS) {
        mpi_fail("MPI_Init_thread", rc);
      }
      owns_mpi_ = true;
    }
    Topology t;  // generation 0: a static job has one
    MPI_Comm_rank(MPI_COMM_WORLD, &t.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &t.size);
    if (expected_size > 0 && t.size != expected_size) {
      finalize();
      throw Error(fmt::format(
          "erun: the launcher started {} tasks but MPI sees a world of {}: MPI cannot reach the launcher's "
          "process manager; with srun give --mpi=pmix (or --mpi=pmi2), see `srun --mpi=list`",
          expected_size, t.size));
    }
    if (int rc = MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, t.rank, MPI_INFO_NULL, &local_);
        rc != MPI_SUCCESS) {
      mpi_fail("MPI_Comm_split_type", rc);
    }
    MPI_Comm_rank(local_, &t.local_rank);
    MPI_Comm_size(local_, &t.local_size);
    if (int rc = MPI_Comm_split(MPI_COMM_WORLD, t.local_rank, t.rank, &cross_); rc != MPI_SUCCESS) {
      mpi_fail("MPI_Comm_split", rc);
    }
    MPI_Comm_rank(cross_, &t.cross_rank);
    MPI_Comm_size(cross_, &t.cross_size);
    char name[MPI_MAX_PROCESSOR_NAME] = {};
    int len = 0;
    MPI_Get_processor_name(name, &len);
    info_ = worker_info(t, std::string(name, static_cast<size_t>(len)));
    comm_ = make_mpi_communicator(MPI_COMM_WORLD);
    ERUN_LOG_DEBUG("rank {} of {} on {} (local {}/{}, cross {}/{}): bootstrapped from MPI", info_.rank,
                   info_.size, info_.host, info_.local_rank, info_.local_size, info_.cross_rank, info_.cross_size);
  }
  ~MpiContext() override { finalize(); }

  const WorkerInfo& info() const override { return info_; }
  Communicator& comm() override { return *comm_; }
  bool host_update_pending() const override { return false; }
  bool elastic() const override { return false; }
  void rejoin(uint64_t) override {
    throw Error(fmt::format("erun: rank {}: a collective failed and MPI jobs are not elastic: the job ends here "
                            "(run it under erun to survive failures)",
                            info_.rank));
  }

 private:
  void finalize() {
    comm_.reset();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (cross_ != MPI_COMM_NULL) MPI_Comm_free(&cross_);
    if (local_ != MPI_COMM_NULL) MPI_Comm_free(&local_);
    if (owns_mpi_) MPI_Finalize();
  }

  WorkerInfo info_;
  bool owns_mpi_ = false;
  MPI_Comm local_ = MPI_COMM_NULL;
  MPI_Comm cross_ = MPI_COMM_NULL;
  std::unique_ptr<Communicator> comm_;
};

}  // namespace

std::unique_ptr<Context> make_mpi_context(int expected_size) {
  return std::make_unique<MpiContext>(expected_size);
}

#else

std::unique_ptr<Context> make_mpi_context(int) {
  throw Error("erun: this process was started by mpirun/srun but erun was built without MPI "
              "(configure with -DERUN_WITH_MPI=ON), or start it with erun instead");
}

#endif

}  // namespace erun
