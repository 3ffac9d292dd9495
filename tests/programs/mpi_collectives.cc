// Checks erun's MPI bootstrap under a real mpirun: the Context that
// erun::init() builds (rank, size, local and cross splits, not elastic), every
// collective for every data type and reduction against a reference computed
// locally, and the MpiBroadcastStore used for the NCCL unique id. Prints
// "mpi_collectives: OK size=N" on rank 0 and exits 0; any mismatch prints it
// and exits 1.
//   --die-rank R  after the checks, all ranks allreduce in a loop and rank R
//                 SIGKILLs itself: the job must end, not hang.
#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include <mpi.h>

#include "collectives/mpi/mpi_communicator.h"
#include "erun/erun.hpp"

namespace {

int g_failures = 0;
int g_rank = 0;

#define EXPECT(cond, ...)                                                  \
  do {                                                                     \
    if (!(cond)) {                                                         \
      ++g_failures;                                                        \
      std::fprintf(stderr, "rank %d: FAILED %s: ", g_rank, #cond);         \
      std::fprintf(stderr, __VA_ARGS__);                                   \
      std::fprintf(stderr, "\n");                                          \
    }                                                                      \
  } while (0)

// Rank r's i-th input: small values whose sums and products are exact, with
// negatives for the integer types (integer average truncates toward zero).
template <typename T>
T input(int r, size_t i) {
  if constexpr (std::is_same_v<T, uint8_t>) return static_cast<T>(200 + r * 7 + i % 5);  // sums wrap mod 256
  if constexpr (std::is_integral_v<T>) return static_cast<T>((static_cast<long>(i % 11) - 5) * (r + 1) + r);
  return static_cast<T>(0.5 * (r + 1) + static_cast<double>(i % 7) - 3.0);
}

template <typename T>
T product_input(int r, size_t i) {
  return static_cast<T>(1 + (r + i) % 2);  // 1 or 2: products stay exact
}

template <typename T>
T reference(erun::ReduceOp op, int size, size_t i) {
  using W = std::conditional_t<std::is_integral_v<T>, int64_t, double>;
  W acc = op == erun::ReduceOp::kProduct ? W(1) : W(0);
  T mn = input<T>(0, i), mx = input<T>(0, i);
  for (int r = 0; r < size; ++r) {
    T v = op == erun::ReduceOp::kProduct ? product_input<T>(r, i) : input<T>(r, i);
    if (op == erun::ReduceOp::kProduct) acc *= static_cast<W>(v);
    else acc += static_cast<W>(v);
    mn = std::min(mn, v);
    mx = std::max(mx, v);
  }
  switch (op) {
    case erun::ReduceOp::kSum:
    case erun::ReduceOp::kProduct: return static_cast<T>(acc);
    case erun::ReduceOp::kAverage: return static_cast<T>(static_cast<T>(acc) / static_cast<T>(size));
    case erun::ReduceOp::kMin: return mn;
    case erun::ReduceOp::kMax: return mx;
  }
  return T{};
}

template <typename T>
void check_allreduce(erun::Communicator& comm, size_t count) {
  for (auto op : {erun::ReduceOp::kSum, erun::ReduceOp::kAverage, erun::ReduceOp::kMin, erun::ReduceOp::kMax,
                  erun::ReduceOp::kProduct}) {
    std::vector<T> v(count);
    for (size_t i = 0; i < count; ++i)
      v[i] = op == erun::ReduceOp::kProduct ? product_input<T>(comm.rank(), i) : input<T>(comm.rank(), i);
    comm.allreduce(v, op);
    size_t bad = 0, first = count;
    for (size_t i = 0; i < count; ++i) {
      if (v[i] != reference<T>(op, comm.size(), i)) {
        if (bad++ == 0) first = i;
      }
    }
    EXPECT(bad == 0, "allreduce %s %s count %zu: %zu wrong, first at %zu (got %g, want %g)",
           erun::to_string(erun::data_type_of<T>()), erun::to_string(op), count, bad, first,
           bad ? static_cast<double>(v[first]) : 0.0,
           bad ? static_cast<double>(reference<T>(op, comm.size(), first)) : 0.0);
  }
}

// MPI_Reduce_scatter: rank r gets its block of counts (rank r: r * per + 1
// elements), the reference of those elements of the whole vector.
template <typename T>
void check_reduce_scatter(erun::Communicator& comm, size_t per) {
  std::vector<size_t> counts;
  size_t total = 0, begin = 0;
  for (int r = 0; r < comm.size(); ++r) {
    counts.push_back(static_cast<size_t>(r) * per + 1);
    if (r < comm.rank()) begin += counts.back();
    total += counts.back();
  }
  for (auto op : {erun::ReduceOp::kSum, erun::ReduceOp::kAverage, erun::ReduceOp::kMin, erun::ReduceOp::kMax,
                  erun::ReduceOp::kProduct}) {
    std::vector<T> in(total), out(counts[static_cast<size_t>(comm.rank())]);
    for (size_t i = 0; i < total; ++i)
      in[i] = op == erun::ReduceOp::kProduct ? product_input<T>(comm.rank(), i) : input<T>(comm.rank(), i);
    comm.reduce_scatter(in.data(), out.data(), counts, erun::data_type_of<T>(), op);
    size_t bad = 0;
    for (size_t i = 0; i < out.size(); ++i) bad += out[i] != reference<T>(op, comm.size(), begin + i);
    EXPECT(bad == 0, "reduce_scatter %s %s per %zu: %zu wrong", erun::to_string(erun::data_type_of<T>()),
           erun::to_string(op), per, bad);
  }
}

int run(int die_rank) {
  erun::Context& ctx = erun::init();
  g_rank = ctx.rank();
  erun::Communicator& comm = ctx.comm();
  const int n = ctx.size();
  const char* ompi_size = std::getenv("OMPI_COMM_WORLD_SIZE");

  EXPECT(!ctx.elastic(), "an MPI context must not be elastic");
  EXPECT(!ctx.host_update_pending(), "host updates never arrive under MPI");
  EXPECT(comm.size() == n && comm.rank() == ctx.rank(), "comm rank/size %d/%d", comm.rank(), comm.size());
  if (ompi_size) EXPECT(n == std::atoi(ompi_size), "size %d vs OMPI_COMM_WORLD_SIZE %s", n, ompi_size);
  // One machine: every rank is local to every other.
  EXPECT(ctx.info().local_size == n && ctx.local_rank() == ctx.rank(), "local %d/%d", ctx.local_rank(),
         ctx.info().local_size);
  EXPECT(ctx.info().cross_size == 1 && ctx.info().cross_rank == 0, "cross %d/%d", ctx.info().cross_rank,
         ctx.info().cross_size);
  bool threw = false;
  try {
    ctx.rejoin(0);
  } catch (const erun::Error& e) {
    threw = std::strstr(e.what(), "not elastic") != nullptr;
  }
  EXPECT(threw, "rejoin() must throw erun::Error saying MPI jobs are not elastic");

  for (size_t count : {size_t{1}, size_t{1000}, (size_t{1} << 20) + 3}) {
    check_allreduce<float>(comm, count);
    check_allreduce<double>(comm, count);
    check_allreduce<int32_t>(comm, count);
    check_allreduce<int64_t>(comm, count);
    check_allreduce<uint8_t>(comm, count);
  }
  for (size_t per : {size_t{0}, size_t{5}, size_t{100003}}) {
    check_reduce_scatter<float>(comm, per);
    check_reduce_scatter<int64_t>(comm, per);
    check_reduce_scatter<uint8_t>(comm, per);
  }
  for (auto t : {erun::DataType::kFloat16, erun::DataType::kBFloat16}) {
    uint16_t h[4] = {};
    bool invalid = false;
    try {
      comm.allreduce(h, 4, t, erun::ReduceOp::kSum);
    } catch (const std::invalid_argument&) {
      invalid = true;
    }
    EXPECT(invalid, "%s allreduce must be std::invalid_argument on the CPU", erun::to_string(t));
  }

  for (int root = 0; root < n; ++root) {
    std::vector<char> b(100003, ctx.rank() == root ? static_cast<char>(root + 1) : 0);
    comm.broadcast(b.data(), b.size(), root);
    EXPECT(b.front() == root + 1 && b.back() == root + 1, "broadcast from %d", root);
  }
  {
    std::vector<int64_t> mine = {ctx.rank() * 10, ctx.rank() * 10 + 1};
    std::vector<int64_t> all(2 * static_cast<size_t>(n));
    comm.allgather(mine.data(), all.data(), sizeof(int64_t) * 2);
    for (int r = 0; r < n; ++r)
      EXPECT(all[2 * r] == r * 10 && all[2 * r + 1] == r * 10 + 1, "allgather slot %d", r);
  }
  {
    // Rank r gives r*3 bytes of value r (rank 0 gives nothing).
    std::vector<char> mine(static_cast<size_t>(ctx.rank()) * 3, static_cast<char>(ctx.rank()));
    auto all = comm.allgatherv(mine.data(), mine.size());
    EXPECT(all.size() == static_cast<size_t>(n), "allgatherv returned %zu parts", all.size());
    for (int r = 0; r < n && r < static_cast<int>(all.size()); ++r)
      EXPECT(all[r] == std::vector<char>(static_cast<size_t>(r) * 3, static_cast<char>(r)), "allgatherv part %d", r);
  }
  comm.barrier();

  {
    // The NCCL unique-id path: rank 0 publishes, the others receive.
    erun::MpiBroadcastStore store(MPI_COMM_WORLD, 0);
    std::vector<char> id(128);
    for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<char>(i * 7 + 3);
    std::vector<char> got;
    if (ctx.rank() == 0) {
      store.set("gen0/nccl/nccl_unique_id", id);
      got = store.get("gen0/nccl/nccl_unique_id", std::chrono::seconds(5));
    } else {
      got = store.get("gen0/nccl/nccl_unique_id", std::chrono::seconds(5));
    }
    EXPECT(got == id, "MpiBroadcastStore value differs");
    EXPECT(store.check({"gen0/nccl/nccl_unique_id"}), "check() after the exchange");
  }

  int failures = comm.allreduce_value<int32_t>(g_failures, erun::ReduceOp::kSum);
  if (ctx.rank() == 0) {
    if (failures == 0) std::printf("mpi_collectives: OK size=%d\n", n);
    else std::printf("mpi_collectives: %d FAILURES size=%d\n", failures, n);
  }
  if (failures != 0) return 1;

  if (die_rank >= 0) {
    std::vector<float> v(1024, 1.0f);
    for (long step = 0;; ++step) {
      if (ctx.rank() == die_rank && step == 20) {
        std::printf("rank %d: killing myself\n", ctx.rank());
        std::fflush(stdout);
        ::raise(SIGKILL);
      }
      comm.allreduce(v, erun::ReduceOp::kMax);
    }
  }
  erun::shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  int die_rank = -1;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--die-rank" && i + 1 < argc) die_rank = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: mpi_collectives [--die-rank R]\n");
      return 2;
    }
  }
  try {
    return run(die_rank);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi_collectives: rank %d: %s\n", g_rank, e.what());
    return 1;
  }
}
