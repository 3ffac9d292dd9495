#include <cstring>

#include "collectives/tcp/algorithms.h"

namespace erun::tcp {

std::vector<size_t> block_offsets(size_t total, int n, size_t unit) {
  std::vector<size_t> off(static_cast<size_t>(n) + 1);
  for (int i = 0; i <= n; ++i) off[static_cast<size_t>(i)] = total * static_cast<size_t>(i) / static_cast<size_t>(n) * unit;
  return off;
}

std::vector<size_t> equal_blocks(int n, size_t bytes) {
  std::vector<size_t> off(static_cast<size_t>(n) + 1);
  for (int i = 0; i <= n; ++i) off[static_cast<size_t>(i)] = static_cast<size_t>(i) * bytes;
  return off;
}

void reduce_slots(int n, char* out, const char* slots, size_t bytes, size_t count, ReduceFn fn) {
  fn(out, slots, slots + bytes, count);
  for (int q = 2; q < n; ++q) fn(out, out, slots + q * bytes, count);
}

// Reduces the inputs in rank order, so every rank computes the same bits.
void allreduce_direct(Workspace& w, const Call& c, char* data, size_t count, size_t esize, ReduceFn fn) {
  Transport& t = w.transport;
  const size_t bytes = count * esize;
  w.scratch.resize(bytes * t.size());
  char* slots = w.scratch.data();
  if (bytes) std::memcpy(slots + t.rank() * bytes, data, bytes);
  std::vector<SendOp> sends;
  std::vector<RecvOp> recvs;
  for (int q = 0; q < t.size(); ++q) {
    if (q == t.rank()) continue;
    sends.push_back(t.send(q, c, 0, bytes, data));
    recvs.push_back(t.recv(q, 0, bytes, slots + q * bytes));
  }
  t.transfer(c, sends, recvs);
  reduce_slots(t.size(), data, slots, bytes, count, fn);
}

}  // namespace erun::tcp
