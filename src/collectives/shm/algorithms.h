// The collective algorithms over Segment (segment.h), each called after
// Segment::begin(); ShmCommunicator picks them. docs/design.md; crossovers:
// docs/performance.md.
#pragma once

#include <cstddef>
#include <vector>

#include "collectives/shm/segment.h"
#include "erun/communicator.hpp"

namespace erun::shm {

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

// allreduce.cc: small messages in one synchronisation through the small
// buffers, medium ones staged whole in the slots (direct), large ones as a
// pipelined reduce-scatter + allgather. Throws std::invalid_argument for
// types without a CPU reduction.
void allreduce(Workspace& w, void* data, size_t count, DataType type, ReduceOp op);

// reduce_scatter.cc: piece by piece through the slots, each rank reducing
// the part of its own block (Communicator::reduce_scatter); `counts` has one
// entry per rank.
void reduce_scatter(Workspace& w, const void* in, void* out, const std::vector<size_t>& counts, DataType type,
                    ReduceOp op);

// broadcast.cc: through the root's small buffer, or piece by piece through
// two alternating halves of the staging area.
void broadcast(Workspace& w, char* data, size_t bytes, int root);

// allgather.cc: rank r's `bytes` from `in` land at out + r * bytes; `what`
// names the operation in errors.
void allgather(Workspace& w, const char* what, const void* in, void* out, size_t bytes);
// Every rank's contribution, of any length (the lengths are allgathered first).
std::vector<std::vector<char>> allgatherv(Workspace& w, const void* in, size_t bytes);

}  // namespace erun::shm
