/* Start-up benchmark peer: MPI_Init and one MPI_Barrier, then exit. */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char** argv) {
  int rank = 0, size = 1;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) printf("mpi_startup: world=%d barrier done\n", size);
  MPI_Finalize();
  return 0;
}
