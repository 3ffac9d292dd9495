#include "common/handshake.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "common/check.h"
#include "common/codec.h"

namespace erun::handshake {

std::string random_bytes(size_t n) {
  std::string out(n, '\0');
  ERUN_CHECK(RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)) == 1);
  return out;
}

std::string sha256(std::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  ERUN_CHECK(EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr) == 1);
  return std::string(reinterpret_cast<char*>(md), len);
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

uint64_t job_hash(std::string_view job_id) { return get_le(sha256(job_id).data(), 8); }

// HMAC (RFC 2104) over SHA-256: H((K ^ opad) || H((K ^ ipad) || m)), with the
// two padded key blocks absorbed once into digest states that each MAC copies.
struct Key::Pads {
  EVP_MD_CTX* inner = nullptr;
  EVP_MD_CTX* outer = nullptr;
  ~Pads() {
    EVP_MD_CTX_free(inner);
    EVP_MD_CTX_free(outer);
  }
};

namespace {
constexpr size_t kShaBlock = 64;

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

Key::Key(std::string_view secret) : pads_(std::make_unique<Pads>()) {
  std::string key = secret.size() > kShaBlock ? sha256(secret) : std::string(secret);
  pads_->inner = padded_state(key, 0x36);
  pads_->outer = padded_state(key, 0x5c);
}

Key::~Key() = default;

std::string Key::mac(std::string_view message) const {
  unsigned char inner[EVP_MAX_MD_SIZE], out[EVP_MAX_MD_SIZE];
  unsigned int inner_len = 0, out_len = 0;
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  ERUN_CHECK(ctx != nullptr && EVP_MD_CTX_copy_ex(ctx, pads_->inner) == 1 &&
             EVP_DigestUpdate(ctx, message.data(), message.size()) == 1 &&
             EVP_DigestFinal_ex(ctx, inner, &inner_len) == 1 && EVP_MD_CTX_copy_ex(ctx, pads_->outer) == 1 &&
             EVP_DigestUpdate(ctx, inner, inner_len) == 1 && EVP_DigestFinal_ex(ctx, out, &out_len) == 1);
  EVP_MD_CTX_free(ctx);
  return std::string(reinterpret_cast<char*>(out), out_len);
}

Proofs::Proofs(std::shared_ptr<const Key> key, Scheme scheme, std::string binding)
    : key_(std::move(key)), scheme_(scheme), binding_(std::move(binding)) {
  ERUN_CHECK(key_ != nullptr);
}

std::string Proofs::mac(std::string_view label, std::string_view first, std::string_view second) const {
  std::string m;
  m.reserve(label.size() + first.size() + binding_.size() + second.size());
  m.append(label);
  if (scheme_.layout == Scheme::Layout::kPeerNonceFirst) {
    m.append(first).append(binding_);
  } else {
    m.append(binding_).append(first);
  }
  m.append(second);
  return key_->mac(m);
}

std::string Proofs::initiator(std::string_view initiator_nonce, std::string_view responder_nonce) const {
  if (scheme_.layout == Scheme::Layout::kPeerNonceFirst) {
    return mac(scheme_.initiator_label, responder_nonce, initiator_nonce);
  }
  return mac(scheme_.initiator_label, initiator_nonce, responder_nonce);
}

std::string Proofs::responder(std::string_view initiator_nonce, std::string_view responder_nonce) const {
  return mac(scheme_.responder_label, initiator_nonce, responder_nonce);
}

std::string NoncePool::next() {
  if (off_ == pool_.size()) {
    pool_ = random_bytes(kNonceBytes * per_draw_);
    off_ = 0;
  }
  std::string n = pool_.substr(off_, kNonceBytes);
  off_ += kNonceBytes;
  return n;
}

bool Initiator::challenged(std::string_view responder_nonce) {
  if (responder_nonce.size() != kNonceBytes) return false;
  peer_.assign(responder_nonce);
  return true;
}

bool Initiator::verify(const Proofs& p, std::string_view responder_proof) const {
  return !peer_.empty() && equal_ct(responder_proof, p.responder(nonce_, peer_));
}

bool Responder::hello(std::string_view initiator_nonce, NoncePool* pool) {
  if (initiator_nonce.size() != kNonceBytes) return false;
  peer_.assign(initiator_nonce);
  nonce_ = pool ? pool->next() : random_bytes(kNonceBytes);
  return true;
}

bool Responder::verify(const Proofs& p, std::string_view initiator_proof) const {
  return !peer_.empty() && equal_ct(initiator_proof, p.initiator(peer_, nonce_));
}

}  // namespace erun::handshake
