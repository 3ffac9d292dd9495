// The rendezvous wire format (docs/protocol.md): a fixed 32-byte little-endian
// header, then a payload of at most max_frame_bytes. Pure functions over bytes,
// the handshake's proofs under the rendezvous' labels, and frame I/O with
// deadlines over common/net.h. Nothing here keeps state; everything is safe
// from any thread. The codec, crypto and sockets are common/'s.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "common/codec.h"
#include "common/handshake.h"
#include "common/status.h"
#include "rendezvous/membership.h"

namespace erun::wire {

constexpr uint32_t kMagic = 0x4E555245;  // "ERUN" as little-endian bytes
constexpr uint16_t kVersion = 3;  // 2: JOIN carries reason and failed rank; 3: agent relay frames
constexpr size_t kHeaderBytes = 32;
constexpr size_t kNonceBytes = handshake::kNonceBytes;  // HELLO's and CHALLENGE's payload
constexpr size_t kMacBytes = handshake::kMacBytes;      // AUTH's and AUTH_OK's payload
// Frames before authentication are tiny; anything larger is refused at once.
constexpr size_t kMaxHandshakeFrameBytes = 256;
// A relay frame wraps one whole inner frame: its header and a u32 stream id.
constexpr size_t kRelayOverhead = kHeaderBytes + 4;
// Streams (workers) one relay connection may carry at a time.
constexpr size_t kMaxRelayStreams = 4096;

enum class Type : uint16_t {
  kHello = 1,           // client -> server: client nonce
  kChallenge = 2,       // server -> client: server nonce
  kAuth = 3,            // client -> server: client proof
  kAuthOk = 4,          // server -> client: server proof
  kJoin = 5,            // client -> server: slot, commit id, pid, reason, failed rank
  kAssignment = 6,      // server -> client: rank, size, ... , generation
  kKvSet = 7,           // client -> server: key, value
  kKvSetOk = 8,         // server -> client
  kKvGet = 9,           // client -> server: key, timeout in ms
  kKvValue = 10,        // server -> client: value
  kKvCheck = 11,        // client -> server: keys
  kKvCheckResult = 12,  // server -> client: 1 if every key exists
  kHostsUpdated = 13,   // server -> client push
  kError = 14,          // either way: message
  kPeersLost = 15,      // server -> client push: ranks of the header's generation that are gone
  kRelay = 16,          // either way, on an agent's relay connection: u32 stream + one whole inner frame
  kRelayClosed = 17,    // either way, on an agent's relay connection: u32 stream
  kTiming = 18,         // client -> server, no reply: commit intervals (u64 commit id, commits, interval us, wait us)
};
const char* type_name(uint16_t type);

struct Header {
  uint32_t magic = kMagic;
  uint16_t version = kVersion;
  uint16_t type = 0;
  uint64_t job_hash = 0;
  int64_t generation = -1;
  uint32_t request_id = 0;
  uint32_t length = 0;
};

void encode_header(const Header& h, char out[kHeaderBytes]);
Header decode_header(const char in[kHeaderBytes]);
// Why a header must be refused ("bad magic 0x..."), or nullopt when it is fine.
std::optional<std::string> check_header(const Header& h, uint64_t expected_job_hash,
                                        size_t max_payload);

// A whole frame (header + payload) as bytes.
std::string encode_frame(Type type, uint64_t job_hash, int64_t generation, uint32_t request_id,
                         std::string_view payload);

// The message payloads (docs/protocol.md), each encoder next to its decoder.
// A decoder returns nullopt for a malformed payload (short, or bytes left over,
// or an out-of-range enum).
std::string encode_join(const JoinRequest& j);
std::optional<JoinRequest> decode_join(std::string_view payload);
std::string encode_assignment(const RankAssignment& a, int64_t generation);
// The slot is not on the wire: the caller knows which slot it joined.
std::optional<RankAssignment> decode_assignment(std::string_view payload, int64_t* generation);
std::string encode_kv_set(std::string_view key, std::string_view value);
std::optional<std::pair<std::string, std::string>> decode_kv_set(std::string_view payload);
std::string encode_kv_get(std::string_view key, uint64_t timeout_ms);
std::optional<std::pair<std::string, uint64_t>> decode_kv_get(std::string_view payload);
std::string encode_kv_check(const std::vector<std::string>& keys);
std::optional<std::vector<std::string>> decode_kv_check(std::string_view payload);
// KV_VALUE and ERROR: one str.
std::string encode_str(std::string_view s);
std::optional<std::string> decode_str(std::string_view payload);
std::string encode_check_result(bool all);
// PEERS_LOST: the ranks (at least one, each >= 0) of the header's generation
// that the driver knows are gone.
std::string encode_peers_lost(const std::vector<int>& ranks);
std::optional<std::vector<int>> decode_peers_lost(std::string_view payload);
std::optional<bool> decode_check_result(std::string_view payload);
// TIMING: the commit that ended the span, how many commit intervals it
// covers (at least 1), its length and the time spent in collectives, in
// microseconds (wait <= interval).
struct Timing {
  uint64_t commit_id = 0;
  uint64_t commits = 1;
  uint64_t interval_us = 0;
  uint64_t wait_us = 0;
};
std::string encode_timing(const Timing& t);
std::optional<Timing> decode_timing(std::string_view payload);

// Relay frames (an agent carrying its host's workers over one connection).
// encode_relay(): a whole RELAY frame around `inner` (a whole frame).
std::string encode_relay(uint64_t job_hash, uint32_t stream, std::string_view inner);
std::string encode_relay_closed(uint64_t job_hash, uint32_t stream);
struct RelayedFrame {
  uint32_t stream = 0;
  Header header;             // the inner frame's, checked
  std::string_view payload;  // the inner frame's, a view into the RELAY payload
};
// Splits a RELAY payload; the reason it is malformed (short, an inner header
// that check_header() refuses with `max_inner_payload`, or an inner length
// that does not fill the payload exactly), or nullopt with `out` set.
std::optional<std::string> decode_relay(std::string_view payload, uint64_t expected_job_hash,
                                        size_t max_inner_payload, RelayedFrame* out);
std::optional<uint32_t> decode_relay_closed(std::string_view payload);

// The handshake's proofs (common/handshake.h) under the rendezvous' labels:
// the client's HMAC(secret, "erun-client-v1" || server nonce || str(job_id) ||
// client nonce), the server's with "erun-server-v1" and the nonces swapped.
handshake::Proofs proofs(std::string_view secret, std::string_view job_id);
// The same two, one shot (tools and tests).
std::string client_proof(std::string_view secret, std::string_view server_nonce,
                         std::string_view job_id, std::string_view client_nonce);
std::string server_proof(std::string_view secret, std::string_view client_nonce,
                         std::string_view job_id, std::string_view server_nonce);

// Writes all of data to a non-blocking socket before the deadline.
Status send_all(int fd, std::string_view data, TimePoint deadline);

struct Frame {
  Header header;
  std::string payload;
};
// Reads one frame with a checked header before the deadline.
Result<Frame> recv_frame(int fd, uint64_t expected_job_hash, size_t max_payload,
                         TimePoint deadline);

}  // namespace erun::wire
