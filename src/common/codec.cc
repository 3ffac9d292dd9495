#include "common/codec.h"

#include <cstdint>

#include "common/check.h"

namespace erun {

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

}  // namespace erun
