// The network layer of src/common/: Fd, the codec, sockets with deadlines and
// interrupts (net.h), and the challenge-response of both handshakes
// (handshake.h).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <set>
#include <thread>

#include "common/codec.h"
#include "common/fd.h"
#include "common/handshake.h"
#include "common/net.h"

namespace erun {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

bool is_open(int fd) { return ::fcntl(fd, F_GETFD) != -1; }

// ---- Fd ----------------------------------------------------------------------

TEST(CommonFd, ClosesOnDestructionResetAndMoveAssignment) {
  int raw = ::eventfd(0, EFD_CLOEXEC);
  ASSERT_GE(raw, 0);
  {
    Fd fd(raw);
    EXPECT_TRUE(fd.valid());
    EXPECT_EQ(fd.get(), raw);
  }
  EXPECT_FALSE(is_open(raw));

  Fd a(::eventfd(0, EFD_CLOEXEC)), b(::eventfd(0, EFD_CLOEXEC));
  const int a_raw = a.get(), b_raw = b.get();
  a = std::move(b);  // closes what a held, takes b's
  EXPECT_FALSE(is_open(a_raw));
  EXPECT_EQ(a.get(), b_raw);
  EXPECT_FALSE(b.valid());  // NOLINT: a moved-from Fd is empty
  EXPECT_TRUE(is_open(b_raw));

  Fd c(std::move(a));
  EXPECT_EQ(c.get(), b_raw);
  EXPECT_FALSE(a.valid());  // NOLINT
  c.reset();
  EXPECT_FALSE(c.valid());
  EXPECT_FALSE(is_open(b_raw));
}

TEST(CommonFd, ReleaseHandsTheDescriptorBackOpen) {
  Fd fd(::eventfd(0, EFD_CLOEXEC));
  const int raw = fd.release();
  EXPECT_FALSE(fd.valid());
  EXPECT_TRUE(is_open(raw));
  fd.reset(raw);  // owned again
  fd.reset(raw);  // the same descriptor: kept, not closed
  EXPECT_TRUE(is_open(raw));
  Fd self(::eventfd(0, EFD_CLOEXEC));
  const int self_raw = self.get();
  Fd& alias = self;
  self = std::move(alias);  // self-move keeps it
  EXPECT_EQ(self.get(), self_raw);
  EXPECT_TRUE(is_open(self_raw));
}

// ---- codec -------------------------------------------------------------------

TEST(CommonCodec, RoundTripsLittleEndianAndRefusesUnderflow) {
  std::string b = PayloadWriter().u8(7).u32(0x01020304).i64(-2).bytes("job").fixed("xy").str();
  EXPECT_EQ(b.substr(1, 4), std::string("\x04\x03\x02\x01", 4));
  PayloadReader r(b);
  EXPECT_EQ(r.u8(), 7);
  EXPECT_EQ(r.u32(), 0x01020304u);
  EXPECT_EQ(r.i64(), -2);
  EXPECT_EQ(r.bytes(), "job");
  EXPECT_EQ(r.fixed(2), "xy");
  EXPECT_TRUE(r.done());
  EXPECT_EQ(r.u32(), 0u);
  EXPECT_TRUE(r.failed());
  EXPECT_FALSE(r.done());
  // A length prefix larger than what is left.
  const std::string short_payload = PayloadWriter().u32(1000).fixed("short").str();  // outlives the reader's view
  PayloadReader big(short_payload);
  EXPECT_EQ(big.bytes(), "");
  EXPECT_TRUE(big.failed());
}

// ---- sockets -----------------------------------------------------------------

net::Address loopback(const std::string& port = "0") {
  auto a = net::resolve("127.0.0.1", port);
  EXPECT_TRUE(a.is_ok()) << a.message();
  return a->front();
}

TEST(CommonNet, ResolvesNumericAndRefusesANonNumericPort) {
  net::Address a = loopback("4242");
  EXPECT_EQ(a.family(), AF_INET);
  EXPECT_EQ(a.port(), 4242);
  EXPECT_EQ(a.name(), "127.0.0.1:4242");
  EXPECT_FALSE(a.is_wildcard());
  auto any = net::resolve("", "0", /*passive=*/true);
  ASSERT_TRUE(any.is_ok()) << any.message();
  EXPECT_TRUE(any->front().is_wildcard());
  auto bad = net::resolve("127.0.0.1", "http");  // ports are numbers
  EXPECT_FALSE(bad.is_ok());
  EXPECT_FALSE(bad.message().empty());
}

TEST(CommonNet, ListensAcceptsAndMovesBytesWithDeadlines) {
  net::Socket l = net::listen(loopback(), 16);
  ASSERT_TRUE(l.ok()) << l.outcome.text();
  net::Address bound = net::local_address(l.fd.get());
  ASSERT_GT(bound.port(), 0);

  net::Address none;
  Fd nothing = net::accept(l.fd.get(), &none);  // non-blocking: nobody waits yet
  EXPECT_FALSE(nothing.valid());
  EXPECT_EQ(errno, EAGAIN);

  const TimePoint deadline = Clock::now() + 5s;
  net::Socket c = net::connect(bound, deadline);
  ASSERT_TRUE(c.ok()) << c.outcome.text();
  ASSERT_EQ(net::wait_fd(l.fd.get(), POLLIN, deadline).end, net::Outcome::kOk);
  net::Address peer;
  Fd s = net::accept(l.fd.get(), &peer);
  ASSERT_TRUE(s.valid());
  EXPECT_EQ(peer.name(), net::local_address(c.fd.get()).name());
  EXPECT_EQ(::fcntl(s.get(), F_GETFL) & O_NONBLOCK, O_NONBLOCK);
  EXPECT_EQ(::fcntl(s.get(), F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);

  const std::string big(4 << 20, 'z');  // more than the socket buffers: send_all must wait for the reader
  std::thread writer([&] { EXPECT_TRUE(net::send_all(c.fd.get(), big, deadline).ok()); });
  std::string got(big.size(), '\0');
  EXPECT_TRUE(net::recv_exact(s.get(), got.data(), got.size(), deadline).ok());
  writer.join();
  EXPECT_EQ(got, big);

  // Nothing more comes: the read times out at its deadline, then sees the close.
  char b;
  auto t0 = Clock::now();
  EXPECT_EQ(net::recv_exact(s.get(), &b, 1, Clock::now() + 100ms).end, net::Outcome::kTimedOut);
  EXPECT_GE(Clock::now() - t0, 90ms);
  c.fd.reset();
  EXPECT_EQ(net::recv_exact(s.get(), &b, 1, deadline).end, net::Outcome::kClosed);
}

// A listener whose accept queue is full drops new SYNs: a connect to it hangs
// as to a black-holed address, on loopback and without a network.
struct FullListener {
  net::Socket listener = net::listen(loopback(), 0);
  std::vector<net::Socket> queued;
  net::Address address;
  FullListener() {
    address = net::local_address(listener.fd.get());
    for (int i = 0; i < 16; ++i) {
      net::Socket s = net::connect(address, Clock::now() + 200ms);
      if (!s.ok()) return;  // the queue is full
      queued.push_back(std::move(s));
    }
  }
};

TEST(CommonNet, ConnectToABlackholedPortEndsAtItsDeadline) {
  FullListener full;
  ASSERT_LT(full.queued.size(), 16u) << "the accept queue never filled";
  auto t0 = Clock::now();
  net::Socket s = net::connect(full.address, Clock::now() + 300ms);
  auto took = Clock::now() - t0;
  EXPECT_EQ(s.outcome.end, net::Outcome::kTimedOut) << s.outcome.text();
  EXPECT_EQ(s.outcome.text(), "timed out");
  EXPECT_FALSE(s.fd.valid());
  EXPECT_GE(took, 290ms);
  EXPECT_LT(took, 3s);
}

TEST(CommonNet, AnInterruptEndsAConnectEarly) {
  FullListener full;
  ASSERT_LT(full.queued.size(), 16u);
  // The abort eventfd, written from another thread.
  Fd abort_fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  net::Interrupt by_fd{abort_fd.get(), nullptr, {}};
  std::thread t([&] {
    std::this_thread::sleep_for(100ms);
    uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(abort_fd.get(), &one, sizeof one);
  });
  auto t0 = Clock::now();
  net::Socket s = net::connect(full.address, Clock::now() + 10s, &by_fd);
  t.join();
  EXPECT_EQ(s.outcome.end, net::Outcome::kAborted);
  EXPECT_LT(Clock::now() - t0, 5s);
  // The flag alone (polled at least every 50 ms).
  std::atomic<bool> aborted{false};
  net::Interrupt by_flag{-1, &aborted, {}};
  std::thread f([&] {
    std::this_thread::sleep_for(100ms);
    aborted = true;
  });
  t0 = Clock::now();
  s = net::connect(full.address, Clock::now() + 10s, &by_flag);
  f.join();
  EXPECT_EQ(s.outcome.end, net::Outcome::kAborted);
  EXPECT_LT(Clock::now() - t0, 5s);
  // A cancel callback (a new generation announced).
  std::atomic<int> asked{0};
  net::Interrupt by_cancel{-1, nullptr, [&] { return ++asked >= 3; }};
  s = net::connect(full.address, Clock::now() + 10s, &by_cancel);
  EXPECT_EQ(s.outcome.end, net::Outcome::kCancelled);
  EXPECT_GE(asked.load(), 3);
}

TEST(CommonNet, ARefusedConnectNamesConnect) {
  net::Address a;
  {
    net::Socket l = net::listen(loopback(), 1);
    ASSERT_TRUE(l.ok());
    a = net::local_address(l.fd.get());
  }  // closed: nobody listens there now
  net::Socket s = net::connect(a, Clock::now() + 5s);
  EXPECT_EQ(s.outcome.end, net::Outcome::kError);
  EXPECT_EQ(s.outcome.call, "connect");
  EXPECT_EQ(s.outcome.error, ECONNREFUSED);
  // Binding a port that is taken names bind.
  net::Socket l1 = net::listen(loopback(), 1);
  ASSERT_TRUE(l1.ok());
  net::Socket l2 = net::listen(net::local_address(l1.fd.get()), 1);
  EXPECT_EQ(l2.outcome.call, "bind");
  EXPECT_EQ(l2.outcome.error, EADDRINUSE);
}

TEST(CommonNet, UnixSocketsListenAndConnect) {
  net::Address too_long;
  EXPECT_FALSE(net::unix_address(std::string(200, 'p'), &too_long));
  EXPECT_FALSE(net::unix_address("", &too_long));
  const std::string path = ::testing::TempDir() + "/erun-common-net-" + std::to_string(::getpid());
  std::filesystem::remove(path);
  net::Address a;
  ASSERT_TRUE(net::unix_address(path, &a));
  net::Socket l = net::listen(a, 4);
  ASSERT_TRUE(l.ok()) << l.outcome.text();
  net::Socket c = net::connect_unix(a, Clock::now() + 1s);
  ASSERT_TRUE(c.ok()) << c.outcome.text();
  Fd s = net::accept(l.fd.get());
  ASSERT_TRUE(s.valid());
  EXPECT_TRUE(net::send_all(c.fd.get(), "ping", Clock::now() + 1s).ok());
  char buf[4];
  EXPECT_TRUE(net::recv_exact(s.get(), buf, 4, Clock::now() + 1s).ok());
  EXPECT_EQ(std::string(buf, 4), "ping");
  std::filesystem::remove(path);
  net::Socket gone = net::connect_unix(a, Clock::now() + 1s);
  EXPECT_EQ(gone.outcome.call, "connect");
  EXPECT_EQ(gone.outcome.error, ENOENT);
}

// ---- handshake ---------------------------------------------------------------

constexpr handshake::Scheme kTestScheme{"test-initiator", "test-responder",
                                        handshake::Scheme::Layout::kPeerNonceFirst};

handshake::Proofs proofs_for(std::string_view secret, std::string binding = "job") {
  return handshake::Proofs(std::make_shared<const handshake::Key>(secret), kTestScheme, std::move(binding));
}

TEST(CommonHandshake, KeyEqualsOneShotHmacForShortAndLongSecrets) {
  for (std::string secret : {std::string(""), std::string("k"), std::string(64, 's'), std::string(65, 's'),
                             std::string(200, '\x9c')}) {
    handshake::Key key(secret);
    for (std::string m : {std::string(), std::string("message"), std::string(1000, 'm')}) {
      EXPECT_EQ(key.mac(m), handshake::hmac_sha256(secret, m)) << secret.size() << " " << m.size();
    }
  }
}

TEST(CommonHandshake, BothLayoutsMacTheDocumentedBytes) {
  auto key = std::make_shared<const handshake::Key>("secret");
  const std::string ni(32, 'i'), nr(32, 'r');
  handshake::Proofs peer_first(key, kTestScheme, "B");
  EXPECT_EQ(peer_first.initiator(ni, nr), handshake::hmac_sha256("secret", "test-initiator" + nr + "B" + ni));
  EXPECT_EQ(peer_first.responder(ni, nr), handshake::hmac_sha256("secret", "test-responder" + ni + "B" + nr));
  handshake::Proofs last(key, {"c", "a", handshake::Scheme::Layout::kNoncesLast}, "B");
  EXPECT_EQ(last.initiator(ni, nr), handshake::hmac_sha256("secret", "cB" + ni + nr));
  EXPECT_EQ(last.responder(ni, nr), handshake::hmac_sha256("secret", "aB" + ni + nr));
}

TEST(CommonHandshake, BothSidesProveTheSameSecret) {
  const handshake::Proofs p = proofs_for("s3cret");
  handshake::NoncePool pool;
  handshake::Initiator client;
  handshake::Responder server;
  EXPECT_EQ(client.nonce().size(), handshake::kNonceBytes);
  ASSERT_TRUE(server.hello(client.nonce(), &pool));
  ASSERT_TRUE(client.challenged(server.challenge()));
  EXPECT_NE(server.challenge(), client.nonce());
  EXPECT_TRUE(server.verify(p, client.proof(p)));
  EXPECT_TRUE(client.verify(p, server.proof(p)));
  EXPECT_EQ(client.proof(p).size(), handshake::kMacBytes);
  // No reflection: one side's proof never passes as the other's.
  EXPECT_FALSE(client.verify(p, client.proof(p)));
  EXPECT_FALSE(server.verify(p, server.proof(p)));
}

TEST(CommonHandshake, AWrongSecretAReplayOrAnotherBindingIsRefused) {
  const handshake::Proofs right = proofs_for("s3cret"), wrong = proofs_for("guess"), other = proofs_for("s3cret", "job2");
  handshake::Initiator client;
  handshake::Responder server;
  ASSERT_TRUE(server.hello(client.nonce()));
  ASSERT_TRUE(client.challenged(server.challenge()));
  EXPECT_FALSE(server.verify(right, client.proof(wrong)));  // a client with another secret
  EXPECT_FALSE(client.verify(right, server.proof(wrong)));  // an impostor server
  EXPECT_FALSE(server.verify(right, client.proof(other)));  // another job (or generation, or pair)
  // A replay: the client's proof from this session, sent in a new one.
  const std::string recorded = client.proof(right);
  handshake::Responder later;
  ASSERT_TRUE(later.hello(client.nonce()));
  EXPECT_NE(later.challenge(), server.challenge());
  EXPECT_FALSE(later.verify(right, recorded));
  // Malformed and truncated pieces.
  EXPECT_FALSE(server.verify(right, client.proof(right).substr(1)));
  EXPECT_FALSE(server.verify(right, ""));
  handshake::Responder fresh;
  EXPECT_FALSE(fresh.hello("short"));
  EXPECT_FALSE(fresh.verify(right, client.proof(right)));  // no hello: nothing verifies
  handshake::Initiator unchallenged;
  EXPECT_FALSE(unchallenged.challenged(std::string(31, 'n')));
  EXPECT_FALSE(unchallenged.verify(right, server.proof(right)));
}

TEST(CommonHandshake, NoncesAreFreshAndJobHashIsTheDigestsFirstBytes) {
  handshake::NoncePool pool(4);
  std::set<std::string> seen;
  for (int i = 0; i < 20; ++i) {
    std::string n = pool.next();
    EXPECT_EQ(n.size(), handshake::kNonceBytes);
    EXPECT_TRUE(seen.insert(n).second);
  }
  EXPECT_EQ(handshake::job_hash("job"), get_le(handshake::sha256("job").data(), 8));
  EXPECT_NE(handshake::job_hash("job"), handshake::job_hash("jab"));
  EXPECT_TRUE(handshake::equal_ct("abc", "abc"));
  EXPECT_FALSE(handshake::equal_ct("abc", "abd"));
  EXPECT_FALSE(handshake::equal_ct("abc", "ab"));
}

}  // namespace
}  // namespace erun
