// The little-endian byte codec both of erun's wire formats use (the
// rendezvous' frames, the tcp transport's handshake) and the GPU plan
// exchange: fixed-width integers, u32-length-prefixed strings, raw bytes.
// Pure functions and value types: safe from any thread. A reader never reads
// past its input: an underflow marks it failed and yields zeros.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace erun {

// The low n bytes of v, least significant first.
inline void put_le(char* out, uint64_t v, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

inline uint64_t get_le(const char* in, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(in[i])) << (8 * i);
  return v;
}

class PayloadWriter {
 public:
  PayloadWriter& u8(uint8_t v) { return raw(&v, 1); }
  PayloadWriter& u32(uint32_t v);
  PayloadWriter& u64(uint64_t v);
  PayloadWriter& i32(int32_t v) { return u32(static_cast<uint32_t>(v)); }
  PayloadWriter& i64(int64_t v) { return u64(static_cast<uint64_t>(v)); }
  PayloadWriter& bytes(std::string_view s);  // u32 length + bytes
  PayloadWriter& fixed(std::string_view s) { return raw(s.data(), s.size()); }
  const std::string& str() const { return buf_; }

 private:
  PayloadWriter& raw(const void* p, size_t n);
  std::string buf_;
};

// Reads a payload; any underflow sets failed() and returns zeros.
class PayloadReader {
 public:
  explicit PayloadReader(std::string_view p) : p_(p) {}
  uint8_t u8();
  uint32_t u32();
  uint64_t u64();
  int32_t i32() { return static_cast<int32_t>(u32()); }
  int64_t i64() { return static_cast<int64_t>(u64()); }
  std::string bytes();
  std::string fixed(size_t n);
  // True when everything was read and nothing is left over.
  bool done() const { return !failed_ && pos_ == p_.size(); }
  bool failed() const { return failed_; }

 private:
  bool take(size_t n);
  std::string_view p_;
  size_t pos_ = 0;
  bool failed_ = false;
};

}  // namespace erun
