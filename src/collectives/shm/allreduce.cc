#include <cstring>
#include <type_traits>

#include "collectives/reduce_kernels.h"
#include "collectives/shm/algorithms.h"
#include "common/check.h"

namespace erun::shm {
namespace {

constexpr const char* kWhat = "allreduce";

// Bytes per rank up to which allreduce takes the direct path (after the
// small one): half a slot. Measured on the 2-core VM (per-op 10th
// percentile busbw, float32 sum), direct vs reduce-scatter + allgather:
// 2 ranks 64 KiB 10.9 vs 7.5 GB/s, 256 KiB 9.2 vs 7.4, 512 KiB 9.2 vs 6.9,
// but 1 MiB (as two direct pieces) 6.5 vs 17; 4 ranks 64 KiB 5.9 vs 0.6,
// 256 KiB 7.3 vs 2.8. Extra work (all ranks read all inputs) is cheaper
// than a second synchronisation up to about half a MiB.
size_t direct_bytes(const Segment& s) { return s.step_bytes() / 2 / kLine * kLine; }

// One synchronisation: everyone publishes, then everyone reduces it all.
template <typename T, ReduceOp OP>
void allreduce_small(Workspace& w, T* data, size_t count, const T** inputs) {
  Segment& s = w.segment;
  const int b = w.next_parity();
  std::memcpy(s.small(s.rank(), b), data, count * sizeof(T));
  s.sync(kWhat);
  for (int r = 0; r < s.size(); ++r) inputs[r] = reinterpret_cast<const T*>(s.small(r, b));
  kernels::reduce_all<T, OP>(data, inputs, static_cast<size_t>(s.size()), count);
  if constexpr (OP == ReduceOp::kAverage) kernels::divide(data, count, s.size());
}

// Every rank stages its whole vector in one half of its slot, then every
// rank reduces all of them into its own buffer: one synchronisation. The
// halves alternate, so a rank rewrites a half only after everyone passed the
// next direct allreduce's synchronisation, i.e. finished reading it. Peers
// may still read when this returns: `fence_pending` makes the next operation
// that stages into the slots otherwise synchronise first.
template <typename T, ReduceOp OP>
void allreduce_direct(Workspace& w, T* data, size_t count, const T** inputs) {
  Segment& s = w.segment;
  const size_t offset = static_cast<size_t>(w.half) * direct_bytes(s);
  w.half ^= 1;
  std::memcpy(s.slot(s.rank()) + offset, data, count * sizeof(T));
  s.sync(kWhat);
  for (int r = 0; r < s.size(); ++r) inputs[r] = reinterpret_cast<const T*>(s.slot(r) + offset);
  kernels::reduce_all<T, OP>(data, inputs, static_cast<size_t>(s.size()), count);
  if constexpr (OP == ReduceOp::kAverage) kernels::divide(data, count, s.size());
  w.fence_pending = true;
}

// Pipelined reduce-scatter + allgather through the staging slots: per
// piece, everyone stages it, rank r reduces the r-th part into the result
// area, everyone copies the result out. With a CPU per rank the reduction
// also writes the own part into the caller's buffer and the copy skips it.
// Measured per op (10th percentile, float32 sum, 2-core VM): 2 ranks 1 MiB
// 17 vs 10 GB/s with the own part written during the reduction; 4 ranks
// 16 MiB 2.5 vs 3.0 GB/s, 64 MiB 2.3 vs 2.8 (the reduction phase, which
// every rank waits for, gets longer while ranks share CPUs).
template <typename T, ReduceOp OP>
void allreduce_pipelined(Workspace& w, T* data, size_t count, const T** inputs) {
  Segment& s = w.segment;
  const size_t n_ranks = static_cast<size_t>(s.size());
  const bool own_part_done = s.cpu_per_rank() && OP != ReduceOp::kAverage;
  const size_t step = s.step_bytes() / sizeof(T);
  T* result = reinterpret_cast<T*>(s.result());
  T* mine = reinterpret_cast<T*>(s.slot(s.rank()));
  for (size_t off = 0; off < count; off += step) {
    const size_t n = std::min(step, count - off);
    const size_t part = round_up((n + n_ranks - 1) / n_ranks, kLine / sizeof(T));
    const size_t lo = std::min(n, s.rank() * part), hi = std::min(n, lo + part);
    std::memcpy(mine, data + off, lo * sizeof(T));
    std::memcpy(mine + hi, data + off + hi, (n - hi) * sizeof(T));
    s.sync(kWhat);
    if (hi > lo) {
      for (size_t r = 0; r < n_ranks; ++r) {
        inputs[r] = r == static_cast<size_t>(s.rank()) ? data + off + lo
                                                        : reinterpret_cast<const T*>(s.slot(static_cast<int>(r))) + lo;
      }
      if (own_part_done) {
        kernels::reduce_all2<T, OP>(result + lo, data + off + lo, inputs, n_ranks, hi - lo);
      } else {
        kernels::reduce_all<T, OP>(result + lo, inputs, n_ranks, hi - lo);
        if constexpr (OP == ReduceOp::kAverage) kernels::divide(result + lo, hi - lo, s.size());
      }
    }
    s.sync(kWhat);
    if (own_part_done) {
      std::memcpy(data + off, result, lo * sizeof(T));
      std::memcpy(data + off + hi, result + hi, (n - hi) * sizeof(T));
    } else {
      std::memcpy(data + off, result, n * sizeof(T));
    }
  }
  // No closing barrier: peers may still copy from the result area, which no
  // operation writes before its own first synchronisation (the broadcast's
  // first half lies below it; everything else writes slots or the small area).
}

template <typename T, ReduceOp OP>
void allreduce_op(Workspace& w, T* data, size_t count) {
  const size_t n_ranks = static_cast<size_t>(w.segment.size());
  if (count == 0 || n_ranks == 1) return;
  const T* in[64];
  std::vector<const T*> in_heap;
  const T** inputs = in;
  if (n_ranks > 64) {
    in_heap.resize(n_ranks);
    inputs = in_heap.data();
  }
  const size_t bytes = count * sizeof(T);
  if (bytes <= w.segment.small_bytes()) return allreduce_small<T, OP>(w, data, count, inputs);
  if (bytes <= direct_bytes(w.segment)) return allreduce_direct<T, OP>(w, data, count, inputs);
  w.fence(kWhat);
  allreduce_pipelined<T, OP>(w, data, count, inputs);
}

template <typename T>
void allreduce_typed(Workspace& w, void* data, size_t count, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return allreduce_op<T, ReduceOp::kSum>(w, static_cast<T*>(data), count);
    case ReduceOp::kAverage: return allreduce_op<T, ReduceOp::kAverage>(w, static_cast<T*>(data), count);
    case ReduceOp::kMin: return allreduce_op<T, ReduceOp::kMin>(w, static_cast<T*>(data), count);
    case ReduceOp::kMax: return allreduce_op<T, ReduceOp::kMax>(w, static_cast<T*>(data), count);
    case ReduceOp::kProduct: return allreduce_op<T, ReduceOp::kProduct>(w, static_cast<T*>(data), count);
  }
  ERUN_CHECK(false);
}

}  // namespace

void allreduce(Workspace& w, void* data, size_t count, DataType type, ReduceOp op) {
  kernels::visit_cpu_type(type, [&](auto* tag) {
    allreduce_typed<std::remove_pointer_t<decltype(tag)>>(w, data, count, op);
  });
}

}  // namespace erun::shm
