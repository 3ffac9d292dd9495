// The server side of relaying (docs/protocol.md, "Relaying"): one
// authenticated connection, as an agent opens it, carries several workers as
// streams. Real sockets against a real RendezvousServer; the agent is played
// by hand with raw RELAY frames.
#include <gtest/gtest.h>

#include <future>
#include <map>
#include <set>
#include <optional>
#include <random>

#include "rendezvous_test_util.h"

namespace erun::testing {
namespace {

using namespace std::chrono_literals;
using wire::Type;

const uint64_t kJobHash = handshake::job_hash(kJob);

// What the agent side of a relay connection receives: a frame for a stream,
// or (closed) the server's RELAY_CLOSED for it.
struct Relayed {
  uint32_t stream = 0;
  bool closed = false;
  wire::Header header;
  std::string payload;
};

// One relay connection, authenticated like any client, then speaking RELAY.
class RelayPeer {
 public:
  explicit RelayPeer(int port) : fd_(raw_connect(port)) { ok_ = raw_authenticate(fd_); }
  ~RelayPeer() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool authenticated() const { return ok_; }
  int fd() const { return fd_; }
  void close_now() {
    ::close(fd_);
    fd_ = -1;
  }

  static std::string frame(uint32_t stream, Type type, int64_t gen, uint32_t req, const std::string& payload) {
    return wire::encode_relay(kJobHash, stream, wire::encode_frame(type, kJobHash, gen, req, payload));
  }
  static std::string join(uint32_t stream, const std::string& host, int index, int64_t gen = -1) {
    JoinRequest r = join_request(host, index);
    r.pid = 1000 + static_cast<int64_t>(stream);  // one process per stream
    return frame(stream, Type::kJoin, gen, 7, wire::encode_join(r));
  }
  void send(const std::string& bytes) { raw_send(fd_, bytes); }

  // The next frame the server relays, or nullopt when the connection closed
  // or nothing came within the timeout.
  std::optional<Relayed> next(Duration timeout = 10s) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    auto f = wire::recv_frame(fd_, kJobHash, 1 << 20, deadline);
    if (!f) return std::nullopt;
    Relayed r;
    if (f->header.type == static_cast<uint16_t>(Type::kRelayClosed)) {
      auto id = wire::decode_relay_closed(f->payload);
      if (!id) return std::nullopt;
      r.stream = *id;
      r.closed = true;
      return r;
    }
    if (f->header.type != static_cast<uint16_t>(Type::kRelay)) {
      r.header = f->header;  // e.g. the ERROR of a refusal, on the relay connection itself
      r.payload = f->payload;
      return r;
    }
    wire::RelayedFrame inner;
    if (wire::decode_relay(f->payload, kJobHash, 1 << 20, &inner)) return std::nullopt;
    r.stream = inner.stream;
    r.header = inner.header;
    r.payload = std::string(inner.payload);
    return r;
  }

 private:
  int fd_;
  bool ok_ = false;
};

// Streams 1..n join slots relay-host:0..n-1 in one write.
void join_all(RelayPeer& peer, int n) {
  std::string burst;
  for (int i = 0; i < n; ++i) burst += RelayPeer::join(static_cast<uint32_t>(i + 1), "relay-host", i);
  peer.send(burst);
}

std::vector<RankAssignment> ranks_of(int n) {
  std::vector<RankAssignment> r;
  for (int i = 0; i < n; ++i) r.push_back(rank_of("relay-host", i, i, n));
  return r;
}

// Reads one assignment per stream: stream -> rank.
std::map<uint32_t, int> assignments(RelayPeer& peer, int n, int64_t gen) {
  std::map<uint32_t, int> got;
  while (static_cast<int>(got.size()) < n) {
    auto r = peer.next();
    if (!r) break;
    EXPECT_FALSE(r->closed) << "stream " << r->stream;
    EXPECT_EQ(r->header.type, static_cast<uint16_t>(Type::kAssignment));
    EXPECT_EQ(r->header.request_id, 7u);
    int64_t g = -1;
    auto a = wire::decode_assignment(r->payload, &g);
    if (!a) break;
    EXPECT_EQ(g, gen);
    got[r->stream] = a->rank;
  }
  return got;
}

// Streams 1..n join and are assigned ranks 0..n-1 of generation 1.
void form_generation(RendezvousServer& server, RelayPeer& peer, int n) {
  join_all(peer, n);
  ASSERT_TRUE(wait_for([&] { return static_cast<int>(server.waiting().size()) == n; }));
  server.publish(1, ranks_of(n));
  ASSERT_EQ(static_cast<int>(assignments(peer, n, 1).size()), n);
}

TEST(RendezvousRelay, OneConnectionCarriesEightWorkersThroughJoinAndAssignment) {
  auto server = start_server();
  RelayPeer peer(server->port());
  ASSERT_TRUE(peer.authenticated());
  join_all(peer, 8);
  ASSERT_TRUE(wait_for([&] { return server->waiting().size() == 8; }));
  EXPECT_EQ(server->relay_connections(), 1);
  auto waiting = server->waiting();
  EXPECT_EQ(waiting.front().slot.host, "relay-host");
  EXPECT_EQ(waiting.back().slot.local_index, 7);
  EXPECT_EQ(waiting[3].pid, 1004);
  server->publish(1, ranks_of(8));
  auto got = assignments(peer, 8, 1);
  ASSERT_EQ(got.size(), 8u);
  for (auto& [stream, rank] : got) EXPECT_EQ(rank, static_cast<int>(stream) - 1);
  EXPECT_EQ(server->members().size(), 8u);
}

TEST(RendezvousRelay, AStreamClosedByTheAgentIsOneDisconnectedWorker) {
  auto server = start_server();
  RelayPeer peer(server->port());
  ASSERT_TRUE(peer.authenticated());
  ASSERT_NO_FATAL_FAILURE(form_generation(*server, peer, 4));
  server->snapshot();  // drain the events so far
  peer.send(wire::encode_relay_closed(kJobHash, 3));
  std::vector<SlotKey> gone;
  ASSERT_TRUE(wait_for([&] {
    auto s = server->snapshot();
    gone.insert(gone.end(), s.disconnected.begin(), s.disconnected.end());
    return !gone.empty();
  }));
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(gone[0].local_index, 2);
  EXPECT_EQ(server->members().size(), 3u);
  EXPECT_EQ(server->relay_connections(), 1);
  // A frame for the closed stream (crossing the close on the wire) is
  // dropped, not a new worker.
  peer.send(RelayPeer::join(3, "relay-host", 2, 1));
  peer.send(RelayPeer::frame(2, Type::kKvCheck, 1, 9, wire::encode_kv_check({"k"})));
  auto r = peer.next();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->stream, 2u);
  EXPECT_EQ(r->header.type, static_cast<uint16_t>(Type::kKvCheckResult));
  EXPECT_EQ(server->members().size(), 3u);
  EXPECT_EQ(server->waiting().size(), 0u);
}

TEST(RendezvousRelay, ClosingTheRelayConnectionDisconnectsEveryWorkerOnIt) {
  auto server = start_server();
  RelayPeer peer(server->port());
  ASSERT_TRUE(peer.authenticated());
  ASSERT_NO_FATAL_FAILURE(form_generation(*server, peer, 8));
  server->snapshot();
  peer.close_now();
  std::set<int> gone;
  ASSERT_TRUE(wait_for([&] {
    for (auto& s : server->snapshot().disconnected) gone.insert(s.local_index);
    return gone.size() == 8;
  }));
  EXPECT_EQ(server->members().size(), 0u);
  EXPECT_EQ(server->relay_connections(), 0);
  EXPECT_EQ(server->refused(), 0);
}

TEST(RendezvousRelay, PushesReachTheStreamsAndALostRankStreamIsClosed) {
  auto server = start_server();
  RelayPeer peer(server->port());
  ASSERT_TRUE(peer.authenticated());
  ASSERT_NO_FATAL_FAILURE(form_generation(*server, peer, 4));

  server->notify_hosts_updated(1);
  std::set<uint32_t> told;
  for (int i = 0; i < 4; ++i) {
    auto r = peer.next();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->header.type, static_cast<uint16_t>(Type::kHostsUpdated));
    EXPECT_EQ(r->header.generation, 1);
    told.insert(r->stream);
  }
  EXPECT_EQ(told, (std::set<uint32_t>{1, 2, 3, 4}));

  server->notify_peers_lost(1, {2});  // rank 2 is stream 3
  std::set<uint32_t> lost_told;
  bool stream3_closed = false;
  for (int i = 0; i < 4; ++i) {
    auto r = peer.next();
    ASSERT_TRUE(r);
    if (r->closed) {
      EXPECT_EQ(r->stream, 3u);
      stream3_closed = true;
      continue;
    }
    EXPECT_EQ(r->header.type, static_cast<uint16_t>(Type::kPeersLost));
    auto ranks = wire::decode_peers_lost(r->payload);
    ASSERT_TRUE(ranks);
    EXPECT_EQ(*ranks, std::vector<int>{2});
    lost_told.insert(r->stream);
  }
  EXPECT_TRUE(stream3_closed);
  EXPECT_EQ(lost_told, (std::set<uint32_t>{1, 2, 4}));
  EXPECT_EQ(server->members().size(), 3u);
}

TEST(RendezvousRelay, StoreCallsTravelOnTheirStreams) {
  auto server = start_server();
  RelayPeer peer(server->port());
  ASSERT_TRUE(peer.authenticated());
  ASSERT_NO_FATAL_FAILURE(form_generation(*server, peer, 2));
  // Stream 2 waits for a key that stream 1 sets afterwards.
  peer.send(RelayPeer::frame(2, Type::kKvGet, 1, 21, wire::encode_kv_get("addr", 10000)));
  peer.send(RelayPeer::frame(1, Type::kKvSet, 1, 11, wire::encode_kv_set("addr", "10.0.0.1:5")));
  std::map<uint32_t, Relayed> got;
  for (int i = 0; i < 2; ++i) {
    auto r = peer.next();
    ASSERT_TRUE(r);
    got[r->stream] = *r;
  }
  EXPECT_EQ(got[1].header.type, static_cast<uint16_t>(Type::kKvSetOk));
  EXPECT_EQ(got[1].header.request_id, 11u);
  EXPECT_EQ(got[2].header.type, static_cast<uint16_t>(Type::kKvValue));
  EXPECT_EQ(got[2].header.request_id, 21u);
  EXPECT_EQ(wire::decode_str(got[2].payload), std::optional<std::string>("10.0.0.1:5"));
}

TEST(RendezvousRelay, ABadMessageOnOneStreamClosesThatStreamOnly) {
  auto server = start_server();
  RelayPeer peer(server->port());
  ASSERT_TRUE(peer.authenticated());
  join_all(peer, 2);
  ASSERT_TRUE(wait_for([&] { return server->waiting().size() == 2; }));
  // A HELLO inside an (already authenticated) stream is out of order.
  peer.send(RelayPeer::frame(2, Type::kHello, -1, 0, handshake::random_bytes(wire::kNonceBytes)));
  auto err = peer.next();
  ASSERT_TRUE(err);
  EXPECT_EQ(err->stream, 2u);
  EXPECT_EQ(err->header.type, static_cast<uint16_t>(Type::kError));
  EXPECT_NE(wire::decode_str(err->payload)->find("unexpected HELLO"), std::string::npos);
  auto closed = peer.next();
  ASSERT_TRUE(closed);
  EXPECT_TRUE(closed->closed);
  EXPECT_EQ(closed->stream, 2u);
  ASSERT_TRUE(wait_for([&] { return server->waiting().size() == 1; }));
  server->publish(1, ranks_of(2));
  auto got = assignments(peer, 1, 1);
  EXPECT_EQ(got, (std::map<uint32_t, int>{{1, 0}}));
  EXPECT_EQ(server->relay_connections(), 1);
}

// Each malformed relay frame closes the whole relay connection (its peer is
// an agent that knows the secret but speaks the protocol wrong), is counted,
// and leaves the server serving.
TEST(RendezvousRelay, MalformedRelayFramesCloseTheRelayConnection) {
  auto server = start_server();
  std::string inner_join = wire::encode_frame(Type::kJoin, kJobHash, -1, 1, wire::encode_join(join_request("h", 0)));
  std::string bad_magic = inner_join;
  bad_magic[0] = 'X';
  std::string other_job = wire::encode_frame(Type::kJoin, handshake::job_hash("other"), -1, 1, "");
  auto relay_with = [](const std::string& payload) {
    return wire::encode_frame(Type::kRelay, kJobHash, -1, 0, payload);
  };
  std::vector<std::pair<std::string, std::string>> cases = {
      {"short", relay_with("abc")},
      {"bad inner magic", wire::encode_relay(kJobHash, 1, bad_magic)},
      {"inner of another job", wire::encode_relay(kJobHash, 1, other_job)},
      {"inner length past the payload", wire::encode_relay(kJobHash, 1, inner_join.substr(0, inner_join.size() - 1))},
      {"bytes after the inner frame", wire::encode_relay(kJobHash, 1, inner_join + "x")},
      {"RELAY_CLOSED of 3 bytes", wire::encode_frame(Type::kRelayClosed, kJobHash, -1, 0, "abc")},
      {"JOIN on a relay connection",
       wire::encode_relay(kJobHash, 1, inner_join) + wire::encode_frame(Type::kJoin, kJobHash, -1, 2,
                                                                         wire::encode_join(join_request("h", 1)))},
  };
  long refused = 0;
  for (auto& [name, bytes] : cases) {
    RelayPeer peer(server->port());
    ASSERT_TRUE(peer.authenticated()) << name;
    peer.send(bytes);
    EXPECT_TRUE(closed_by_peer(peer.fd())) << name;
    EXPECT_TRUE(wait_for([&] { return server->refused() == refused + 1; })) << name;
    refused = server->refused();
    EXPECT_TRUE(wait_for([&] { return server->relay_connections() == 0 && server->waiting().empty(); })) << name;
  }
  // A worker's own connection may not turn into a relay one after it joined.
  {
    int fd = raw_connect(server->port());
    ASSERT_TRUE(raw_authenticate(fd));
    raw_send(fd, wire::encode_frame(Type::kJoin, kJobHash, -1, 1, wire::encode_join(join_request("direct", 0))) +
                     wire::encode_relay(kJobHash, 1, inner_join));
    EXPECT_TRUE(closed_by_peer(fd));
    ::close(fd);
  }
  EXPECT_TRUE(wait_for([&] { return server->refused() == refused + 1; }));
  RendezvousClient c(client_options(server->port()));
  ASSERT_TRUE(c.connect().is_ok());
  auto fut = std::async(std::launch::async, [&] {
    long g = -1;
    return c.join(join_request("good", 0), &g).is_ok() ? g : -100;
  });
  ASSERT_TRUE(wait_for([&] { return server->waiting().size() == 1; }));
  server->publish(3, {rank_of("good", 0, 0, 1)});
  EXPECT_EQ(fut.get(), 3);
}

TEST(RendezvousRelay, RelayFramesBeforeAuthenticationAreRefused) {
  auto server = start_server();
  int fd = raw_connect(server->port());
  raw_send(fd, RelayPeer::join(1, "h", 0));
  EXPECT_TRUE(closed_by_peer(fd));
  ::close(fd);
  EXPECT_EQ(server->refused(), 1);
  EXPECT_EQ(server->relay_connections(), 0);
  EXPECT_TRUE(server->waiting().empty());
}

TEST(RendezvousRelay, StreamsBeyondTheLimitCloseTheRelayConnection) {
  auto server = start_server();
  RelayPeer peer(server->port());
  ASSERT_TRUE(peer.authenticated());
  // Streams that each only check a key (no JOIN): they stay open.
  std::string burst;
  for (uint32_t s = 1; s <= wire::kMaxRelayStreams; ++s) {
    burst += RelayPeer::frame(s, Type::kKvCheck, -1, s, wire::encode_kv_check({}));
  }
  // The server answers as it reads: read its replies while sending.
  auto reader = std::async(std::launch::async, [&] {
    size_t replies = 0;
    while (replies < wire::kMaxRelayStreams) {
      auto r = peer.next(20s);
      if (!r || r->header.type != static_cast<uint16_t>(Type::kKvCheckResult)) break;
      ++replies;
    }
    return replies;
  });
  peer.send(burst);
  ASSERT_EQ(reader.get(), wire::kMaxRelayStreams);
  EXPECT_EQ(server->refused(), 0);
  peer.send(RelayPeer::frame(wire::kMaxRelayStreams + 1, Type::kKvCheck, -1, 1, wire::encode_kv_check({})));
  EXPECT_TRUE(closed_by_peer(peer.fd()));
  EXPECT_TRUE(wait_for([&] { return server->refused() == 1 && server->relay_connections() == 0; }));
}

// The server keeps its waiting and member lists by patching them with the
// slots that changed; joins and closes in random slot order, checked against
// a model after each batch.
TEST(RendezvousRelay, SnapshotListsStayInSlotOrderThroughRandomJoinsAndCloses) {
  auto server = start_server();
  RelayPeer peer(server->port());
  ASSERT_TRUE(peer.authenticated());
  std::mt19937 rng(12);
  std::map<uint32_t, SlotKey> open;  // stream -> slot, waiting
  std::set<SlotKey> used;
  uint32_t next_stream = 1;
  for (int round = 0; round < 40; ++round) {
    std::string burst;
    int joins = static_cast<int>(rng() % 12), closes = static_cast<int>(rng() % 6);
    for (int i = 0; i < joins; ++i) {
      SlotKey slot{"h" + std::to_string(rng() % 50), static_cast<int>(rng() % 8)};
      if (!used.insert(slot).second) continue;  // one connection per slot: no take-overs here
      burst += RelayPeer::join(next_stream, slot.host, slot.local_index);
      open[next_stream++] = slot;
    }
    for (int i = 0; i < closes && !open.empty(); ++i) {
      auto it = std::next(open.begin(), static_cast<long>(rng() % open.size()));
      burst += wire::encode_relay_closed(kJobHash, it->first);
      used.erase(it->second);
      open.erase(it);
    }
    if (!burst.empty()) peer.send(burst);
    std::vector<SlotKey> want;
    for (auto& [stream, slot] : open) want.push_back(slot);
    std::sort(want.begin(), want.end());
    std::vector<SlotKey> got;
    ASSERT_TRUE(wait_for([&] {
      got.clear();
      for (auto& j : server->snapshot().waiting) got.push_back(j.slot);
      return got == want;
    })) << "round " << round << ": " << got.size() << " listed, " << want.size() << " expected";
  }
}

}  // namespace
}  // namespace erun::testing
