#include "collectives/shm/shm_communicator.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "collectives/call_signature.h"
#include "collectives/reduce_kernels.h"
#include "collectives/shm/segment.h"
#include "common/check.h"

namespace erun {
namespace shm {
namespace {

// What the algorithms run over: the segment, and which of its buffers the
// next operation may write (kept between operations).
struct Workspace {
  Segment& segment;
  int parity = 0;  // which of each rank's two small buffers the next small path uses
  int half = 0;    // which half of its slot the next direct allreduce stages into
  // A direct allreduce returned while peers may still read the slots.
  bool fence_pending = false;

  int next_parity() {
    int p = parity;
    parity ^= 1;
    return p;
  }
  // Waits until no peer can still be reading the slots from a direct allreduce.
  void fence(const char* what) {
    if (!fence_pending) return;
    fence_pending = false;
    segment.sync(what);
  }
};

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


void allreduce(Workspace& w, void* data, size_t count, DataType type, ReduceOp op) {
  kernels::visit_cpu_type(type, [&](auto* tag) {
    allreduce_typed<std::remove_pointer_t<decltype(tag)>>(w, data, count, op);
  });
}

void broadcast(Workspace& w, char* data, size_t bytes, int root) {
  Segment& s = w.segment;
  const char* what = "broadcast";
  if (s.size() == 1 || bytes == 0) return;
  const bool is_root = s.rank() == root;
  if (bytes <= s.small_bytes()) {
    char* buf = s.small(root, w.next_parity());
    if (is_root) std::memcpy(buf, data, bytes);
    s.sync(what);
    if (!is_root) std::memcpy(data, buf, bytes);
    return;
  }
  // Two halves of the staging area (the slots and the result area after
  // them), alternately: the root fills one while the others drain the other;
  // one synchronisation per piece.
  w.fence(what);
  char* staging = s.slot(0);
  const size_t half = static_cast<size_t>(s.result() + s.step_bytes() - staging) / 2 / kLine * kLine;
  ERUN_CHECK(half > 0 && staging + half <= s.result());  // the first half never overlaps the result area
  size_t steps = (bytes + half - 1) / half;
  for (size_t i = 0; i <= steps; ++i) {
    if (is_root && i < steps) {
      size_t off = i * half;
      std::memcpy(staging + (i % 2) * half, data + off, std::min(half, bytes - off));
    }
    if (!is_root && i > 0) {
      size_t off = (i - 1) * half;
      std::memcpy(data + off, staging + ((i - 1) % 2) * half, std::min(half, bytes - off));
    }
    s.sync(what);
  }
}

void allgather(Workspace& w, const char* what, const void* in, void* out, size_t bytes) {
  Segment& s = w.segment;
  if (bytes == 0) return;
  auto* o = static_cast<char*>(out);
  const auto* i = static_cast<const char*>(in);
  if (s.size() == 1) {
    if (o != i) std::memmove(o, i, bytes);
    return;
  }
  if (bytes <= s.small_bytes()) {
    int b = w.next_parity();
    std::memcpy(s.small(s.rank(), b), i, bytes);
    s.sync(what);
    for (int r = 0; r < s.size(); ++r) {
      if (r != s.rank()) std::memcpy(o + r * bytes, s.small(r, b), bytes);
    }
    if (o + s.rank() * bytes != i) std::memcpy(o + s.rank() * bytes, s.small(s.rank(), b), bytes);
    return;
  }
  w.fence(what);
  const size_t step = s.step_bytes();
  for (size_t off = 0; off < bytes; off += step) {
    size_t n = std::min(step, bytes - off);
    std::memcpy(s.slot(s.rank()), i + off, n);
    s.sync(what);
    for (int r = 0; r < s.size(); ++r) std::memcpy(o + r * bytes + off, s.slot(r), n);
    s.sync(what);
  }
}

std::vector<std::vector<char>> allgatherv(Workspace& w, const void* in, size_t bytes) {
  Segment& s = w.segment;
  const char* what = "allgatherv";
  std::vector<uint64_t> sizes(s.size());
  uint64_t mine = bytes;
  allgather(w, what, &mine, sizes.data(), sizeof(mine));
  std::vector<std::vector<char>> result(s.size());
  size_t longest = 0;
  for (int r = 0; r < s.size(); ++r) {
    result[r].resize(sizes[r]);
    longest = std::max<size_t>(longest, sizes[r]);
  }
  const auto* i = static_cast<const char*>(in);
  if (s.size() == 1) {
    if (bytes) std::memcpy(result[0].data(), i, bytes);
    return result;
  }
  if (longest == 0) return result;
  if (longest <= s.small_bytes()) {
    int b = w.next_parity();
    if (bytes) std::memcpy(s.small(s.rank(), b), i, bytes);
    s.sync(what);
    for (int r = 0; r < s.size(); ++r) {
      if (sizes[r]) std::memcpy(result[r].data(), s.small(r, b), sizes[r]);
    }
    return result;
  }
  w.fence(what);
  const size_t step = s.step_bytes();
  for (size_t off = 0; off < longest; off += step) {
    if (off < bytes) std::memcpy(s.slot(s.rank()), i + off, std::min(step, bytes - off));
    s.sync(what);
    for (int r = 0; r < s.size(); ++r) {
      if (off < sizes[r]) std::memcpy(result[r].data() + off, s.slot(r), std::min<size_t>(step, sizes[r] - off));
    }
    s.sync(what);
  }
  return result;
}

}  // namespace
}  // namespace shm

namespace {

// The Communicator over shm::Segment: it owns the segment and the staging
// state, and runs an algorithm for every call.
class SegmentCommunicator final : public ShmCommunicator {
 public:
  SegmentCommunicator(KvStore& store, const ShmOptions& o) : segment_(store, o), w_{segment_} {}

  int rank() const override { return segment_.rank(); }
  int size() const override { return segment_.size(); }

  void allreduce(void* data, size_t count, DataType type, ReduceOp op) override {
    segment_.begin("allreduce", CallSignature::allreduce(count, type, op));
    shm::allreduce(w_, data, count, type, op);
  }

  void broadcast(void* data, size_t bytes, int root) override {
    ERUN_CHECK(root >= 0 && root < size());
    segment_.begin("broadcast", CallSignature::broadcast(bytes, root));
    shm::broadcast(w_, static_cast<char*>(data), bytes, root);
  }

  void allgather(const void* in, void* out, size_t bytes) override {
    segment_.begin("allgather", CallSignature::allgather(bytes));
    shm::allgather(w_, "allgather", in, out, bytes);
  }

  std::vector<std::vector<char>> allgatherv(const void* in, size_t bytes) override {
    segment_.begin("allgatherv", CallSignature::allgatherv());
    return shm::allgatherv(w_, in, bytes);
  }

  void barrier() override {
    segment_.begin("barrier", CallSignature::barrier());
    if (size() > 1) segment_.sync("barrier");
  }

  void abort() override { segment_.abort(); }
  void set_outside(bool outside) override { segment_.set_outside(outside); }

 private:
  shm::Segment segment_;
  shm::Workspace w_;
};

}  // namespace

std::unique_ptr<ShmCommunicator> make_shm_communicator(KvStore& store, const ShmOptions& options) {
  return std::make_unique<SegmentCommunicator>(store, options);
}

}  // namespace erun
