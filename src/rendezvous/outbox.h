// Outbox: what the rendezvous server's services (ServerMembership,
// KvService) send their frames through, and how they close a connection.
// The server's connection layer (ServerLoop) implements it over its sockets;
// the services' unit tests record what goes out. Callers hold the server's
// mutex; a frame for a connection that is closing or gone is dropped.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/log.h"
#include "rendezvous/wire.h"

namespace erun {

// One of the server's connections: a worker's own socket or a stream of an
// agent's relay connection. Ids are never reused.
using ConnId = uint64_t;

// A request as the services see it: the connection it came on, the id its
// reply echoes, and the generation its header names.
struct Request {
  ConnId conn = 0;
  uint32_t request_id = 0;
  int64_t generation = -1;
};

class Outbox {
 public:
  virtual ~Outbox() = default;
  // Queues one frame for `conn`.
  virtual void send(ConnId conn, wire::Type type, int64_t generation, uint32_t request_id,
                    std::string_view payload) = 0;
  // Closes `conn` quietly: no ERROR, not counted as refused.
  virtual void close(ConnId conn, const std::string& reason) = 0;
  // True when the peer of `conn` has closed its end already (a direct
  // connection is looked at without reading; a relayed one is open until its
  // agent says otherwise).
  virtual bool peer_closed(ConnId conn) = 0;
};

// "rendezvous (gen 3)", the start of the server's log lines ("rendezvous"
// before the first generation).
inline std::string log_prefix(int64_t generation) {
  return generation >= 0 ? fmt::format("rendezvous ({})", who(generation)) : "rendezvous";
}

}  // namespace erun
