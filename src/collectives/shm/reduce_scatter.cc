// Reduce-scatter through the staging slots: piece by piece of the whole
// vector, every rank stages the piece, then each rank reduces, from every
// rank's slot, the part of the piece that falls in its own block, straight
// into its output. Nobody reduces rows another rank gets, so the work and
// the reads are 1/size of an allreduce's reduction and there is no
// allgather. Every element is reduced in rank order, with the kernels the
// allreduce uses.
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
  const size_t my_hi = my_lo + counts[rank];
  if (total == 0) return;
  if (n_ranks == 1) {
    std::memcpy(out, in, total * sizeof(T));
    return;
  }
  std::vector<const T*> inputs(n_ranks);
  const size_t step = s.step_bytes() / sizeof(T);
  T* mine = reinterpret_cast<T*>(s.slot(s.rank()));
  w.fence(kWhat);
  for (size_t off = 0; off < total; off += step) {
    const size_t n = std::min(step, total - off);
    // The own block is read from `in`: stage the rest of the piece only.
    const size_t lo = std::clamp(my_lo, off, off + n) - off, hi = std::clamp(my_hi, off, off + n) - off;
    std::memcpy(mine, in + off, lo * sizeof(T));
    std::memcpy(mine + hi, in + off + hi, (n - hi) * sizeof(T));
    s.sync(kWhat);
    if (hi > lo) {
      for (size_t r = 0; r < n_ranks; ++r) {
        inputs[r] = r == rank ? in + off + lo : reinterpret_cast<const T*>(s.slot(static_cast<int>(r))) + lo;
      }
      T* to = out + (off + lo - my_lo);
      kernels::reduce_all<T, OP>(to, inputs.data(), n_ranks, hi - lo);
      if constexpr (OP == ReduceOp::kAverage) kernels::divide(to, hi - lo, s.size());
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
