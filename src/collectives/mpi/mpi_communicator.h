// MpiCommunicator: the CPU Communicator of a static job that mpirun or srun
// started (no erun driver). Built from an MPI communicator, which it
// duplicates, with MPI_ERRORS_RETURN on the duplicate so an MPI error becomes
// an erun::CommError naming the operation. Use from one thread at a time.
// MPI has no per-operation timeout and cannot abort one communicator: abort()
// only makes later operations throw. A peer that dies ends the whole job
// (mpirun/srun kill the other ranks), so MPI jobs are not elastic.
#pragma once

#include <mpi.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "erun/communicator.hpp"
#include "store/kv_store.h"

namespace erun {

// Reductions follow the Gloo communicator's rules: integer kAverage is the sum
// divided by size() with truncation toward zero; float16/bfloat16 are not
// supported on the CPU (std::invalid_argument).
std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm);

// A KvStore for data one rank publishes to all (the NCCL unique id): `root`
// calls set(), every other rank calls get() for the same key, in the same
// order, and each pair of calls is one MPI_Bcast over `comm` (collective; the
// timeout is not enforced, as MPI has none). check() answers from the keys this
// rank has already set or received. Not for Gloo's all-to-all bootstrap.
class MpiBroadcastStore final : public KvStore {
 public:
  MpiBroadcastStore(MPI_Comm comm, int root);
  ~MpiBroadcastStore() override;
  MpiBroadcastStore(const MpiBroadcastStore&) = delete;
  MpiBroadcastStore& operator=(const MpiBroadcastStore&) = delete;

  void set(const std::string& key, const std::vector<char>& value) override;
  std::vector<char> get(const std::string& key, Duration timeout) override;
  bool check(const std::vector<std::string>& keys) override;

 private:
  std::vector<char> exchange(const std::string& key, const std::vector<char>* value);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int root_ = 0;
  int rank_ = 0;
  std::map<std::string, std::vector<char>> seen_;
};

}  // namespace erun
