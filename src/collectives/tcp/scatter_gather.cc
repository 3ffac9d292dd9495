#include <cstring>

#include "collectives/tcp/algorithms.h"

namespace erun::tcp {

// Every rank sends block q to rank q, which reduces the n inputs of its block
// in rank order and sends the result to every rank. Each rank moves what the
// ring moves (2(n-1)/n of the buffer) in two steps; each block is reduced by
// one rank only, so every rank ends with the same bits.
void allreduce_scatter_gather(Workspace& w, const Call& c, char* data, size_t count, size_t esize, ReduceFn fn) {
  Transport& t = w.transport;
  const int n = t.size(), me = t.rank();
  const std::vector<size_t> off = block_offsets(count, n, esize);
  const size_t mine = off[me + 1] - off[me];
  w.scratch.resize(mine * n);
  char* slots = w.scratch.data();
  std::memcpy(slots + me * mine, data + off[me], mine);
  std::vector<SendOp> sends;
  std::vector<RecvOp> recvs;
  for (int q = 0; q < n; ++q) {
    if (q == me) continue;
    sends.push_back(t.send(q, c, off[q], off[q + 1] - off[q], data + off[q]));
    recvs.push_back(t.recv(q, off[me], mine, slots + q * mine));
  }
  t.transfer(c, sends, recvs);
  reduce_slots(n, data + off[me], slots, mine, mine / esize, fn);
  direct_allgather(t, c, data, off);
}

}  // namespace erun::tcp
