// One pair of a TcpCommunicator: the handshake that authenticates it; the
// descriptors belong to the mesh. Wire format:
// docs/protocol.md, "Worker-to-worker pairs"; the code map: docs/design.md.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/fd.h"
#include "common/handshake.h"
#include "common/net.h"

namespace erun::tcp {

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
