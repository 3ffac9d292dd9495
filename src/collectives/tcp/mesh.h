// Forming a TcpCommunicator's mesh, a pair (pair.h) between every two ranks;
// collective. docs/protocol.md, "Forming the mesh"; docs/design.md.
#pragma once

#include <string>
#include <vector>

#include "collectives/tcp/tcp_communicator.h"
#include "common/fd.h"
#include "common/net.h"
#include "store/kv_store.h"

namespace erun::tcp {

// Listens on o.address (never the wildcard), publishes address:port under
// "addr/<rank>" in `store`, connects to the lower ranks and accepts the higher
// ones, refusing (and logging) any connection that fails the handshake. Returns
// the pairs by rank (none for this rank) once every one has authenticated.
// Bounded by o.connect_timeout (else o.timeout); `interrupt` (the abort eventfd
// and flag, o.cancelled) ends it early. Throws CommError, and
// std::invalid_argument without a secret or for the wildcard address.
std::vector<Fd> form_mesh(KvStore& store, const TcpOptions& o, const std::string& who, const net::Interrupt& interrupt);

}  // namespace erun::tcp
