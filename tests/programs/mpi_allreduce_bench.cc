// Under mpirun: float32 sum allreduce time of the MPI communicator (what
// erun::init() uses under mpirun/srun) against the Gloo communicator
// bootstrapped in the same processes (pair addresses through a FileKvStore
// whose directory rank 0 picks and broadcasts with MPI), same buffers, same
// method as bench/allreduce_bench.cc.
//   mpirun -np 2 mpi_allreduce_bench [BYTES...]   (default 4 KiB, 1 MiB, 64 MiB)
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "store/file_store.h"
#include "collectives/gloo/gloo_communicator.h"
#include "collectives/mpi/mpi_communicator.h"

using namespace erun;

namespace {

double seconds_per_op(Communicator& comm, size_t bytes) {
  std::vector<float> v(bytes / sizeof(float), 1.0f);
  const int iters = static_cast<int>(std::clamp<size_t>((size_t{256} << 20) / std::max<size_t>(bytes, 1), 5, 1000));
  for (int i = 0; i < 3; ++i) comm.allreduce(v, ReduceOp::kSum);
  comm.barrier();
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) comm.allreduce(v, ReduceOp::kSum);
  double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
  return comm.allreduce_value(t, ReduceOp::kMax);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, np = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &np);
  std::vector<size_t> sizes;
  for (int i = 1; i < argc; ++i) sizes.push_back(std::strtoull(argv[i], nullptr, 10));
  if (sizes.empty()) sizes = {4096, size_t{1} << 20, size_t{64} << 20};

  char dir[256] = {};
  if (rank == 0) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "erun-mpibench-XXXXXX").string();
    std::snprintf(dir, sizeof dir, "%s", tmpl.c_str());
    if (!::mkdtemp(dir)) MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
  {
    auto mpi = make_mpi_communicator(MPI_COMM_WORLD);
    FileKvStore store(dir);
    GlooOptions o;
    o.rank = rank;
    o.size = np;
    o.timeout = std::chrono::seconds(120);
    auto gloo = make_gloo_communicator(store, o);
    for (size_t bytes : sizes) {
      for (auto [name, comm] : {std::pair<const char*, Communicator*>{"mpi", mpi.get()}, {"gloo", gloo.get()}}) {
        double t = seconds_per_op(*comm, bytes);
        if (rank == 0) {
          double algbw = static_cast<double>(bytes) / t / 1e9;
          std::printf("%-4s np=%d bytes=%zu time=%.1f us algbw=%.3f GB/s busbw=%.3f GB/s\n", name, np, bytes,
                      t * 1e6, algbw, algbw * 2.0 * (np - 1) / np);
          std::fflush(stdout);
        }
      }
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) std::filesystem::remove_all(dir);
  MPI_Finalize();
  return 0;
}
