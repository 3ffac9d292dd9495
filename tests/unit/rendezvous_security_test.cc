// Bad input to the rendezvous server: each case is dropped, counted and
// logged, and the server keeps serving well-behaved clients. Real sockets.
#include <fcntl.h>
#include <gtest/gtest.h>

#include <future>

#include "common/net.h"
#include "rendezvous_test_util.h"

namespace erun::testing {
namespace {

using namespace std::chrono_literals;

// A good client still connects, joins and is assigned after the bad input.
void expect_server_still_serves(RendezvousServer& server, long gen) {
  RendezvousClient c(client_options(server.port()));
  ASSERT_TRUE(c.connect().is_ok());
  auto fut = std::async(std::launch::async, [&] {
    long g = -1;
    auto r = c.join(join_request("good", 0), &g);
    return r.is_ok() ? g : -100;
  });
  ASSERT_TRUE(wait_for([&] { return server.waiting().size() == 1; }));
  server.publish(gen, {rank_of("good", 0, 0, 1)});
  EXPECT_EQ(fut.get(), gen);
}

TEST(RendezvousWire, HeaderRoundTripsLittleEndian) {
  wire::Header h;
  h.type = 9;
  h.job_hash = 0x0102030405060708ull;
  h.generation = -2;
  h.request_id = 77;
  h.length = 0x10203;
  char b[wire::kHeaderBytes];
  wire::encode_header(h, b);
  EXPECT_EQ(static_cast<unsigned char>(b[0]), 0x45);  // 'E'
  EXPECT_EQ(std::string(b, 4), "ERUN");
  EXPECT_EQ(static_cast<unsigned char>(b[8]), 0x08);
  EXPECT_EQ(static_cast<unsigned char>(b[28]), 0x03);
  auto d = wire::decode_header(b);
  EXPECT_EQ(d.magic, wire::kMagic);
  EXPECT_EQ(d.type, 9);
  EXPECT_EQ(d.job_hash, h.job_hash);
  EXPECT_EQ(d.generation, -2);
  EXPECT_EQ(d.request_id, 77u);
  EXPECT_EQ(d.length, 0x10203u);
}

TEST(RendezvousWire, CheckHeaderNamesTheProblem) {
  uint64_t jh = handshake::job_hash("a");
  wire::Header h;
  h.job_hash = jh;
  EXPECT_FALSE(wire::check_header(h, jh, 10));
  h.length = 11;
  EXPECT_NE(wire::check_header(h, jh, 10)->find("over the limit"), std::string::npos);
  h.length = 0;
  EXPECT_NE(wire::check_header(h, handshake::job_hash("b"), 10)->find("job id"), std::string::npos);
  h.version = 7;
  EXPECT_NE(wire::check_header(h, jh, 10)->find("version 7"), std::string::npos);
  h.magic = 1;
  EXPECT_NE(wire::check_header(h, jh, 10)->find("magic"), std::string::npos);
}

TEST(RendezvousWire, PayloadReaderRejectsTruncationAndLeftovers) {
  PayloadWriter w;
  w.bytes("host").i32(-3).u64(9);
  PayloadReader ok(w.str());
  EXPECT_EQ(ok.bytes(), "host");
  EXPECT_EQ(ok.i32(), -3);
  EXPECT_EQ(ok.u64(), 9u);
  EXPECT_TRUE(ok.done());
  PayloadReader cut(std::string_view(w.str()).substr(0, 6));
  cut.bytes();
  EXPECT_TRUE(cut.failed());
  std::string huge_len("\xff\xff\xff\x7f", 4);
  PayloadReader lie(huge_len);
  lie.bytes();
  EXPECT_TRUE(lie.failed());
  std::string longer = w.str() + "x";
  PayloadReader extra(longer);
  extra.bytes(), extra.i32(), extra.u64();
  EXPECT_FALSE(extra.done());
}

TEST(RendezvousWire, PeersLostRoundTripsAndRejectsMalformedLists) {
  auto p = wire::encode_peers_lost({0, 3, 7});
  EXPECT_EQ(wire::decode_peers_lost(p), (std::vector<int>{0, 3, 7}));
  EXPECT_FALSE(wire::decode_peers_lost(wire::encode_peers_lost({})));     // nobody lost
  EXPECT_FALSE(wire::decode_peers_lost(wire::encode_peers_lost({2, -1})));  // not a rank
  EXPECT_FALSE(wire::decode_peers_lost(p.substr(0, p.size() - 1)));       // short
  EXPECT_FALSE(wire::decode_peers_lost(p + "x"));                         // bytes left over
  EXPECT_FALSE(wire::decode_peers_lost(PayloadWriter().u32(1u << 30).i32(1).str()));  // count past the end
  EXPECT_STREQ(wire::type_name(static_cast<uint16_t>(wire::Type::kPeersLost)), "PEERS_LOST");
}

TEST(RendezvousWire, ProofsDependOnEveryInputAndDiffer) {
  std::string a = wire::client_proof("k", "n1", "job", "n2");
  EXPECT_EQ(a.size(), wire::kMacBytes);
  EXPECT_EQ(a, wire::client_proof("k", "n1", "job", "n2"));
  EXPECT_NE(a, wire::client_proof("K", "n1", "job", "n2"));
  EXPECT_NE(a, wire::client_proof("k", "n1", "jab", "n2"));
  EXPECT_NE(a, wire::client_proof("k", "n1", "job", "n3"));
  EXPECT_NE(a, wire::server_proof("k", "n1", "job", "n2"));  // no reflection
  EXPECT_TRUE(handshake::equal_ct(a, a));
  EXPECT_FALSE(handshake::equal_ct(a, a.substr(1)));
}

TEST(RendezvousWire, ProofsEqualTheDocumentedHmacForShortAndLongSecrets) {
  // A secret longer than SHA-256's 64-byte block is hashed first (RFC 2104).
  const std::string job = PayloadWriter().bytes("job-7").str();  // str(job_id)
  for (std::string secret : {std::string("k"), std::string(64, 's'), std::string(65, 's'), std::string(200, '\x9c')}) {
    const handshake::Proofs p = wire::proofs(secret, "job-7");
    std::string sn = handshake::random_bytes(wire::kNonceBytes), cn = handshake::random_bytes(wire::kNonceBytes);
    // docs/protocol.md: HMAC(secret, label || the other side's nonce || str(job_id) || own nonce).
    EXPECT_EQ(p.initiator(cn, sn), handshake::hmac_sha256(secret, "erun-client-v1" + sn + job + cn)) << secret.size();
    EXPECT_EQ(p.responder(cn, sn), handshake::hmac_sha256(secret, "erun-server-v1" + cn + job + sn)) << secret.size();
    EXPECT_EQ(p.initiator(cn, sn), wire::client_proof(secret, sn, "job-7", cn)) << secret.size();
    EXPECT_EQ(p.responder(cn, sn), wire::server_proof(secret, cn, "job-7", sn)) << secret.size();
    EXPECT_NE(p.initiator(cn, sn), p.responder(cn, sn));
    EXPECT_NE(p.initiator(cn, sn), wire::client_proof(secret + "x", sn, "job-7", cn));
  }
  // The standard's own vector: HMAC-SHA256 with key "key" (RFC 4231 style check of the primitive).
  EXPECT_EQ(handshake::hmac_sha256("key", "The quick brown fox jumps over the lazy dog").substr(0, 4),
            std::string("\xf7\xbc\x83\xf4", 4));
}

TEST(RendezvousSecurity, AuthenticatesWithTheJobSecret) {
  auto server = start_server();
  RendezvousClient c(client_options(server->port()));
  auto s = c.connect();
  ASSERT_TRUE(s.is_ok()) << s.message();
  EXPECT_TRUE(c.connected());
  EXPECT_EQ(server->refused(), 0);
}

TEST(RendezvousSecurity, WrongSecretIsRefusedAndOthersAreServed) {
  auto server = start_server();
  auto bad = client_options(server->port());
  bad.secret = "guess";
  RendezvousClient c(bad);
  auto s = c.connect();
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("authentication failed"), std::string::npos) << s.message();
  EXPECT_TRUE(wait_for([&] { return server->refused() == 1; }));
  expect_server_still_serves(*server, 1);
}

TEST(RendezvousSecurity, WrongJobIdIsRefused) {
  auto server = start_server();
  auto bad = client_options(server->port());
  bad.job_id = "job-43";
  RendezvousClient c(bad);
  auto s = c.connect();
  ASSERT_FALSE(s.is_ok());
  EXPECT_TRUE(wait_for([&] { return server->refused() == 1; }));
  expect_server_still_serves(*server, 1);
}

TEST(RendezvousSecurity, GarbageBytesAreDropped) {
  auto server = start_server();
  int fd = raw_connect(server->port());
  raw_send(fd, handshake::random_bytes(200));
  EXPECT_TRUE(closed_by_peer(fd));
  ::close(fd);
  EXPECT_EQ(server->refused(), 1);
  expect_server_still_serves(*server, 1);
}

TEST(RendezvousSecurity, WrongVersionIsDropped) {
  auto server = start_server();
  int fd = raw_connect(server->port());
  std::string f = wire::encode_frame(wire::Type::kHello, handshake::job_hash(kJob), -1, 0,
                                     handshake::random_bytes(wire::kNonceBytes));
  f[4] = 2;  // version 2
  raw_send(fd, f);
  EXPECT_TRUE(closed_by_peer(fd));
  ::close(fd);
  EXPECT_EQ(server->refused(), 1);
}

TEST(RendezvousSecurity, OversizedLengthBeforeAuthIsDropped) {
  auto server = start_server();
  int fd = raw_connect(server->port());
  wire::Header h;
  h.type = static_cast<uint16_t>(wire::Type::kHello);
  h.job_hash = handshake::job_hash(kJob);
  h.length = 1u << 30;
  char b[wire::kHeaderBytes];
  wire::encode_header(h, b);
  raw_send(fd, std::string(b, sizeof(b)));
  EXPECT_TRUE(closed_by_peer(fd));
  ::close(fd);
  EXPECT_EQ(server->refused(), 1);
  expect_server_still_serves(*server, 1);
}

TEST(RendezvousSecurity, OversizedLengthAfterAuthIsDropped) {
  auto server = start_server();  // max_frame_bytes = 1 MiB
  int fd = raw_connect(server->port());
  ASSERT_TRUE(raw_authenticate(fd));
  wire::Header h;
  h.type = static_cast<uint16_t>(wire::Type::kKvSet);
  h.job_hash = handshake::job_hash(kJob);
  h.length = (1u << 20) + 1;
  char b[wire::kHeaderBytes];
  wire::encode_header(h, b);
  raw_send(fd, std::string(b, sizeof(b)));
  EXPECT_TRUE(closed_by_peer(fd));
  ::close(fd);
  EXPECT_EQ(server->refused(), 1);
}

TEST(RendezvousSecurity, MalformedPayloadAfterAuthIsDropped) {
  auto server = start_server();
  int fd = raw_connect(server->port());
  ASSERT_TRUE(raw_authenticate(fd));
  // A JOIN whose host string claims more bytes than the frame holds.
  raw_send(fd, wire::encode_frame(wire::Type::kJoin, handshake::job_hash(kJob), -1, 1, std::string("\x50\0\0\0ab", 6)));
  EXPECT_TRUE(closed_by_peer(fd));
  ::close(fd);
  EXPECT_EQ(server->refused(), 1);
  EXPECT_TRUE(server->waiting().empty());
}

TEST(RendezvousSecurity, SkippingTheHandshakeIsDropped) {
  auto server = start_server();
  int fd = raw_connect(server->port());
  PayloadWriter w;
  w.bytes("evil").i32(0).u64(0).i64(1);
  raw_send(fd, wire::encode_frame(wire::Type::kJoin, handshake::job_hash(kJob), -1, 1, w.str()));
  EXPECT_TRUE(closed_by_peer(fd));
  ::close(fd);
  EXPECT_EQ(server->refused(), 1);
  EXPECT_TRUE(server->waiting().empty());
}

TEST(RendezvousSecurity, SlowLorisIsDroppedAfterIoTimeoutWhileOthersProceed) {
  auto server = start_server(server_options(800ms));
  int silent = raw_connect(server->port());
  int partial = raw_connect(server->port());
  raw_send(partial, std::string("ERUN\x01\0", 6));  // half a header, then nothing
  auto t0 = std::chrono::steady_clock::now();
  expect_server_still_serves(*server, 1);
  EXPECT_TRUE(closed_by_peer(silent));
  EXPECT_TRUE(closed_by_peer(partial));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 600ms);
  ::close(silent);
  ::close(partial);
  EXPECT_EQ(server->refused(), 2);
}

TEST(RendezvousSecurity, StallMidFrameAfterAuthIsDropped) {
  auto server = start_server(server_options(500ms));
  int fd = raw_connect(server->port());
  ASSERT_TRUE(raw_authenticate(fd));
  std::string f = wire::encode_frame(wire::Type::kKvSet, handshake::job_hash(kJob), -1, 1, std::string(100, 'x'));
  raw_send(fd, f.substr(0, 40));
  EXPECT_TRUE(closed_by_peer(fd));
  ::close(fd);
  EXPECT_EQ(server->refused(), 1);
}

TEST(RendezvousSecurity, ClientThatDoesNotReadItsRepliesIsDropped) {
  auto server = start_server(server_options(500ms));
  int fd = raw_connect(server->port());
  ASSERT_TRUE(raw_authenticate(fd));
  uint64_t jh = handshake::job_hash(kJob);
  PayloadWriter set;
  set.bytes("big").bytes(std::string(512 << 10, 'v'));
  raw_send(fd, wire::encode_frame(wire::Type::kKvSet, jh, -1, 1, set.str()));
  PayloadWriter get;
  get.bytes("big").u64(1000);
  std::string gets;
  for (int i = 0; i < 64; ++i) gets += wire::encode_frame(wire::Type::kKvGet, jh, -1, 2 + i, get.str());
  raw_send(fd, gets);  // 32 MiB of replies that are never read
  EXPECT_TRUE(wait_for([&] { return server->refused() == 1; }));
  ::close(fd);
  expect_server_still_serves(*server, 1);
}

TEST(RendezvousSecurity, AuthenticatedIdleClientIsNotDropped) {
  auto server = start_server(server_options(300ms));
  RendezvousClient c(client_options(server->port()));
  ASSERT_TRUE(c.connect().is_ok());
  std::this_thread::sleep_for(900ms);  // three io_timeouts of doing nothing
  EXPECT_TRUE(c.connected());
  EXPECT_EQ(server->refused(), 0);
}

// A fake server that answers the handshake without knowing the secret.
TEST(RendezvousSecurity, ClientRefusesAServerThatCannotProveTheSecret) {
  int lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(lfd, 4), 0);
  socklen_t len = sizeof(a);
  ::getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len);
  std::thread impostor([lfd] {
    int fd = ::accept(lfd, nullptr, nullptr);
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(net::set_nonblocking(fd).is_ok());
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    uint64_t jh = handshake::job_hash(kJob);
    auto hello = wire::recv_frame(fd, jh, 4096, deadline);
    ASSERT_TRUE(hello.is_ok());
    (void)wire::send_all(fd, wire::encode_frame(wire::Type::kChallenge, jh, -1, 0, handshake::random_bytes(32)), deadline);
    auto auth = wire::recv_frame(fd, jh, 4096, deadline);
    ASSERT_TRUE(auth.is_ok());
    (void)wire::send_all(fd, wire::encode_frame(wire::Type::kAuthOk, jh, -1, 0, handshake::random_bytes(32)), deadline);
    closed_by_peer(fd, std::chrono::seconds(10));
    ::close(fd);
  });
  auto o = client_options(ntohs(a.sin_port));
  RendezvousClient c(o);
  auto s = c.connect();
  impostor.join();
  ::close(lfd);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("did not prove"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace erun::testing

namespace erun::testing {
namespace {

// A second process for a rank whose worker is still connected: its JOIN names
// an older generation (a fresh process names none) and is refused, the member
// keeps its rank; once the member is gone the slot may be joined again.
TEST(RendezvousSecurity, JoinWithAnOldGenerationForALiveSlotIsRefused) {
  auto server = start_server();
  auto a = std::make_unique<RendezvousClient>(client_options(server->port()));
  ASSERT_TRUE(a->connect().is_ok());
  auto fa = std::async(std::launch::async, [&] {
    long g = -1;
    return a->join(join_request("h", 0), &g);
  });
  ASSERT_TRUE(wait_for([&] { return server->waiting().size() == 1; }));
  server->publish(1, {rank_of("h", 0, 0, 1)});
  ASSERT_TRUE(fa.get().is_ok());

  // Another process (pid) for the same slot; the same pid would be the
  // member re-connecting, which supersedes its old connection.
  RendezvousClient b(client_options(server->port()));
  ASSERT_TRUE(b.connect().is_ok());
  long g = -1;
  JoinRequest second = join_request("h", 0);
  second.pid += 1;
  auto rb = b.join(second, &g);
  ASSERT_FALSE(rb.is_ok());
  EXPECT_NE(rb.message().find("slot h:0 is held by a live worker (pid"), std::string::npos) << rb.message();
  EXPECT_NE(rb.message().find("in generation 1, and this join names generation -1"), std::string::npos)
      << rb.message();
  ASSERT_EQ(server->members().size(), 1u);
  EXPECT_TRUE(server->waiting().empty());

  // The member leaves: a replacement process may take the slot's rank.
  a.reset();
  ASSERT_TRUE(wait_for([&] { return server->members().empty(); }));
  RendezvousClient c(client_options(server->port()));
  ASSERT_TRUE(c.connect().is_ok());
  long gc = -1;
  auto rc = c.join(join_request("h", 0), &gc);
  ASSERT_TRUE(rc.is_ok()) << rc.message();
  EXPECT_EQ(gc, 1);
  EXPECT_EQ(server->members().size(), 1u);
}

// Floods: silent and one-byte connections past the cap of unauthenticated
// connections; the oldest are closed and a real worker is still served.
TEST(RendezvousSecurity, UnauthenticatedFloodIsCappedOldestClosedFirst) {
  auto o = server_options();
  o.max_unauthenticated = 16;
  auto server = start_server(o);
  std::vector<int> silent;
  for (int i = 0; i < 16; ++i) silent.push_back(raw_connect(server->port()));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // older than the minimum age
  std::vector<int> junk;
  for (int i = 0; i < 200; ++i) {
    int fd = raw_connect(server->port());
    raw_send(fd, "x");
    junk.push_back(fd);
  }
  // The first silent ones were closed to make room.
  EXPECT_TRUE(closed_by_peer(silent.front(), std::chrono::seconds(5)));
  expect_server_still_serves(*server, 1);
  EXPECT_GE(server->refused(), 16);
  for (int fd : silent) ::close(fd);
  for (int fd : junk) ::close(fd);
}

TEST(RendezvousSecurity, MoreThanAHandshakeFrameBeforeAuthIsDropped) {
  auto server = start_server();
  int fd = raw_connect(server->port());
  // A valid-looking header with a small payload, followed by junk: the
  // server holds at most one handshake frame and refuses the rest.
  std::string junk(4096, 'j');
  ::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL);
  EXPECT_TRUE(closed_by_peer(fd, std::chrono::seconds(5)));
  ::close(fd);
  expect_server_still_serves(*server, 1);
}

}  // namespace
}  // namespace erun::testing
