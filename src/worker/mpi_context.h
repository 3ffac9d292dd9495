// The worker's Context when mpirun or srun started it (no erun driver): rank
// and size from MPI_COMM_WORLD, local rank/size from a shared-memory split,
// cross rank/size from a split by local rank, CPU collectives over MPI. Not
// elastic: host updates never arrive, rejoin() throws erun::Error, and a dead
// peer ends the whole job (mpirun/srun kill the other ranks). init() builds it
// once; its destructor calls MPI_Finalize if it called MPI_Init. When erun is
// built without MPI, launched_by_mpi() is false and make_mpi_context() throws.
#pragma once

#include <functional>
#include <memory>

#include "erun/erun.hpp"

namespace erun {

using EnvLookup = std::function<const char*(const char*)>;

// True when an MPI launcher (Open MPI's mpirun, a PMI/PMIx launcher, or srun
// with more than one task) started this process and no erun driver did
// (ERUN_RDZV_ADDR unset). Reads only through `env`.
bool launched_by_mpi(const EnvLookup& env);
bool launched_by_mpi();

// `expected_size` (0: unknown) is the world size the launcher announced (e.g.
// SLURM_NTASKS); a different MPI world size is an erun::Error that says how to
// make MPI see the launcher (e.g. srun --mpi=pmix).
std::unique_ptr<Context> make_mpi_context(int expected_size = 0);

}  // namespace erun
