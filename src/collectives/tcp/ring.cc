// The large allreduce: ring reduce-scatter then ring allgather, run as one
// pipelined stream. Step s (0 .. 2(n-1)-1) sends block rank-s to the right
// and receives block rank-s-1 from the left (reducing it in the first n-1
// steps, storing it in the rest); each block travels as frames of at most
// kSegmentBytes, and the segment received at step s is what goes out at step
// s+1, so it is released to the sender the moment it is complete instead of
// after the whole step: the steps overlap, and no rank waits at a step
// boundary for its slowest transfer. The caller's thread receives and reduces
// (through one small window that stays in cache); for large blocks on a
// machine with a CPU per rank, the sender thread writes the frames to the
// right neighbour meanwhile, so the copy into the kernel overlaps the copy out
// of it and the reduction. Every rank reduces the same inputs in the same
// order, so the result is bitwise the same on every rank.
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
  size_t own_frames = 0;  // the sends of this rank's own block, released at once
};

RingPlan plan_ring(Transport& t, const Call& c, char* data, const std::vector<size_t>& off, size_t seg) {
  const int n = t.size();
  const int right = (t.rank() + 1) % n;
  const int steps = 2 * (n - 1);
  auto block_of = [&](int s) { return ((t.rank() - s) % n + n) % n; };
  RingPlan plan;
  // Which send last read a segment, so that it is not overwritten by a
  // receive before that send is done.
  std::map<std::pair<int, size_t>, size_t> sent_at;  // (step, offset) -> index in sends
  for (size_t from = off[block_of(0)]; from < off[block_of(0) + 1]; from += seg) {
    sent_at[{0, from}] = plan.sends.size();
    plan.sends.push_back(t.send(right, c, from, std::min(from + seg, off[block_of(0) + 1]) - from, data + from));
  }
  plan.own_frames = plan.sends.size();
  for (int s = 0; s < steps; ++s) {
    const int block = block_of(s + 1);
    for (size_t from = off[block]; from < off[block + 1]; from += seg) {
      const size_t len = std::min(from + seg, off[block + 1]) - from;
      size_t after = 0;
      if (s >= n - 1) {  // the allgather overwrites what step s+1-n sent
        auto it = sent_at.find({s + 1 - n, from});
        ERUN_CHECK(it != sent_at.end());
        after = it->second + 1;
      }
      plan.recvs.push_back({s, from, len, after});
      if (s + 1 < steps) {
        sent_at[{s + 1, from}] = plan.sends.size();
        plan.sends.push_back(t.send(right, c, from, len, data + from));
      }
    }
  }
  return plan;
}

}  // namespace

void allreduce_ring(Workspace& w, const Call& c, char* data, size_t count, size_t esize, ReduceFn fn) {
  Transport& t = w.transport;
  const int n = t.size();
  const int left = (t.rank() - 1 + n) % n;
  const std::vector<size_t> off = block_offsets(count, n, esize);
  const size_t seg = std::max<size_t>(kSegmentBytes / esize, 1) * esize;
  w.scratch.resize(kReduceSegment);
  const int steps = 2 * (n - 1);
  RingPlan plan = plan_ring(t, c, data, off, seg);

  auto receive_op = [&](const Planned& p) {
    RecvOp r = t.recv(left, p.offset, p.length, data + p.offset);
    if (p.step < n - 1) {
      char* target = data + p.offset;
      const char* in = w.scratch.data();
      r.dst = w.scratch.data();
      r.unit = esize;
      r.window = kReduceSegment;
      r.on_data = [fn, esize, target, in](size_t a, size_t b) {
        fn(target + a, target + a, in + a % kReduceSegment, (b - a) / esize);
      };
    }
    return r;
  };
  if (off[1] - off[0] < (w.cpu_per_rank ? kSenderThreadBlockBytes : kOversubscribedSenderThreadBlockBytes)) {
    // Small blocks: handing each segment to another thread costs more than it
    // overlaps; one thread moves the sends and receives side by side (a
    // receive cannot complete before the send it overwrites has left: the
    // ring carries those bytes around first).
    size_t released = plan.own_frames, next_send = 0;
    for (const Planned& p : plan.recvs) {
      RecvOp r = receive_op(p);
      t.pump(c, plan.sends, next_send, released, &r);
      if (p.step + 1 < steps) ++released;
    }
    t.pump(c, plan.sends, next_send, released, nullptr);
    return;
  }
  SenderJob job(w.sender, c, plan.sends, plan.own_frames);
  for (const Planned& p : plan.recvs) {
    job.wait_sent(p.after_send);
    RecvOp r = receive_op(p);
    job.receive(r);
    if (p.step + 1 < steps) job.release();
  }
  job.finish();
}

}  // namespace erun::tcp
