// One pair of a TcpCommunicator: the handshake that authenticates it and the
// header of its data frames; the descriptors belong to the mesh. Wire format:
// docs/protocol.md, "Worker-to-worker pairs"; the code map: docs/design.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/fd.h"
#include "common/handshake.h"
#include "common/net.h"

namespace erun::tcp {

// ---- data frames ------------------------------------------------------------

enum class Op : uint8_t {
  kAllreduce = 1,
  kBroadcast = 2,
  kAllgather = 3,
  kAllgathervSizes = 4,
  kAllgatherv = 5,
  kBarrier = 6,
  kReduceScatter = 7
};

const char* op_name(uint8_t op);
inline const char* op_name(Op op) { return op_name(static_cast<uint8_t>(op)); }

// What a collective call is, as both ends must agree on it.
struct Call {
  Op op = Op::kBarrier;
  uint8_t dtype = 0;
  uint8_t reduce = 0;
  uint64_t count = 0;  // elements for allreduce and reduce_scatter (in all), bytes otherwise
  int32_t root = 0;    // broadcast: the root; reduce_scatter: split_fingerprint(counts)
};

// A reduce_scatter's split as the frames carry it: FNV-1a of the counts,
// 31 bits, so that ranks that split the same total differently disagree on
// the call, not on the algorithm.
int32_t split_fingerprint(const std::vector<size_t>& counts);

struct FrameHeader {
  uint32_t magic;
  uint8_t version, op, dtype, reduce;
  uint32_t generation;
  int32_t from;
  uint64_t seq;
  uint64_t count;
  uint64_t offset;
  uint64_t length;
  int32_t root;
  uint32_t check;  // FNV-1a of the bytes before it
};
static_assert(sizeof(FrameHeader) == 56, "FrameHeader must have no padding");

// The header of [offset, +length) of `c`, collective #seq, sent by rank `from`.
FrameHeader frame_header(const Call& c, long generation, int from, uint64_t seq, uint64_t offset, uint64_t length);
// Magic, version and check are right: the rest of the header can be believed.
bool intact(const FrameHeader& h);

std::string describe(const Call& c);
std::string describe(const FrameHeader& h);

// ---- the handshake ----------------------------------------------------------

// What a pair's handshake binds and proves: this rank of this job and
// generation, under the job secret.
struct PairBinding {
  std::shared_ptr<const handshake::Key> key;
  std::string job_id;
  long generation = 0;
  int rank = 0;
  int size = 1;
  std::string who;  // this rank, for messages

  // Both proofs of the pair (connector, acceptor).
  handshake::Proofs proofs(int connector, int acceptor) const;
};

// The first address of host:port; throws CommError when it does not resolve.
net::Address resolve_address(const std::string& host, const std::string& port);

// Throws the CommError for a connect, send or receive of a handshake that did
// not complete (`what`: what this rank was doing).
void check_outcome(const net::Outcome& o, const std::string& who, const std::string& what);

// The connector's side: connects to rank `q` at the "host:port" it published,
// and both prove the job secret. Throws CommError.
Fd connect_pair(const PairBinding& b, int q, const std::string& addr, TimePoint deadline,
                const net::Interrupt& interrupt);

// The acceptor's side: a connection to the pair port, from accept() until it
// authenticates as a peer or is refused.
struct PendingPair {
  PendingPair(Fd f, std::string from_address, TimePoint handshake_deadline);

  enum class Progress { kWaiting, kPeer, kRefused };
  // Reads what the connection sent and answers it. kPeer: rank `from`
  // authenticated, and `fd` is its pair; kRefused: `*why` says why (the
  // caller drops it). `connected`: the pairs by rank formed so far.
  Progress advance(const PairBinding& b, const std::vector<Fd>& connected, std::string* why);

  Fd fd;
  std::string peer;  // its address
  TimePoint deadline;
  std::string in;
  size_t want;
  int from = -1;  // the rank its hello claimed
  handshake::Responder hs;
};

}  // namespace erun::tcp
