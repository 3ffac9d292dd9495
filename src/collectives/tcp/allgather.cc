#include "collectives/tcp/algorithms.h"

namespace erun::tcp {
namespace {

// Up to this many bytes in all, one direct exchange (one round trip) beats a ring.
constexpr size_t kDirectGatherBytes = 256 << 10;

}  // namespace

void direct_allgather(Transport& t, const Call& c, char* base, const std::vector<size_t>& off) {
  std::vector<SendOp> sends;
  std::vector<RecvOp> recvs;
  const int me = t.rank();
  for (int q = 0; q < t.size(); ++q) {
    if (q == me) continue;
    sends.push_back(t.send(q, c, off[me], off[me + 1] - off[me], base + off[me]));
    recvs.push_back(t.recv(q, off[q], off[q + 1] - off[q], base + off[q]));
  }
  t.transfer(c, sends, recvs);
}

void ring_allgather(Transport& t, const Call& c, char* base, const std::vector<size_t>& off, int own) {
  const int n = t.size();
  const int right = (t.rank() + 1) % n, left = (t.rank() - 1 + n) % n;
  for (int s = 0; s < n - 1; ++s) {
    const int send_block = (own - s + n) % n;
    const int recv_block = (own - s - 1 + 2 * n) % n;
    std::vector<SendOp> sends{t.send(right, c, off[send_block], off[send_block + 1] - off[send_block], base + off[send_block])};
    std::vector<RecvOp> recvs{t.recv(left, off[recv_block], off[recv_block + 1] - off[recv_block], base + off[recv_block])};
    t.transfer(c, sends, recvs);
  }
}

void allgather_blocks(Transport& t, const Call& c, char* base, const std::vector<size_t>& off) {
  if (off[t.size()] <= kDirectGatherBytes) return direct_allgather(t, c, base, off);
  ring_allgather(t, c, base, off, t.rank());
}

}  // namespace erun::tcp
