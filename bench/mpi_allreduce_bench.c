/* MPI_Allreduce (float32, sum) with the same sizes, repetitions and output as
 * shm_allreduce_bench, for side-by-side numbers:
 *   mpirun -np N [--allow-run-as-root --oversubscribe] mpi_allreduce_bench [BYTES...] */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, np = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &np);
  size_t defaults[] = {(size_t)4 << 10, (size_t)64 << 10, (size_t)1 << 20, (size_t)16 << 20, (size_t)64 << 20, (size_t)256 << 20};
  size_t n_sizes = argc > 1 ? (size_t)(argc - 1) : sizeof(defaults) / sizeof(defaults[0]);
  enum { kReps = 5 };
  for (size_t s = 0; s < n_sizes; ++s) {
    size_t bytes = argc > 1 ? strtoull(argv[s + 1], NULL, 10) : defaults[s];
    size_t count = bytes / sizeof(float);
    float* v = malloc(count * sizeof(float) + 1);
    for (size_t i = 0; i < count; ++i) v[i] = 1.0f;
    size_t iters = ((size_t)200 << 20) / (bytes ? bytes : 1);
    if (iters < 3) iters = 3;
    if (iters > 2000) iters = 2000;
    /* MPI counts are int: the sizes used here stay far below 2^31 elements. */
    for (size_t i = 0; i < (iters / 10 > 3 ? iters / 10 : 3); ++i)
      MPI_Allreduce(MPI_IN_PLACE, v, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double times[kReps];
    for (int rep = 0; rep < kReps; ++rep) {
      MPI_Barrier(MPI_COMM_WORLD);
      double start = MPI_Wtime();
      for (size_t i = 0; i < iters; ++i)
        MPI_Allreduce(MPI_IN_PLACE, v, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      double t = (MPI_Wtime() - start) / (double)iters;
      MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      times[rep] = t;
    }
    qsort(times, kReps, sizeof(double), cmp);
    if (rank == 0) {
      double t = times[kReps / 2];
      double algbw = (double)bytes / t / 1e9;
      double busbw = algbw * 2.0 * (np - 1) / np;
      printf("np=%d bytes=%zu iters=%zu time=%.2f us min=%.2f us max=%.2f us algbw=%.3f GB/s busbw=%.3f GB/s "
             "backend=mpi\n",
             np, bytes, iters, t * 1e6, times[0] * 1e6, times[kReps - 1] * 1e6, algbw, busbw);
      fflush(stdout);
    }
    free(v);
  }
  MPI_Finalize();
  return 0;
}
