#include "collectives/tcp/pair.h"

#include <sys/socket.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "common/codec.h"
#include "erun/communicator.hpp"

namespace erun::tcp {
namespace {

static_assert(std::endian::native == std::endian::little, "the pair wire format is little-endian");

constexpr uint32_t kFrameMagic = 0x46504545;  // "EEPF"
constexpr uint8_t kFrameVersion = 1;

uint32_t fnv1a(const void* p, size_t n) {
  uint32_t h = 2166136261u;
  auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 16777619u;
  return h;
}

std::string describe(uint8_t op, uint8_t dtype, uint8_t reduce, uint64_t count, int32_t root) {
  // A peer's numbers may be out of range: named only when known.
  const char* type = dtype <= 6 ? to_string(static_cast<DataType>(dtype)) : "?";
  const char* how = reduce <= 4 ? to_string(static_cast<ReduceOp>(reduce)) : "?";
  switch (static_cast<Op>(op)) {
    case Op::kAllreduce: return fmt::format("allreduce({} x {}, {})", count, type, how);
    case Op::kBroadcast: return fmt::format("broadcast({} bytes, root {})", count, root);
    case Op::kAllgather: return fmt::format("allgather({} bytes each)", count);
    case Op::kAllgathervSizes:
    case Op::kAllgatherv: return "allgatherv";
    case Op::kBarrier: return "barrier";
    case Op::kReduceScatter:
      return fmt::format("reduce_scatter({} x {}, {}, split {:#x})", count, type, how, static_cast<uint32_t>(root));
  }
  return fmt::format("unknown operation {}", op);
}

constexpr uint32_t kHandshakeMagic = 0x31504545;  // "EEP1"
constexpr uint16_t kHandshakeVersion = 1;
enum HandshakeType : uint16_t { kHello = 1, kChallenge = 2, kAuth = 3, kAccepted = 4 };
constexpr size_t kHelloBytes = 8 + 8 + 8 + 4 + 4 + handshake::kNonceBytes;  // 64
constexpr size_t kChallengeBytes = 8 + handshake::kNonceBytes + handshake::kMacBytes;  // 72
constexpr size_t kAuthBytes = 8 + handshake::kMacBytes;  // 40
constexpr size_t kAcceptedBytes = 8;

PayloadWriter handshake_head(HandshakeType t) {
  PayloadWriter w;
  w.u32(kHandshakeMagic).u32(static_cast<uint32_t>(kHandshakeVersion) | (static_cast<uint32_t>(t) << 16));
  return w;
}

// Why a handshake message is refused, or empty.
std::string check_head(PayloadReader& r, HandshakeType want) {
  uint32_t magic = r.u32();
  uint32_t vt = r.u32();
  if (magic != kHandshakeMagic) return fmt::format("not an erun pair handshake (magic {:#x})", magic);
  if ((vt & 0xffff) != kHandshakeVersion) return fmt::format("pair handshake version {}, want {}", vt & 0xffff, kHandshakeVersion);
  if ((vt >> 16) != want) return fmt::format("handshake message type {}, want {}", vt >> 16, static_cast<int>(want));
  return {};
}

// Each side proves the secret over both nonces, the job, the generation and
// both ranks (the binding); the labels keep one side's proof from passing as
// the other's: HMAC(secret, label || str(job_id) || gen || c || a || nc || na).
constexpr handshake::Scheme kPairScheme{"erun-pair-connector-v1", "erun-pair-acceptor-v1",
                                        handshake::Scheme::Layout::kNoncesLast};

// "1.2.3.4:5" or "[::1]:5" -> host, port.
std::pair<std::string, std::string> split_host_port(const std::string& s) {
  auto colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0) return {"", ""};
  std::string host = s.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return {host, s.substr(colon + 1)};
}

std::string recv_blocking(int fd, size_t want, TimePoint deadline, const net::Interrupt& interrupt,
                          const std::string& who, const std::string& what) {
  std::string out(want, '\0');
  check_outcome(net::recv_exact(fd, out.data(), want, deadline, &interrupt), who, what);
  return out;
}

// A connected socket to rank q at addr, not yet authenticated.
Fd connect_socket(const PairBinding& b, int q, const std::string& addr, TimePoint deadline,
                  const net::Interrupt& interrupt, const std::string& what) {
  auto [host, port] = split_host_port(addr);
  if (host.empty()) throw CommError(fmt::format("erun tcp: {}: rank {} published a malformed address '{}'", b.who, q, addr));
  net::Address e = resolve_address(host, port);
  net::Socket s = net::connect(e, deadline, &interrupt);
  if (s.outcome.end == net::Outcome::kError && s.outcome.call == "socket") {
    throw CommError(fmt::format("erun tcp: socket: {}", s.outcome.text()));
  }
  if (s.outcome.end == net::Outcome::kError && s.outcome.call == "connect") {
    throw CommError(fmt::format("erun tcp: {}: {}: {} (has rank {} exited?)", b.who, what, s.outcome.text(), q));
  }
  check_outcome(s.outcome, b.who, what);
  return std::move(s.fd);
}

bool send_now(int fd, const PayloadWriter& w) {
  return ::send(fd, w.str().data(), w.str().size(), MSG_NOSIGNAL | MSG_DONTWAIT) == static_cast<ssize_t>(w.str().size());
}

}  // namespace

const char* op_name(uint8_t op) {
  switch (static_cast<Op>(op)) {
    case Op::kAllreduce: return "allreduce";
    case Op::kBroadcast: return "broadcast";
    case Op::kAllgather: return "allgather";
    case Op::kAllgathervSizes:
    case Op::kAllgatherv: return "allgatherv";
    case Op::kBarrier: return "barrier";
    case Op::kReduceScatter: return "reduce_scatter";
  }
  return "unknown-op";
}

int32_t split_fingerprint(const std::vector<size_t>& counts) {
  std::vector<uint64_t> words(counts.begin(), counts.end());
  return static_cast<int32_t>(fnv1a(words.data(), words.size() * sizeof(uint64_t)) & 0x7fffffffu);
}

FrameHeader frame_header(const Call& c, long generation, int from, uint64_t seq, uint64_t offset, uint64_t length) {
  FrameHeader h;
  h.magic = kFrameMagic;
  h.version = kFrameVersion;
  h.op = static_cast<uint8_t>(c.op);
  h.dtype = c.dtype;
  h.reduce = c.reduce;
  h.generation = static_cast<uint32_t>(generation);
  h.from = from;
  h.seq = seq;
  h.count = c.count;
  h.offset = offset;
  h.length = length;
  h.root = c.root;
  h.check = fnv1a(&h, offsetof(FrameHeader, check));
  return h;
}

bool intact(const FrameHeader& h) {
  return h.magic == kFrameMagic && h.version == kFrameVersion && h.check == fnv1a(&h, offsetof(FrameHeader, check));
}

std::string describe(const Call& c) { return describe(static_cast<uint8_t>(c.op), c.dtype, c.reduce, c.count, c.root); }
std::string describe(const FrameHeader& h) { return describe(h.op, h.dtype, h.reduce, h.count, h.root); }

handshake::Proofs PairBinding::proofs(int connector, int acceptor) const {
  return handshake::Proofs(key, kPairScheme, PayloadWriter().bytes(job_id).i64(generation).i32(connector).i32(acceptor).str());
}

net::Address resolve_address(const std::string& host, const std::string& port) {
  auto addrs = net::resolve(host, port);
  if (!addrs) throw CommError(fmt::format("erun tcp: cannot resolve address '{}': {}", host, addrs.message()));
  return addrs->front();
}

void check_outcome(const net::Outcome& o, const std::string& who, const std::string& what) {
  switch (o.end) {
    case net::Outcome::kOk: return;
    case net::Outcome::kTimedOut: throw CommError(fmt::format("erun tcp: {}: timed out {}", who, what));
    case net::Outcome::kAborted: throw CommError(fmt::format("erun tcp: {}: aborted {}", who, what));
    case net::Outcome::kCancelled:
      throw CommError(fmt::format("erun tcp: {}: gave up {}: a new generation was announced", who, what));
    case net::Outcome::kClosed: throw CommError(fmt::format("erun tcp: {}: {}: connection closed", who, what));
    case net::Outcome::kError:
      if (o.call == "poll") throw CommError(fmt::format("erun tcp: poll: {}", o.text()));
      throw CommError(fmt::format("erun tcp: {}: {}: {}", who, what, o.text()));
  }
}

Fd connect_pair(const PairBinding& b, int q, const std::string& addr, TimePoint deadline,
                const net::Interrupt& interrupt) {
  const std::string what = fmt::format("connecting to rank {} at {}", q, addr);
  Fd fd = connect_socket(b, q, addr, deadline, interrupt, what);
  const handshake::Proofs proofs = b.proofs(b.rank, q);
  handshake::Initiator hs;
  auto hello = handshake_head(kHello);
  hello.u64(handshake::job_hash(b.job_id)).i64(b.generation).i32(b.rank).i32(q).fixed(hs.nonce());
  check_outcome(net::send_all(fd.get(), hello.str(), deadline, &interrupt), b.who, what);
  std::string ch = recv_blocking(fd.get(), kChallengeBytes, deadline, interrupt, b.who, what + " (waiting for its challenge)");
  PayloadReader r(ch);
  if (auto why = check_head(r, kChallenge); !why.empty()) {
    throw CommError(fmt::format("erun tcp: {}: {}: {}", b.who, what, why));
  }
  const bool challenged = hs.challenged(r.fixed(handshake::kNonceBytes));
  if (!challenged || !hs.verify(proofs, r.fixed(handshake::kMacBytes))) {
    throw CommError(fmt::format("erun tcp: {}: {}: the peer did not prove the job secret for generation {}; "
                                "refusing to exchange data with it", b.who, what, b.generation));
  }
  auto auth = handshake_head(kAuth);
  auth.fixed(hs.proof(proofs));
  check_outcome(net::send_all(fd.get(), auth.str(), deadline, &interrupt), b.who, what);
  std::string ok = recv_blocking(fd.get(), kAcceptedBytes, deadline, interrupt, b.who, what + " (waiting for its acceptance)");
  PayloadReader okr(ok);
  if (auto why = check_head(okr, kAccepted); !why.empty()) {
    throw CommError(fmt::format("erun tcp: {}: {}: {}", b.who, what, why));
  }
  return fd;
}

PendingPair::PendingPair(Fd f, std::string from_address, TimePoint handshake_deadline)
    : fd(std::move(f)), peer(std::move(from_address)), deadline(handshake_deadline), want(kHelloBytes) {}

PendingPair::Progress PendingPair::advance(const PairBinding& b, const std::vector<Fd>& connected, std::string* why) {
  auto refuse = [&](std::string reason) {
    *why = std::move(reason);
    return Progress::kRefused;
  };
  char buf[128];
  ssize_t n = ::recv(fd.get(), buf, std::min(want - in.size(), sizeof(buf)), MSG_DONTWAIT);
  if (n == 0) return refuse("closed before completing the handshake");
  if (n < 0) return errno != EAGAIN && errno != EINTR ? refuse(std::strerror(errno)) : Progress::kWaiting;
  in.append(buf, static_cast<size_t>(n));
  if (in.size() < want) return Progress::kWaiting;
  PayloadReader r(in);
  if (from < 0) {  // the hello
    if (auto bad = check_head(r, kHello); !bad.empty()) return refuse(bad);
    uint64_t jh = r.u64();
    int64_t gen = r.i64();
    int32_t claimed = r.i32();
    int32_t to = r.i32();
    const std::string nonce = r.fixed(handshake::kNonceBytes);
    if (jh != handshake::job_hash(b.job_id)) return refuse("hello for another job");
    if (gen != b.generation) return refuse(fmt::format("hello for generation {}, this is {}", gen, b.generation));
    if (to != b.rank) return refuse(fmt::format("hello for rank {}", to));
    if (claimed <= b.rank || claimed >= b.size) return refuse(fmt::format("hello from rank {}, which does not connect here", claimed));
    if (connected[claimed]) return refuse(fmt::format("hello from rank {}, which is already connected", claimed));
    if (!hs.hello(nonce)) return refuse("malformed hello");
    from = claimed;
    auto ch = handshake_head(kChallenge);
    ch.fixed(hs.challenge()).fixed(hs.proof(b.proofs(from, b.rank)));
    if (!send_now(fd.get(), ch)) return refuse("could not send the challenge");
    in.clear();
    want = kAuthBytes;
    return Progress::kWaiting;
  }
  if (auto bad = check_head(r, kAuth); !bad.empty()) return refuse(bad);
  if (!hs.verify(b.proofs(from, b.rank), r.fixed(handshake::kMacBytes))) {
    return refuse(fmt::format("claimed to be rank {} but its proof is wrong (another job's secret, another "
                              "generation, or a replay)", from));
  }
  if (connected[from]) return refuse(fmt::format("rank {} is already connected", from));
  if (!send_now(fd.get(), handshake_head(kAccepted))) return refuse("could not send the acceptance");
  net::set_nodelay(fd.get());
  return Progress::kPeer;
}

}  // namespace erun::tcp
