#include "rendezvous/wire.h"

#include <cstring>

#include <fmt/format.h>

#include "common/net.h"

namespace erun::wire {

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
    case Type::kTiming: return "TIMING";
  }
  return "UNKNOWN";
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
      .u32(j.probe_us)
      .u32(j.link_us)
      .u32(j.probe_port)
      .u32(j.commit_age_ms)
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
  // The pre-flight time came later: a JOIN without it is whole too.
  if (!r.done() && !r.failed()) j.probe_us = r.u32();
  // So did the link probe's time and the responder's port.
  if (!r.done() && !r.failed()) {
    j.link_us = r.u32();
    j.probe_port = r.u32();
  }
  // And the commit's age.
  if (!r.done() && !r.failed()) j.commit_age_ms = r.u32();
  if (!r.done() || reason > static_cast<uint8_t>(JoinReason::kHostsUpdated) ||
      state > static_cast<uint8_t>(PeerState::kSilent) || j.failed_rank < -1 || j.pid <= 0 ||
      j.slot.local_index < 0 || j.probe_port > 65535) {
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

std::string encode_timing(const Timing& t) {
  return PayloadWriter().u64(t.commit_id).u64(t.commits).u64(t.interval_us).u64(t.wait_us).str();
}

std::optional<Timing> decode_timing(std::string_view payload) {
  PayloadReader r(payload);
  Timing t;
  t.commit_id = r.u64();
  t.commits = r.u64();
  t.interval_us = r.u64();
  t.wait_us = r.u64();
  if (!r.done() || t.commits == 0 || t.wait_us > t.interval_us) return std::nullopt;
  return t;
}

namespace {
constexpr handshake::Scheme kScheme{"erun-client-v1", "erun-server-v1", handshake::Scheme::Layout::kPeerNonceFirst};

// The rendezvous' words for how a read or a write ended.
Status io_status(const net::Outcome& o, const char* timed_out, const char* verb) {
  switch (o.end) {
    case net::Outcome::kOk: return Status::ok();
    case net::Outcome::kTimedOut: return Status::error(timed_out);
    case net::Outcome::kClosed: return Status::error("connection closed by the peer");
    default: return Status::error(fmt::format("{} failed: {}", verb, o.text()));
  }
}
}  // namespace

handshake::Proofs proofs(std::string_view secret, std::string_view job_id) {
  return handshake::Proofs(std::make_shared<const handshake::Key>(secret), kScheme,
                           PayloadWriter().bytes(job_id).str());
}

std::string client_proof(std::string_view secret, std::string_view server_nonce,
                         std::string_view job_id, std::string_view client_nonce) {
  return proofs(secret, job_id).initiator(client_nonce, server_nonce);
}
std::string server_proof(std::string_view secret, std::string_view client_nonce,
                         std::string_view job_id, std::string_view server_nonce) {
  return proofs(secret, job_id).responder(client_nonce, server_nonce);
}

Status send_all(int fd, std::string_view data, TimePoint deadline) {
  return io_status(net::send_all(fd, data, deadline), "timed out sending to the peer", "send");
}

Result<Frame> recv_frame(int fd, uint64_t expected_job_hash, size_t max_payload,
                         TimePoint deadline) {
  const char* timed_out = "timed out waiting for the peer";
  char hb[kHeaderBytes];
  if (auto s = io_status(net::recv_exact(fd, hb, kHeaderBytes, deadline), timed_out, "recv"); !s) return s;
  Frame f;
  f.header = decode_header(hb);
  if (auto why = check_header(f.header, expected_job_hash, max_payload)) {
    return Result<Frame>::error(*why);
  }
  f.payload.resize(f.header.length);
  if (auto s = io_status(net::recv_exact(fd, f.payload.data(), f.payload.size(), deadline), timed_out, "recv"); !s) {
    return s;
  }
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
