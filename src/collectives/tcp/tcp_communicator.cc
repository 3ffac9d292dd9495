#include "collectives/tcp/tcp_communicator.h"

#include <unistd.h>

#include <cstring>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "collectives/reduce_kernels.h"
#include "collectives/tcp/algorithms.h"

namespace erun {
namespace {

using tcp::Call;
using tcp::Op;
using tcp::ReduceFn;

template <typename T, ReduceOp OP>
void reduce_typed(void* out, const void* a, const void* b, size_t n) {
  kernels::combine<T, OP>(static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b), n);
}

ReduceFn reduce_fn(DataType type, ReduceOp op) {
  return kernels::visit_cpu_type(type, [&](auto* tag) -> ReduceFn {
    using T = std::remove_pointer_t<decltype(tag)>;
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAverage: return &reduce_typed<T, ReduceOp::kSum>;
      case ReduceOp::kProduct: return &reduce_typed<T, ReduceOp::kProduct>;
      case ReduceOp::kMin: return &reduce_typed<T, ReduceOp::kMin>;
      case ReduceOp::kMax: return &reduce_typed<T, ReduceOp::kMax>;
    }
    return nullptr;
  });
}

// The Communicator over tcp::Transport: it owns the mesh and picks an
// algorithm (algorithms.h) for every call.
class TcpCommunicator final : public Communicator {
 public:
  TcpCommunicator(KvStore& store, const TcpOptions& o)
      : t_(o), sender_(t_), w_{t_, sender_, o.machine_ranks <= ::sysconf(_SC_NPROCESSORS_ONLN), {}, {}} {
    if (o.size > 1) t_.connect(store);
  }

  int rank() const override { return t_.rank(); }
  int size() const override { return t_.size(); }

  void allreduce(void* data, size_t count, DataType type, ReduceOp op) override {
    ReduceFn fn = reduce_fn(type, op);  // throws for float16/bfloat16 before anything is sent
    Call c{Op::kAllreduce, static_cast<uint8_t>(type), static_cast<uint8_t>(op), count, 0};
    run(c, [&] {
      if (size() == 1) return;
      const size_t esize = data_type_size(type);
      const size_t bytes = count * esize;
      char* p = static_cast<char*>(data);
      if (bytes <= kDirectAllreduceBytes || count < static_cast<size_t>(size())) {
        tcp::allreduce_direct(w_, c, p, count, esize, fn);
      } else if (medium_direct(bytes)) {
        tcp::allreduce_scatter_gather(w_, c, p, count, esize, fn);
      } else {
        tcp::allreduce_ring(w_, c, p, count, esize, fn);
      }
    });
    if (op == ReduceOp::kAverage && size() > 1) kernels::divide(data, count, type, size());
  }

  // A medium size among 3 to 8 ranks: scattered and gathered directly (the
  // allreduce and the reduce-scatter choose alike).
  bool medium_direct(size_t bytes) const {
    return bytes <= kScatterGatherBytes && size() > 2 && size() <= kScatterGatherRanks;
  }

  // Reduces only what this rank keeps: each rank sends and receives (n-1)/n
  // of the input, once, where the base class's allreduce of a copy moves it
  // twice. Small (or medium, 3 to 8 ranks): the direct reduce-scatter of
  // the medium allreduce; else the first half of the allreduce's ring.
  void reduce_scatter(const void* in, void* out, const std::vector<size_t>& counts, DataType type,
                      ReduceOp op) override {
    if (counts.size() != static_cast<size_t>(size())) return Communicator::reduce_scatter(in, out, counts, type, op);
    ReduceFn fn = reduce_fn(type, op);  // throws for float16/bfloat16 before anything is sent
    const size_t esize = data_type_size(type);
    std::vector<size_t> off(counts.size() + 1, 0);
    for (size_t r = 0; r < counts.size(); ++r) off[r + 1] = off[r] + counts[r] * esize;
    const size_t bytes = off.back(), mine = off[rank() + 1] - off[rank()];
    Call c{Op::kReduceScatter, static_cast<uint8_t>(type), static_cast<uint8_t>(op), bytes / esize,
           tcp::split_fingerprint(counts)};
    run(c, [&] {
      const char* i = static_cast<const char*>(in);
      char* o = static_cast<char*>(out);
      if (size() == 1) {
        if (mine) std::memmove(o, i, mine);
      } else if (bytes <= kDirectAllreduceBytes || medium_direct(bytes)) {
        tcp::direct_reduce_scatter(w_, c, i, o, off, esize, fn);
      } else {
        tcp::reduce_scatter_ring(w_, c, i, o, off, esize, fn);
      }
    });
    if (op == ReduceOp::kAverage && size() > 1) kernels::divide(out, counts[rank()], type, size());
  }

  void broadcast(void* data, size_t bytes, int root) override {
    if (root < 0 || root >= size()) throw std::invalid_argument(fmt::format("erun tcp: broadcast root {} is not a rank of {}", root, size()));
    Call c{Op::kBroadcast, 0, 0, bytes, root};
    run(c, [&] {
      if (size() == 1) return;
      if (size() == 2 || bytes <= kDirectBroadcastBytes) {
        tcp::broadcast_direct(t_, c, static_cast<char*>(data), bytes, root);
      } else {
        tcp::broadcast_scatter_allgather(t_, c, static_cast<char*>(data), bytes, root);
      }
    });
  }

  void allgather(const void* in, void* out, size_t bytes) override {
    Call c{Op::kAllgather, 0, 0, bytes, 0};
    run(c, [&] {
      char* o = static_cast<char*>(out);
      if (bytes) std::memmove(o + rank() * bytes, in, bytes);
      if (size() == 1) return;
      tcp::allgather_blocks(t_, c, o, tcp::equal_blocks(size(), bytes));
    });
  }

  std::vector<std::vector<char>> allgatherv(const void* in, size_t bytes) override {
    std::vector<std::vector<char>> result(size());
    Call sizes{Op::kAllgathervSizes, 0, 0, 0, 0};
    run(sizes, [&] {
      std::vector<uint64_t> lens(size());
      lens[rank()] = bytes;
      if (size() > 1) {
        tcp::direct_allgather(t_, sizes, reinterpret_cast<char*>(lens.data()),
                              tcp::equal_blocks(size(), sizeof(uint64_t)));
      }
      std::vector<size_t> off(size() + 1, 0);
      for (int i = 0; i < size(); ++i) off[i + 1] = off[i] + lens[i];
      std::vector<char> all(off[size()]);
      if (bytes) std::memcpy(all.data() + off[rank()], in, bytes);
      Call data{Op::kAllgatherv, 0, 0, off[size()], 0};
      if (size() > 1) tcp::allgather_blocks(t_, data, all.data(), off);
      for (int i = 0; i < size(); ++i) result[i].assign(all.begin() + off[i], all.begin() + off[i + 1]);
    });
    return result;
  }

  void barrier() override {
    Call c{Op::kBarrier, 0, 0, 0, 0};
    run(c, [&] { tcp::barrier_dissemination(t_, c); });
  }

  void abort() override { t_.abort(); }

 private:
  // Below these, one direct exchange (one round trip) beats a ring.
  static constexpr size_t kDirectAllreduceBytes = 128 << 10;
  static constexpr size_t kDirectBroadcastBytes = 256 << 10;
  // Up to this size, and with 3 to this many ranks, a medium allreduce is a
  // direct reduce-scatter and a direct allgather: the ring's bytes in 2
  // steps instead of 2(n-1), each a hop that waits for the slowest rank to
  // be scheduled (docs/performance.md section 8). With 2 ranks the ring is
  // already 2 steps, and it pipelines the block in segments.
  static constexpr size_t kScatterGatherBytes = 4 << 20;
  static constexpr int kScatterGatherRanks = 8;

  // Runs one collective: checks the communicator is usable, numbers it, and
  // turns every failure into a CommError that names the operation and rank,
  // after shutting the sockets so that the peers fail at once too.
  template <typename F>
  void run(const Call& c, F&& body) {
    if (t_.aborted()) throw CommError(fmt::format("erun tcp: {}: {} after abort()", t_.who(), tcp::op_name(c.op)));
    if (broken_) throw CommError(fmt::format("erun tcp: {}: {} on a communicator that already failed ({})", t_.who(), tcp::op_name(c.op), broken_reason_));
    t_.begin();
    try {
      body();
    } catch (const CommError& e) {
      broken_ = true;
      broken_reason_ = e.what();
      t_.shutdown();
      throw;
    }
  }

  tcp::Transport t_;
  tcp::Sender sender_;  // destroyed before t_: its thread ends first
  tcp::Workspace w_;
  bool broken_ = false;
  std::string broken_reason_;
};

}  // namespace

std::unique_ptr<Communicator> make_tcp_communicator(KvStore& store, const TcpOptions& o) {
  if (o.size < 1 || o.rank < 0 || o.rank >= o.size) {
    throw std::invalid_argument(fmt::format("erun tcp: rank {} of size {} is not a rank", o.rank, o.size));
  }
  return std::make_unique<TcpCommunicator>(store, o);
}

}  // namespace erun
