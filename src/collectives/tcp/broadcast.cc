#include "collectives/tcp/algorithms.h"

namespace erun::tcp {

void broadcast_direct(Transport& t, const Call& c, char* data, size_t bytes, int root) {
  std::vector<SendOp> sends;
  std::vector<RecvOp> recvs;
  if (t.rank() == root) {
    for (int q = 0; q < t.size(); ++q) {
      if (q != root) sends.push_back(t.send(q, c, 0, bytes, data));
    }
  } else {
    recvs.push_back(t.recv(root, 0, bytes, data));
  }
  t.transfer(c, sends, recvs);
}

void broadcast_scatter_allgather(Transport& t, const Call& c, char* data, size_t bytes, int root) {
  const std::vector<size_t> off = block_offsets(bytes, t.size());
  const int me = t.rank();
  std::vector<SendOp> sends;
  std::vector<RecvOp> recvs;
  if (me == root) {
    for (int q = 0; q < t.size(); ++q) {
      if (q != root) sends.push_back(t.send(q, c, off[q], off[q + 1] - off[q], data + off[q]));
    }
  } else {
    recvs.push_back(t.recv(root, off[me], off[me + 1] - off[me], data + off[me]));
  }
  t.transfer(c, sends, recvs);
  ring_allgather(t, c, data, off, me);
}

void barrier_dissemination(Transport& t, const Call& c) {
  uint64_t round = 0;
  for (int dist = 1; dist < t.size(); dist *= 2, ++round) {
    std::vector<SendOp> sends{t.send((t.rank() + dist) % t.size(), c, round, 0, nullptr)};
    std::vector<RecvOp> recvs{t.recv((t.rank() - dist + t.size()) % t.size(), round, 0, nullptr)};
    t.transfer(c, sends, recvs);
  }
}

}  // namespace erun::tcp
