// Reduce-scatter through the staging slots, in rounds: a rank's slot holds
// one part per rank, and in round j every rank stages into part r the j-th
// piece of rank r's block, then each rank reduces its own j-th piece from
// part `rank` of every slot (its own input read in place), straight into
// its output. All ranks reduce at once (a round covers a piece of every
// block), nobody reduces rows another rank gets, and there is no allgather.
// Every element is reduced in rank order, with the allreduce's kernels.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "collectives/reduce_kernels.h"
#include "collectives/shm/algorithms.h"
#include "common/check.h"

namespace erun::shm {
namespace {

constexpr const char* kWhat = "reduce_scatter";

template <typename T, ReduceOp OP>
void reduce_scatter_op(Workspace& w, const T* in, T* out, const std::vector<size_t>& counts) {
  Segment& s = w.segment;
  const size_t n_ranks = static_cast<size_t>(s.size());
  const size_t rank = static_cast<size_t>(s.rank());
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  const size_t my_lo = std::accumulate(counts.begin(), counts.begin() + static_cast<long>(rank), size_t{0});
  if (total == 0) return;
  if (n_ranks == 1) {
    std::memcpy(out, in, total * sizeof(T));
    return;
  }
  std::vector<const T*> inputs(n_ranks);
  std::vector<size_t> begin(n_ranks, 0);
  for (size_t r = 1; r < n_ranks; ++r) begin[r] = begin[r - 1] + counts[r - 1];
  const size_t line = kLine / sizeof(T);
  const size_t per = s.step_bytes() / sizeof(T) / n_ranks;
  const size_t part = per >= line ? per / line * line : std::max<size_t>(per, 1);  // a part per rank
  const size_t longest = *std::max_element(counts.begin(), counts.end());
  T* mine = reinterpret_cast<T*>(s.slot(s.rank()));
  w.fence(kWhat);
  for (size_t j = 0; j < longest; j += part) {
    for (size_t r = 0; r < n_ranks; ++r) {
      const size_t n = counts[r] > j ? std::min(part, counts[r] - j) : 0;
      if (r != rank && n > 0) std::memcpy(mine + r * part, in + begin[r] + j, n * sizeof(T));
    }
    s.sync(kWhat);
    const size_t n = counts[rank] > j ? std::min(part, counts[rank] - j) : 0;
    if (n > 0) {
      for (size_t r = 0; r < n_ranks; ++r) {
        inputs[r] = r == rank ? in + my_lo + j : reinterpret_cast<const T*>(s.slot(static_cast<int>(r))) + rank * part;
      }
      kernels::reduce_all<T, OP>(out + j, inputs.data(), n_ranks, n);
      if constexpr (OP == ReduceOp::kAverage) kernels::divide(out + j, n, s.size());
    }
    // Every rank is done reading the slots before anyone stages again
    // (here, or a direct allreduce next, which does not fence).
    s.sync(kWhat);
  }
}

template <typename T>
void reduce_scatter_typed(Workspace& w, const void* in, void* out, const std::vector<size_t>& counts, ReduceOp op) {
  const T* i = static_cast<const T*>(in);
  T* o = static_cast<T*>(out);
  switch (op) {
    case ReduceOp::kSum: return reduce_scatter_op<T, ReduceOp::kSum>(w, i, o, counts);
    case ReduceOp::kAverage: return reduce_scatter_op<T, ReduceOp::kAverage>(w, i, o, counts);
    case ReduceOp::kMin: return reduce_scatter_op<T, ReduceOp::kMin>(w, i, o, counts);
    case ReduceOp::kMax: return reduce_scatter_op<T, ReduceOp::kMax>(w, i, o, counts);
    case ReduceOp::kProduct: return reduce_scatter_op<T, ReduceOp::kProduct>(w, i, o, counts);
  }
  ERUN_CHECK(false);
}

}  // namespace

void reduce_scatter(Workspace& w, const void* in, void* out, const std::vector<size_t>& counts, DataType type,
                    ReduceOp op) {
  kernels::visit_cpu_type(type, [&](auto* tag) {
    reduce_scatter_typed<std::remove_pointer_t<decltype(tag)>>(w, in, out, counts, op);
  });
}

}  // namespace erun::shm
