// A recording Outbox for the rendezvous services' unit tests: what the
// membership logic or the key-value service sent, to whom, and which
// connections it closed; a connection's peer can be marked closed.
#pragma once

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "rendezvous/outbox.h"
#include "rendezvous/wire.h"

namespace erun::testing {

struct Sent {
  ConnId conn = 0;
  wire::Type type{};
  int64_t generation = -1;
  uint32_t request_id = 0;
  std::string payload;
};

class RecordingOutbox final : public Outbox {
 public:
  void send(ConnId conn, wire::Type type, int64_t generation, uint32_t request_id,
            std::string_view payload) override {
    sent.push_back(Sent{conn, type, generation, request_id, std::string(payload)});
  }
  void close(ConnId conn, const std::string& reason) override { closes.emplace_back(conn, reason); }
  bool peer_closed(ConnId conn) override { return dead.count(conn) > 0; }

  // What was sent since the last call.
  std::vector<Sent> take() { return std::exchange(sent, {}); }

  std::vector<Sent> sent;
  std::vector<std::pair<ConnId, std::string>> closes;
  std::set<ConnId> dead;  // peers that closed their end
};

// The message of an ERROR frame.
inline std::string error_text(const Sent& s) {
  EXPECT_EQ(s.type, wire::Type::kError);
  return wire::decode_str(s.payload).value_or("<malformed ERROR payload>");
}

// The connections the frames went to, in order.
inline std::vector<ConnId> conns_of(const std::vector<Sent>& sent) {
  std::vector<ConnId> v;
  for (auto& s : sent) v.push_back(s.conn);
  return v;
}

}  // namespace erun::testing
