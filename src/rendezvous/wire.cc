#include "rendezvous/wire.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace erun::wire {
namespace {

void put_le(char* out, uint64_t v, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

uint64_t get_le(const char* in, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(in[i])) << (8 * i);
  return v;
}

int poll_ms(TimePoint deadline) {
  auto left = deadline - std::chrono::steady_clock::now();
  if (left <= Duration::zero()) return 0;
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return ms > 60'000 ? 60'000 : static_cast<int>(ms);
}

// Waits for `events` on fd until the deadline; false on timeout.
bool wait_fd(int fd, short events, TimePoint deadline) {
  while (true) {
    pollfd p{fd, events, 0};
    int ms = poll_ms(deadline);
    int n = ::poll(&p, 1, ms);
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return true;  // let the caller's I/O call report it
    if (n == 0 && std::chrono::steady_clock::now() >= deadline) return false;
  }
}

}  // namespace

const char* type_name(uint16_t type) {
  switch (static_cast<Type>(type)) {
    case Type::kHello: return "HELLO";
    case Type::kChallenge: return "CHALLENGE";
    case Type::kAuth: return "AUTH";
    case Type::kAuthOk: return "AUTH_OK";
    case Type::kJoin: return "JOIN";
    case Type::kAssignment: return "ASSIGNMENT";
    case Type::kKvSet: return "KV_SET";
    case Type::kKvSetOk: return "KV_SET_OK";
    case Type::kKvGet: return "KV_GET";
    case Type::kKvValue: return "KV_VALUE";
    case Type::kKvCheck: return "KV_CHECK";
    case Type::kKvCheckResult: return "KV_CHECK_RESULT";
    case Type::kHostsUpdated: return "HOSTS_UPDATED";
    case Type::kError: return "ERROR";
    case Type::kPeersLost: return "PEERS_LOST";
    case Type::kRelay: return "RELAY";
    case Type::kRelayClosed: return "RELAY_CLOSED";
  }
  return "UNKNOWN";
}

uint64_t job_hash(std::string_view job_id) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  ERUN_CHECK(EVP_Digest(job_id.data(), job_id.size(), md, &len, EVP_sha256(), nullptr) == 1);
  return get_le(reinterpret_cast<const char*>(md), 8);
}

void encode_header(const Header& h, char out[kHeaderBytes]) {
  put_le(out + 0, h.magic, 4);
  put_le(out + 4, h.version, 2);
  put_le(out + 6, h.type, 2);
  put_le(out + 8, h.job_hash, 8);
  put_le(out + 16, static_cast<uint64_t>(h.generation), 8);
  put_le(out + 24, h.request_id, 4);
  put_le(out + 28, h.length, 4);
}

Header decode_header(const char in[kHeaderBytes]) {
  Header h;
  h.magic = static_cast<uint32_t>(get_le(in + 0, 4));
  h.version = static_cast<uint16_t>(get_le(in + 4, 2));
  h.type = static_cast<uint16_t>(get_le(in + 6, 2));
  h.job_hash = get_le(in + 8, 8);
  h.generation = static_cast<int64_t>(get_le(in + 16, 8));
  h.request_id = static_cast<uint32_t>(get_le(in + 24, 4));
  h.length = static_cast<uint32_t>(get_le(in + 28, 4));
  return h;
}

std::optional<std::string> check_header(const Header& h, uint64_t expected_job_hash,
                                        size_t max_payload) {
  if (h.magic != kMagic) return fmt::format("bad magic 0x{:08x} (not an erun peer)", h.magic);
  if (h.version != kVersion) {
    return fmt::format("protocol version {} (this side speaks {}; use the same erun build)",
                       h.version, kVersion);
  }
  if (h.job_hash != expected_job_hash) return std::string("wrong job id (a peer of another job?)");
  if (h.length > max_payload) {
    return fmt::format("frame of {} bytes is over the limit of {} bytes", h.length, max_payload);
  }
  return std::nullopt;
}

std::string encode_frame(Type type, uint64_t job_hash, int64_t generation, uint32_t request_id,
                         std::string_view payload) {
  ERUN_CHECK(payload.size() <= UINT32_MAX);
  Header h;
  h.type = static_cast<uint16_t>(type);
  h.job_hash = job_hash;
  h.generation = generation;
  h.request_id = request_id;
  h.length = static_cast<uint32_t>(payload.size());
  std::string out(kHeaderBytes + payload.size(), '\0');
  encode_header(h, out.data());
  if (!payload.empty()) std::memcpy(out.data() + kHeaderBytes, payload.data(), payload.size());
  return out;
}

std::string encode_relay(uint64_t job_hash, uint32_t stream, std::string_view inner) {
  ERUN_CHECK(inner.size() <= UINT32_MAX - 4);
  Header h;
  h.type = static_cast<uint16_t>(Type::kRelay);
  h.job_hash = job_hash;
  h.length = static_cast<uint32_t>(4 + inner.size());
  std::string out(kRelayOverhead + inner.size(), '\0');
  encode_header(h, out.data());
  put_le(out.data() + kHeaderBytes, stream, 4);
  std::memcpy(out.data() + kRelayOverhead, inner.data(), inner.size());
  return out;
}

std::string encode_relay_closed(uint64_t job_hash, uint32_t stream) {
  char b[4];
  put_le(b, stream, 4);
  return encode_frame(Type::kRelayClosed, job_hash, -1, 0, std::string_view(b, 4));
}

std::optional<std::string> decode_relay(std::string_view payload, uint64_t expected_job_hash,
                                        size_t max_inner_payload, RelayedFrame* out) {
  if (payload.size() < 4 + kHeaderBytes) {
    return fmt::format("malformed RELAY frame ({} bytes, shorter than a stream id and a header)", payload.size());
  }
  out->stream = static_cast<uint32_t>(get_le(payload.data(), 4));
  out->header = decode_header(payload.data() + 4);
  if (auto why = check_header(out->header, expected_job_hash, max_inner_payload)) {
    return fmt::format("RELAY frame of stream {} carries a bad frame: {}", out->stream, *why);
  }
  if (out->header.length != payload.size() - 4 - kHeaderBytes) {
    return fmt::format("RELAY frame of stream {} carries a frame of {} payload bytes in {} bytes", out->stream,
                       out->header.length, payload.size() - 4 - kHeaderBytes);
  }
  out->payload = payload.substr(4 + kHeaderBytes);
  return std::nullopt;
}

std::optional<uint32_t> decode_relay_closed(std::string_view payload) {
  if (payload.size() != 4) return std::nullopt;
  return static_cast<uint32_t>(get_le(payload.data(), 4));
}

PayloadWriter& PayloadWriter::raw(const void* p, size_t n) {
  buf_.append(static_cast<const char*>(p), n);
  return *this;
}
PayloadWriter& PayloadWriter::u32(uint32_t v) {
  char b[4];
  put_le(b, v, 4);
  return raw(b, 4);
}
PayloadWriter& PayloadWriter::u64(uint64_t v) {
  char b[8];
  put_le(b, v, 8);
  return raw(b, 8);
}
PayloadWriter& PayloadWriter::bytes(std::string_view s) {
  ERUN_CHECK(s.size() <= UINT32_MAX);
  u32(static_cast<uint32_t>(s.size()));
  return raw(s.data(), s.size());
}

bool PayloadReader::take(size_t n) {
  if (failed_ || p_.size() - pos_ < n) {
    failed_ = true;
    return false;
  }
  return true;
}
uint8_t PayloadReader::u8() {
  if (!take(1)) return 0;
  return static_cast<uint8_t>(p_[pos_++]);
}
uint32_t PayloadReader::u32() {
  if (!take(4)) return 0;
  auto v = static_cast<uint32_t>(get_le(p_.data() + pos_, 4));
  pos_ += 4;
  return v;
}
uint64_t PayloadReader::u64() {
  if (!take(8)) return 0;
  auto v = get_le(p_.data() + pos_, 8);
  pos_ += 8;
  return v;
}
std::string PayloadReader::bytes() {
  uint32_t n = u32();
  return fixed(n);
}
std::string PayloadReader::fixed(size_t n) {
  if (!take(n)) return {};
  std::string s(p_.substr(pos_, n));
  pos_ += n;
  return s;
}

// ---- message payloads ------------------------------------------------------

std::string encode_join(const JoinRequest& j) {
  return PayloadWriter()
      .bytes(j.slot.host)
      .i32(j.slot.local_index)
      .u64(j.commit_id)
      .i64(j.pid)
      .u8(static_cast<uint8_t>(j.reason))
      .i32(j.failed_rank)
      .u8(static_cast<uint8_t>(j.failed_state))
      .str();
}

std::optional<JoinRequest> decode_join(std::string_view payload) {
  PayloadReader r(payload);
  JoinRequest j;
  j.slot.host = r.bytes();
  j.slot.local_index = r.i32();
  j.commit_id = r.u64();
  j.pid = static_cast<long>(r.i64());
  uint8_t reason = r.u8();
  j.failed_rank = r.i32();
  uint8_t state = r.u8();
  if (!r.done() || reason > static_cast<uint8_t>(JoinReason::kHostsUpdated) ||
      state > static_cast<uint8_t>(PeerState::kSilent) || j.failed_rank < -1 || j.pid <= 0 ||
      j.slot.local_index < 0) {
    return std::nullopt;
  }
  j.reason = static_cast<JoinReason>(reason);
  j.failed_state = static_cast<PeerState>(state);
  return j;
}

std::string encode_assignment(const RankAssignment& a, int64_t generation) {
  return PayloadWriter()
      .i32(a.rank)
      .i32(a.size)
      .i32(a.local_rank)
      .i32(a.local_size)
      .i32(a.cross_rank)
      .i32(a.cross_size)
      .i64(generation)
      .str();
}

std::optional<RankAssignment> decode_assignment(std::string_view payload, int64_t* generation) {
  PayloadReader r(payload);
  RankAssignment a;
  a.rank = r.i32();
  a.size = r.i32();
  a.local_rank = r.i32();
  a.local_size = r.i32();
  a.cross_rank = r.i32();
  a.cross_size = r.i32();
  int64_t g = r.i64();
  if (!r.done() || a.size <= 0 || a.rank < 0 || a.rank >= a.size) return std::nullopt;
  a.generation = static_cast<long>(g);
  if (generation) *generation = g;
  return a;
}

std::string encode_kv_set(std::string_view key, std::string_view value) {
  return PayloadWriter().bytes(key).bytes(value).str();
}

std::optional<std::pair<std::string, std::string>> decode_kv_set(std::string_view payload) {
  PayloadReader r(payload);
  std::string key = r.bytes();
  std::string value = r.bytes();
  if (!r.done()) return std::nullopt;
  return std::make_pair(std::move(key), std::move(value));
}

std::string encode_kv_get(std::string_view key, uint64_t timeout_ms) {
  return PayloadWriter().bytes(key).u64(timeout_ms).str();
}

std::optional<std::pair<std::string, uint64_t>> decode_kv_get(std::string_view payload) {
  PayloadReader r(payload);
  std::string key = r.bytes();
  uint64_t timeout_ms = r.u64();
  if (!r.done()) return std::nullopt;
  return std::make_pair(std::move(key), timeout_ms);
}

std::string encode_kv_check(const std::vector<std::string>& keys) {
  PayloadWriter w;
  w.u32(static_cast<uint32_t>(keys.size()));
  for (auto& k : keys) w.bytes(k);
  return w.str();
}

std::optional<std::vector<std::string>> decode_kv_check(std::string_view payload) {
  PayloadReader r(payload);
  uint32_t n = r.u32();
  std::vector<std::string> keys;
  // Each key takes at least 4 bytes: a count larger than the payload is malformed.
  if (n > payload.size() / 4) return std::nullopt;
  keys.reserve(n);
  for (uint32_t i = 0; i < n && !r.failed(); ++i) keys.push_back(r.bytes());
  if (!r.done()) return std::nullopt;
  return keys;
}

std::string encode_str(std::string_view s) { return PayloadWriter().bytes(s).str(); }

std::optional<std::string> decode_str(std::string_view payload) {
  PayloadReader r(payload);
  std::string s = r.bytes();
  if (!r.done()) return std::nullopt;
  return s;
}

std::string encode_peers_lost(const std::vector<int>& ranks) {
  PayloadWriter w;
  w.u32(static_cast<uint32_t>(ranks.size()));
  for (int r : ranks) w.i32(r);
  return w.str();
}

std::optional<std::vector<int>> decode_peers_lost(std::string_view payload) {
  PayloadReader r(payload);
  uint32_t n = r.u32();
  if (n == 0 || n > payload.size() / 4) return std::nullopt;
  std::vector<int> ranks;
  ranks.reserve(n);
  for (uint32_t i = 0; i < n && !r.failed(); ++i) {
    int v = r.i32();
    if (v < 0) return std::nullopt;
    ranks.push_back(v);
  }
  if (!r.done()) return std::nullopt;
  return ranks;
}

std::string encode_check_result(bool all) { return PayloadWriter().u8(all ? 1 : 0).str(); }

std::optional<bool> decode_check_result(std::string_view payload) {
  PayloadReader r(payload);
  uint8_t v = r.u8();
  if (!r.done() || v > 1) return std::nullopt;
  return v == 1;
}

std::string random_bytes(size_t n) {
  std::string out(n, '\0');
  ERUN_CHECK(RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)) == 1);
  return out;
}

std::string hmac_sha256(std::string_view key, std::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  ERUN_CHECK(HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
                  reinterpret_cast<const unsigned char*>(data.data()), data.size(), md,
                  &len) != nullptr);
  return std::string(reinterpret_cast<char*>(md), len);
}

bool equal_ct(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

namespace {
std::string proof(std::string_view label, std::string_view secret, std::string_view n1,
                  std::string_view job_id, std::string_view n2) {
  PayloadWriter w;
  w.fixed(label).fixed(n1).bytes(job_id).fixed(n2);
  return hmac_sha256(secret, w.str());
}
}  // namespace

std::string client_proof(std::string_view secret, std::string_view server_nonce,
                         std::string_view job_id, std::string_view client_nonce) {
  return proof("erun-client-v1", secret, server_nonce, job_id, client_nonce);
}
std::string server_proof(std::string_view secret, std::string_view client_nonce,
                         std::string_view job_id, std::string_view server_nonce) {
  return proof("erun-server-v1", secret, client_nonce, job_id, server_nonce);
}

// HMAC (RFC 2104) over SHA-256: H((K ^ opad) || H((K ^ ipad) || m)), with the
// two padded key blocks absorbed once into digest states that each MAC copies.
struct Prover::Pads {
  EVP_MD_CTX* inner = nullptr;
  EVP_MD_CTX* outer = nullptr;
  ~Pads() {
    EVP_MD_CTX_free(inner);
    EVP_MD_CTX_free(outer);
  }
};

namespace {
constexpr size_t kShaBlock = 64;

std::string sha256(std::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  ERUN_CHECK(EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr) == 1);
  return std::string(reinterpret_cast<char*>(md), len);
}

EVP_MD_CTX* padded_state(const std::string& key, unsigned char pad) {
  unsigned char block[kShaBlock];
  for (size_t i = 0; i < kShaBlock; ++i) {
    block[i] = static_cast<unsigned char>((i < key.size() ? static_cast<unsigned char>(key[i]) : 0) ^ pad);
  }
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  ERUN_CHECK(ctx != nullptr && EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr) == 1 &&
             EVP_DigestUpdate(ctx, block, kShaBlock) == 1);
  return ctx;
}
}  // namespace

Prover::Prover(std::string_view secret, std::string_view job_id)
    : job_id_(job_id), pads_(std::make_unique<Pads>()) {
  std::string key = secret.size() > kShaBlock ? sha256(secret) : std::string(secret);
  pads_->inner = padded_state(key, 0x36);
  pads_->outer = padded_state(key, 0x5c);
}

Prover::~Prover() = default;

std::string Prover::mac(std::string_view label, std::string_view n1, std::string_view n2) const {
  PayloadWriter w;
  w.fixed(label).fixed(n1).bytes(job_id_).fixed(n2);
  unsigned char inner[EVP_MAX_MD_SIZE], out[EVP_MAX_MD_SIZE];
  unsigned int inner_len = 0, out_len = 0;
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  ERUN_CHECK(ctx != nullptr && EVP_MD_CTX_copy_ex(ctx, pads_->inner) == 1 &&
             EVP_DigestUpdate(ctx, w.str().data(), w.str().size()) == 1 &&
             EVP_DigestFinal_ex(ctx, inner, &inner_len) == 1 && EVP_MD_CTX_copy_ex(ctx, pads_->outer) == 1 &&
             EVP_DigestUpdate(ctx, inner, inner_len) == 1 && EVP_DigestFinal_ex(ctx, out, &out_len) == 1);
  EVP_MD_CTX_free(ctx);
  return std::string(reinterpret_cast<char*>(out), out_len);
}

std::string Prover::client_proof(std::string_view server_nonce, std::string_view client_nonce) const {
  return mac("erun-client-v1", server_nonce, client_nonce);
}
std::string Prover::server_proof(std::string_view client_nonce, std::string_view server_nonce) const {
  return mac("erun-server-v1", client_nonce, server_nonce);
}

Status set_nonblocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return Status::error(fmt::format("fcntl(O_NONBLOCK): {}", std::strerror(errno)));
  }
  return Status::ok();
}

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

std::string peer_name(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "unknown peer";
  return address_name(ss);
}

std::string address_name(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = {};
  int port = 0;
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    port = ntohs(a->sin_port);
    return fmt::format("{}:{}", host, port);
  }
  if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    port = ntohs(a->sin6_port);
    return fmt::format("[{}]:{}", host, port);
  }
  return "unknown peer";
}

Result<int> connect_tcp(const std::string& host, int port, TimePoint deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::string port_s = std::to_string(port);
  int rc = ::getaddrinfo(host.c_str(), port_s.c_str(), &hints, &res);
  if (rc != 0) {
    return Result<int>::error(fmt::format("cannot resolve rendezvous address '{}': {}", host,
                                          ::gai_strerror(rc)));
  }
  std::string last = "no address";
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last = std::strerror(errno);
      continue;
    }
    int r = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (r != 0 && errno == EINPROGRESS) {
      if (!wait_fd(fd, POLLOUT, deadline)) {
        last = "timed out";
        ::close(fd);
        continue;
      }
      int err = 0;
      socklen_t len = sizeof(err);
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      r = err == 0 ? 0 : -1;
      errno = err;
    }
    if (r != 0) {
      last = std::strerror(errno);
      ::close(fd);
      continue;
    }
    set_nodelay(fd);
    ::freeaddrinfo(res);
    return fd;
  }
  ::freeaddrinfo(res);
  return Result<int>::error(fmt::format(
      "cannot connect to the rendezvous server at {}:{}: {} (is the driver running and reachable?)",
      host, port, last));
}

Result<int> connect_unix(const std::string& path, TimePoint deadline) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof a.sun_path) {
    return Result<int>::error(fmt::format("the rendezvous socket path '{}' is empty or too long", path));
  }
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  std::string last;
  while (true) {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return Result<int>::error(fmt::format("socket: {}", std::strerror(errno)));
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) return fd;
    int err = errno;
    ::close(fd);
    last = std::strerror(err);
    // A full backlog (EAGAIN) clears as the agent accepts: retry until the deadline.
    if (err != EAGAIN || std::chrono::steady_clock::now() >= deadline) break;
    ::usleep(5000);
  }
  return Result<int>::error(fmt::format(
      "cannot connect to the rendezvous relay of this host's erun agent at {}: {} (is the agent running?)", path,
      last));
}

Status send_all(int fd, std::string_view data, TimePoint deadline) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!wait_fd(fd, POLLOUT, deadline)) return Status::error("timed out sending to the peer");
      continue;
    }
    return Status::error(fmt::format("send failed: {}", std::strerror(errno)));
  }
  return Status::ok();
}

Status recv_exact(int fd, char* out, size_t n, TimePoint deadline) {
  size_t off = 0;
  while (off < n) {
    ssize_t r = ::recv(fd, out + off, n - off, 0);
    if (r > 0) {
      off += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) return Status::error("connection closed by the peer");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait_fd(fd, POLLIN, deadline)) return Status::error("timed out waiting for the peer");
      continue;
    }
    return Status::error(fmt::format("recv failed: {}", std::strerror(errno)));
  }
  return Status::ok();
}

Result<Frame> recv_frame(int fd, uint64_t expected_job_hash, size_t max_payload,
                         TimePoint deadline) {
  char hb[kHeaderBytes];
  if (auto s = recv_exact(fd, hb, kHeaderBytes, deadline); !s) return s;
  Frame f;
  f.header = decode_header(hb);
  if (auto why = check_header(f.header, expected_job_hash, max_payload)) {
    return Result<Frame>::error(*why);
  }
  f.payload.resize(f.header.length);
  if (auto s = recv_exact(fd, f.payload.data(), f.payload.size(), deadline); !s) return s;
  return f;
}

}  // namespace erun::wire

namespace erun {

const char* to_string(JoinReason r) {
  switch (r) {
    case JoinReason::kStart: return "start";
    case JoinReason::kFormFailed: return "generation failed to form";
    case JoinReason::kPeerLost: return "peer lost";
    case JoinReason::kHostsUpdated: return "hosts updated";
  }
  return "unknown";
}

const char* to_string(PeerState s) {
  switch (s) {
    case PeerState::kUnknown: return "unknown";
    case PeerState::kDead: return "dead";
    case PeerState::kAlive: return "alive but not arriving";
    case PeerState::kSilent: return "silent over the network";
  }
  return "unknown";
}

}  // namespace erun
