// The ring: a reduce-scatter, and for the large allreduce an allgather after
// it, run as one pipelined stream. Step s sends block first-s to the right
// and receives block first-s-1 from the left, reducing it with this rank's
// own input in the first n-1 steps and storing it in the rest; after n-1
// steps the block first+1 is fully reduced here (the allreduce starts at
// first = rank, the reduce-scatter at first = rank-1, so that each rank ends
// with its own block). Each block travels as frames of at most
// kSegmentBytes, and the segment received at step s is what goes out at step
// s+1, so it is released to the sender the moment it is complete instead of
// after the whole step: the steps overlap, and no rank waits at a step
// boundary for its slowest transfer. The caller's thread receives and reduces
// (through one small window that stays in cache); for large blocks on a
// machine with a CPU per rank, the sender thread writes the frames to the
// right neighbour meanwhile, so the copy into the kernel overlaps the copy out
// of it and the reduction. Every rank reduces the same inputs in the same
// order, so the allreduce's result is bitwise the same on every rank. The
// reduction of block b starts from the input of the rank that sends it at
// step 0: rank b in the allreduce, rank b+1 in the reduce-scatter, so float
// sums of the two may differ in their last bits (integers never do).
#include <algorithm>
#include <map>
#include <utility>

#include "collectives/tcp/algorithms.h"
#include "common/check.h"

namespace erun::tcp {
namespace {

// The pipelined ring moves a block in frames of at most this size; a
// segment is forwarded as soon as it has arrived (and been reduced).
constexpr size_t kSegmentBytes = 512 << 10;
// From this block size (bytes / ranks) up, the ring's sends go out on the
// sender thread when the machine has a CPU per rank (cpu_per_rank);
// below it the hand-over per segment costs more than the overlap gains.
// With more ranks than CPUs, the second thread costs CPU for 4 MiB blocks
// but not from 16 MiB up, where it keeps a rank's stream moving while the
// scheduler runs its neighbours (docs/performance.md section 8).
constexpr size_t kSenderThreadBlockBytes = 4 << 20;
constexpr size_t kOversubscribedSenderThreadBlockBytes = 16 << 20;

// What one ring moves and where: blocks [off[i], off[i+1]) of the
// collective's buffer (byte offsets, as the frames name them); step 0 sends
// block `first` from own + offset; the block received at step s lands at
// land[s] (its first byte), is reduced there with own + offset in the first
// n-1 steps, and is forwarded from there at step s+1.
struct RingSpec {
  std::vector<size_t> off;
  int first = 0;
  int steps = 0;
  const char* own = nullptr;
  std::vector<char*> land;
};

// A receive of the ring.
struct Planned {
  int step;
  size_t offset, length;
  size_t after_send;  // sends[0, after_send) must be complete first
};

// Every frame of the operation, in order: the sends (this rank's own block,
// then each received segment forwarded, except the last step's) and the
// receives.
struct RingPlan {
  std::vector<SendOp> sends;
  std::vector<Planned> recvs;
  size_t own_frames = 0;  // the sends of step 0, released at once
};

int block_of(const Transport& t, const RingSpec& r, int step) { return ((r.first - step) % t.size() + t.size()) % t.size(); }

// Where the byte at `offset` of the block received at step s lands.
char* landing(const Transport& t, const RingSpec& r, int s, size_t offset) {
  return r.land[s] + (offset - r.off[block_of(t, r, s + 1)]);
}

RingPlan plan_ring(Transport& t, const Call& c, const RingSpec& r, size_t seg) {
  const int n = t.size();
  const int right = (t.rank() + 1) % n;
  const std::vector<size_t>& off = r.off;
  RingPlan plan;
  // Which send last read a segment, so that it is not overwritten by a
  // receive before that send is done.
  std::map<std::pair<int, size_t>, size_t> sent_at;  // (step, offset) -> index in sends
  for (size_t from = off[r.first]; from < off[r.first + 1]; from += seg) {
    sent_at[{0, from}] = plan.sends.size();
    plan.sends.push_back(t.send(right, c, from, std::min(from + seg, off[r.first + 1]) - from, r.own + from));
  }
  plan.own_frames = plan.sends.size();
  for (int s = 0; s < r.steps; ++s) {
    const int block = block_of(t, r, s + 1);
    for (size_t from = off[block]; from < off[block + 1]; from += seg) {
      const size_t len = std::min(from + seg, off[block + 1]) - from;
      size_t after = 0;
      if (s >= n - 1) {  // the allgather overwrites what step s+1-n sent
        auto it = sent_at.find({s + 1 - n, from});
        ERUN_CHECK(it != sent_at.end());
        after = it->second + 1;
      }
      plan.recvs.push_back({s, from, len, after});
      if (s + 1 < r.steps) {
        sent_at[{s + 1, from}] = plan.sends.size();
        plan.sends.push_back(t.send(right, c, from, len, landing(t, r, s, from)));
      }
    }
  }
  return plan;
}

// Runs the ring of `r` over elements of `esize` bytes, reducing with `fn`.
void run_ring(Workspace& w, const Call& c, const RingSpec& r, size_t esize, ReduceFn fn) {
  Transport& t = w.transport;
  const int n = t.size();
  const int left = (t.rank() - 1 + n) % n;
  const size_t seg = std::max<size_t>(kSegmentBytes / esize, 1) * esize;
  w.scratch.resize(kReduceSegment);
  RingPlan plan = plan_ring(t, c, r, seg);

  auto receive_op = [&](const Planned& p) {
    char* target = landing(t, r, p.step, p.offset);
    RecvOp op = t.recv(left, p.offset, p.length, target);
    if (p.step < n - 1) {
      const char* mine = r.own + p.offset;
      const char* in = w.scratch.data();
      op.dst = w.scratch.data();
      op.unit = esize;
      op.window = kReduceSegment;
      op.on_data = [fn, esize, target, mine, in](size_t a, size_t b) {
        fn(target + a, mine + a, in + a % kReduceSegment, (b - a) / esize);
      };
    }
    return op;
  };
  const size_t block_bytes = (r.off[n] - r.off[0]) / static_cast<size_t>(n);
  if (block_bytes < (w.cpu_per_rank ? kSenderThreadBlockBytes : kOversubscribedSenderThreadBlockBytes)) {
    // Small blocks: handing each segment to another thread costs more than it
    // overlaps; one thread moves the sends and receives side by side (a
    // receive cannot complete before the send it overwrites has left: the
    // ring carries those bytes around first).
    size_t released = plan.own_frames, next_send = 0;
    for (const Planned& p : plan.recvs) {
      RecvOp op = receive_op(p);
      t.pump(c, plan.sends, next_send, released, &op);
      if (p.step + 1 < r.steps) ++released;
    }
    t.pump(c, plan.sends, next_send, released, nullptr);
    return;
  }
  SenderJob job(w.sender, c, plan.sends, plan.own_frames);
  for (const Planned& p : plan.recvs) {
    job.wait_sent(p.after_send);
    RecvOp op = receive_op(p);
    job.receive(op);
    if (p.step + 1 < r.steps) job.release();
  }
  job.finish();
}

}  // namespace

void allreduce_ring(Workspace& w, const Call& c, char* data, size_t count, size_t esize, ReduceFn fn) {
  const int n = w.transport.size();
  RingSpec r{block_offsets(count, n, esize), w.transport.rank(), 2 * (n - 1), data, {}};
  for (int s = 0; s < r.steps; ++s) r.land.push_back(data + r.off[block_of(w.transport, r, s + 1)]);
  run_ring(w, c, r, esize, fn);
}

// The blocks received at steps 0 .. n-3 are partial reductions, forwarded at
// the next step: they are kept, one after the other, in w.partials (the
// blocks of every rank but this one and its left neighbour); the last step's
// lands in `out`. No region is written twice, so no receive waits for a send.
void reduce_scatter_ring(Workspace& w, const Call& c, const char* in, char* out, const std::vector<size_t>& off,
                         size_t esize, ReduceFn fn) {
  const int n = w.transport.size(), me = w.transport.rank();
  RingSpec r{off, (me - 1 + n) % n, n - 1, in, {}};
  size_t partial_bytes = 0;
  for (int s = 0; s + 1 < r.steps; ++s) {
    const int block = block_of(w.transport, r, s + 1);
    partial_bytes += off[block + 1] - off[block];
  }
  if (w.partials.size() < partial_bytes) w.partials.resize(partial_bytes);
  size_t at = 0;
  for (int s = 0; s + 1 < r.steps; ++s) {
    const int block = block_of(w.transport, r, s + 1);
    r.land.push_back(w.partials.data() + at);
    at += off[block + 1] - off[block];
  }
  r.land.push_back(out);
  run_ring(w, c, r, esize, fn);
}

}  // namespace erun::tcp
