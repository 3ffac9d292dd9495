// The mutual HMAC challenge-response both of erun's handshakes run (the
// rendezvous', docs/protocol.md "Handshake", and the tcp pairs', "Worker-to-
// worker pairs"): each side draws a fresh nonce and proves the job secret
// over both nonces; framing stays with each protocol. Key and Proofs are
// immutable after construction and safe from any thread; an Initiator or
// Responder belongs to one connection. A failed check is a false, never a throw.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace erun::handshake {

inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kMacBytes = 32;  // a proof: HMAC-SHA256

// Crypto (OpenSSL).
std::string random_bytes(size_t n);
std::string sha256(std::string_view data);
std::string hmac_sha256(std::string_view key, std::string_view data);
// Compares in time independent of where the bytes differ.
bool equal_ct(std::string_view a, std::string_view b);
// First 8 bytes of SHA-256(job_id), little-endian: how both handshakes name the job.
uint64_t job_hash(std::string_view job_id);

// HMAC-SHA256 under one key (the job secret), with the key's padded blocks
// hashed once: a server that authenticates 100,000 connections pays two
// SHA-256 runs per proof, not an algorithm lookup and a key setup each time.
// mac() equals hmac_sha256(key, message).
class Key {
 public:
  explicit Key(std::string_view secret);
  ~Key();
  Key(const Key&) = delete;
  Key& operator=(const Key&) = delete;
  std::string mac(std::string_view message) const;

 private:
  struct Pads;
  std::unique_ptr<Pads> pads_;
};

// What one protocol's two proofs cover. Each is HMAC(secret, label || ...):
// kPeerNonceFirst: label || the other side's nonce || binding || own nonce (the rendezvous);
// kNoncesLast:     label || binding || initiator's nonce || responder's nonce (tcp pairs).
// Distinct labels stop a proof from being reflected back as the other side's.
struct Scheme {
  enum class Layout { kPeerNonceFirst, kNoncesLast };
  std::string_view initiator_label;
  std::string_view responder_label;
  Layout layout;
};

// The two proofs of one scheme under one key and binding (the job id, and
// for a pair the generation and both ranks, as the protocol encodes them).
class Proofs {
 public:
  Proofs(std::shared_ptr<const Key> key, Scheme scheme, std::string binding);
  std::string initiator(std::string_view initiator_nonce, std::string_view responder_nonce) const;
  std::string responder(std::string_view initiator_nonce, std::string_view responder_nonce) const;

 private:
  std::string mac(std::string_view label, std::string_view first, std::string_view second) const;
  std::shared_ptr<const Key> key_;
  Scheme scheme_;
  std::string binding_;
};

// Server nonces drawn from the CSPRNG many at a time (one RAND_bytes call
// costs about as much as the HMACs of a handshake). One owner thread.
class NoncePool {
 public:
  explicit NoncePool(size_t per_draw = 128) : per_draw_(per_draw) {}
  std::string next();

 private:
  size_t per_draw_;
  std::string pool_;
  size_t off_ = 0;
};

// The side that opens the connection (a rendezvous client, the relay's
// upstream, a tcp connector): sends nonce(), takes the responder's nonce,
// proves, and checks the responder's proof.
class Initiator {
 public:
  Initiator() : nonce_(random_bytes(kNonceBytes)) {}
  const std::string& nonce() const { return nonce_; }
  // The responder's challenge nonce; false (keep nothing) when it is malformed.
  bool challenged(std::string_view responder_nonce);
  std::string proof(const Proofs& p) const { return p.initiator(nonce_, peer_); }
  bool verify(const Proofs& p, std::string_view responder_proof) const;

 private:
  std::string nonce_, peer_;
};

// The side that accepts (the rendezvous server, the relay for its workers, a
// tcp acceptor): takes the initiator's nonce, answers with challenge(),
// checks the initiator's proof and proves in turn.
class Responder {
 public:
  // The initiator's nonce; false (keep nothing) when it is malformed. The
  // challenge comes from `pool`, or fresh from the CSPRNG without one.
  bool hello(std::string_view initiator_nonce, NoncePool* pool = nullptr);
  const std::string& challenge() const { return nonce_; }
  bool verify(const Proofs& p, std::string_view initiator_proof) const;
  std::string proof(const Proofs& p) const { return p.responder(peer_, nonce_); }

 private:
  std::string peer_, nonce_;
};

}  // namespace erun::handshake
