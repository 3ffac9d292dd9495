#include <cstring>

#include "collectives/tcp/algorithms.h"

namespace erun::tcp {

// Rank q's block of every input travels straight to rank q, which reduces
// the n inputs in rank order: every rank sends and receives (n-1)/n of the
// buffer, as in the ring, but in one step.
void direct_reduce_scatter(Workspace& w, const Call& c, const char* in, char* out, const std::vector<size_t>& off,
                           size_t esize, ReduceFn fn) {
  Transport& t = w.transport;
  const int n = t.size(), me = t.rank();
  const size_t mine = off[me + 1] - off[me];
  w.scratch.resize(mine * n);
  char* slots = w.scratch.data();
  if (mine) std::memcpy(slots + me * mine, in + off[me], mine);
  std::vector<SendOp> sends;
  std::vector<RecvOp> recvs;
  for (int q = 0; q < n; ++q) {
    if (q == me) continue;
    sends.push_back(t.send(q, c, off[q], off[q + 1] - off[q], in + off[q]));
    recvs.push_back(t.recv(q, off[me], mine, slots + q * mine));
  }
  t.transfer(c, sends, recvs);
  reduce_slots(n, out, slots, mine, mine / esize, fn);
}

// A direct reduce-scatter, then each rank sends its reduced block to every
// rank. Each rank moves what the ring moves (2(n-1)/n of the buffer) in two
// steps; each block is reduced by one rank only, so every rank ends with the
// same bits.
void allreduce_scatter_gather(Workspace& w, const Call& c, char* data, size_t count, size_t esize, ReduceFn fn) {
  const std::vector<size_t> off = block_offsets(count, w.transport.size(), esize);
  direct_reduce_scatter(w, c, data, data + off[w.transport.rank()], off, esize, fn);
  direct_allgather(w.transport, c, data, off);
}

}  // namespace erun::tcp
