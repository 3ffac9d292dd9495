#include "agent/protocol.h"

#include <tuple>
#include <type_traits>
#include <utility>

#include <fmt/format.h>

namespace erun::agent {

namespace {

// Every type byte names one message.
template <size_t... I>
constexpr bool types_unique(std::index_sequence<I...>) {
  constexpr uint8_t types[] = {std::variant_alternative_t<I, Message>::kType...};
  for (size_t i = 0; i < sizeof...(I); ++i) {
    for (size_t j = i + 1; j < sizeof...(I); ++j) {
      if (types[i] == types[j]) return false;
    }
  }
  return true;
}
static_assert(types_unique(std::make_index_sequence<std::variant_size_v<Message>>{}),
              "two agent messages share a type byte");

// A struct that lists its fields (a message, WorkerReport).
template <class T>
concept HasFields = requires(T t) { t.fields(); };

class Writer {
 public:
  void u8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  void u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  void i32(int32_t v) { u32(static_cast<uint32_t>(v)); }
  void i64(int64_t v) { u64(static_cast<uint64_t>(v)); }
  void str(std::string_view s) {
    u32(static_cast<uint32_t>(s.size()));
    out_.append(s);
  }
  // One field of a message, by its type.
  void put(bool v) { u8(v ? 1 : 0); }
  void put(uint8_t v) { u8(v); }
  void put(uint32_t v) { u32(v); }
  void put(uint64_t v) { u64(v); }
  void put(int32_t v) { i32(v); }
  void put(int64_t v) { i64(v); }
  void put(const std::string& v) { str(v); }
  template <class A, class B>
  void put(const std::pair<A, B>& v) {
    put(v.first);
    put(v.second);
  }
  template <class T>
  void put(const std::vector<T>& v) {
    u32(static_cast<uint32_t>(v.size()));
    for (auto& x : v) put(x);
  }
  template <HasFields T>
  void put(const T& v) {
    std::apply([this](auto&... f) { (put(f), ...); }, const_cast<T&>(v).fields());
  }
  std::string& bytes() { return out_; }

 private:
  std::string out_;
};

// Reads fields from a body; the first short read sets failed and every later
// read returns zero values, so a decoder checks once at the end.
// The fewest bytes an encoded T takes (a list's count is bounded by it).
template <class T>
constexpr size_t min_bytes() {
  if constexpr (std::is_same_v<T, std::string>) {
    return 4;
  } else if constexpr (requires { typename T::first_type; }) {
    return min_bytes<typename T::first_type>() + min_bytes<typename T::second_type>();
  } else if constexpr (std::is_integral_v<T>) {
    return sizeof(T);
  } else {
    return 1;
  }
}

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  uint8_t u8() {
    if (!need(1)) return 0;
    return static_cast<uint8_t>(in_[at_++]);
  }
  uint32_t u32() {
    if (!need(4)) return 0;
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(in_[at_++])) << (8 * i);
    return v;
  }
  uint64_t u64() {
    if (!need(8)) return 0;
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(in_[at_++])) << (8 * i);
    return v;
  }
  int32_t i32() { return static_cast<int32_t>(u32()); }
  int64_t i64() { return static_cast<int64_t>(u64()); }
  std::string str() {
    uint32_t n = u32();
    if (!need(n)) return {};
    std::string s(in_.substr(at_, n));
    at_ += n;
    return s;
  }
  // A list count, bounded by what is left (each item takes at least min_item bytes).
  uint32_t count(size_t min_item) {
    uint32_t n = u32();
    if (!failed_ && n > (in_.size() - at_) / min_item) failed_ = true;
    return failed_ ? 0 : n;
  }
  // One field of a message, by its type.
  void get(bool& v) { v = u8() != 0; }
  void get(uint8_t& v) { v = u8(); }
  void get(uint32_t& v) { v = u32(); }
  void get(uint64_t& v) { v = u64(); }
  void get(int32_t& v) { v = i32(); }
  void get(int64_t& v) { v = i64(); }
  void get(std::string& v) { v = str(); }
  template <class A, class B>
  void get(std::pair<A, B>& v) {
    get(v.first);
    get(v.second);
  }
  template <class T>
  void get(std::vector<T>& v) {
    uint32_t n = count(min_bytes<T>());
    for (uint32_t i = 0; i < n && !failed_; ++i) get(v.emplace_back());
  }
  template <HasFields T>
  void get(T& v) {
    std::apply([this](auto&... f) { (get(f), ...); }, v.fields());
  }
  bool failed() const { return failed_; }
  bool at_end() const { return at_ == in_.size(); }

 private:
  bool need(size_t n) {
    if (failed_ || in_.size() - at_ < n) {
      failed_ = true;
      return false;
    }
    return true;
  }
  std::string_view in_;
  size_t at_ = 0;
  bool failed_ = false;
};

// The message whose type byte is `type` (known), its fields read from `r`.
template <size_t... I>
Message decode_payload(uint8_t type, Reader& r, std::index_sequence<I...>) {
  Message m;
  auto try_one = [&]<size_t K>(std::integral_constant<size_t, K>) {
    using M = std::variant_alternative_t<K, Message>;
    if (M::kType != type) return false;
    M one;
    r.get(one);
    m = std::move(one);
    return true;
  };
  (try_one(std::integral_constant<size_t, I>{}) || ...);
  return m;
}

template <size_t... I>
bool known_type(uint8_t type, std::index_sequence<I...>) {
  return ((std::variant_alternative_t<I, Message>::kType == type) || ...);
}

constexpr auto kAll = std::make_index_sequence<std::variant_size_v<Message>>{};

// What a well-formed message may not hold although its frame parsed: "" or
// why not.
std::string check_bounds(const Message& m) {
  auto* e = std::get_if<Exited>(&m);
  if (!e) return {};
  if (e->stderr_tail.size() > kExitTailLines) {
    return fmt::format("{} stderr lines (at most {})", e->stderr_tail.size(), kExitTailLines);
  }
  size_t total = 0;
  for (auto& l : e->stderr_tail) {
    if (l.size() > kExitTailLineMax) {
      return fmt::format("a stderr line of {} bytes (at most {})", l.size(), kExitTailLineMax);
    }
    total += l.size();
  }
  if (total > kExitTailBytes) return fmt::format("stderr lines of {} bytes in all (at most {})", total, kExitTailBytes);
  return {};
}

// The longest prefix of `s` of at most `n` bytes that does not end inside a
// UTF-8 sequence.
std::string_view utf8_prefix(std::string_view s, size_t n) {
  if (s.size() <= n) return s;
  size_t end = n;  // s[end] is the first byte left out
  auto continuation = [&](size_t i) { return (static_cast<uint8_t>(s[i]) & 0xC0) == 0x80; };
  for (int i = 0; i < 3 && end > 0 && continuation(end); ++i) --end;
  if (continuation(end)) end = n;  // not UTF-8: cut between bytes
  return s.substr(0, end);
}

}  // namespace

void LineTail::feed(std::string_view bytes) {
  while (!bytes.empty()) {
    size_t nl = bytes.find('\n');
    std::string_view piece = bytes.substr(0, nl);
    started_ = true;
    if (!cut_) {
      size_t room = kExitTailLineMax - partial_.size();
      if (piece.size() > room) {
        cut_ = true;
        partial_.append(piece.substr(0, room));
      } else {
        partial_.append(piece);
      }
    }
    if (nl == std::string_view::npos) return;
    finish();
    bytes.remove_prefix(nl + 1);
  }
}

void LineTail::finish() {
  if (!started_) return;
  std::string line = std::move(partial_);
  if (cut_) line = std::string(utf8_prefix(line, kExitTailLineMax - 3)) + "...";
  partial_.clear();
  cut_ = false;
  started_ = false;
  push(std::move(line));
}

void LineTail::push(std::string line) {
  bytes_ += line.size();
  lines_.push_back(std::move(line));
  size_t drop = 0;
  while (lines_.size() - drop > kExitTailLines || bytes_ > kExitTailBytes) bytes_ -= lines_[drop++].size();
  lines_.erase(lines_.begin(), lines_.begin() + static_cast<long>(drop));
}

std::string encode(const Message& message) {
  Writer w;
  w.u32(0);  // length, filled in below
  std::visit(
      [&w](const auto& m) {
        w.u8(std::decay_t<decltype(m)>::kType);
        w.put(m);
      },
      message);
  std::string& out = w.bytes();
  uint32_t length = static_cast<uint32_t>(out.size() - 4);
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  return std::move(out);
}

const char* message_name(const Message& message) {
  return std::visit([](const auto& m) { return std::decay_t<decltype(m)>::kName; }, message);
}

Result<Message> decode(std::string_view body) {
  if (body.empty()) return Result<Message>::error("agent protocol: empty frame (no message type)");
  uint8_t type = static_cast<uint8_t>(body[0]);
  if (!known_type(type, kAll)) {
    return Result<Message>::error(fmt::format(
        "agent protocol: unknown message type {} (driver and agent from different erun versions? "
        "install the same erun on every host or pass --agent-path)",
        type));
  }
  Reader r(body.substr(1));
  Message m = decode_payload(type, r, kAll);
  if (r.failed() && type == Hello::kType) {
    // An agent of version 4 or older: its HELLO ends after the pid. Read so
    // far, it names its version, which the driver then refuses in words.
    Reader old(body.substr(1));
    Hello h;
    h.version = old.u32();
    h.host = old.str();
    h.pid = old.i64();
    if (!old.failed() && old.at_end()) return Message(std::move(h));
  }
  if (r.failed()) {
    return Result<Message>::error(
        fmt::format("agent protocol: {} frame of {} bytes is cut short", message_name(m), body.size()));
  }
  if (!r.at_end()) {
    return Result<Message>::error(
        fmt::format("agent protocol: {} frame of {} bytes has bytes left over", message_name(m), body.size()));
  }
  if (std::string why = check_bounds(m); !why.empty()) {
    return Result<Message>::error(fmt::format("agent protocol: {} frame carries {}", message_name(m), why));
  }
  return m;
}

std::optional<Ended> FrameReader::trailing_ended() const {
  std::string_view left(buffer_.data() + consumed_, buffer_.size() - consumed_);
  for (uint8_t oom : {uint8_t{0}, uint8_t{1}}) {
    const std::string frame = encode(Ended{oom});
    if (left.size() >= frame.size() && left.substr(left.size() - frame.size()) == frame) return Ended{oom};
  }
  return std::nullopt;
}

Result<std::optional<Message>> FrameReader::next() {
  using R = Result<std::optional<Message>>;
  size_t available = buffer_.size() - consumed_;
  if (available < 4) return R(std::optional<Message>());
  const char* p = buffer_.data() + consumed_;
  uint32_t length = 0;
  for (int i = 0; i < 4; ++i) length |= static_cast<uint32_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  if (length == 0 || length > kMaxFrame - 4) {
    return R::error(fmt::format("agent protocol: frame length {} is outside 1..{} (not an erun agent stream?)",
                                length, kMaxFrame - 4));
  }
  if (available - 4 < length) return R(std::optional<Message>());
  auto m = decode(std::string_view(p + 4, length));
  consumed_ += 4 + length;
  // Compact once the consumed part dominates.
  if (consumed_ > 64 * 1024 && consumed_ * 2 > buffer_.size()) {
    buffer_.erase(0, consumed_);
    consumed_ = 0;
  }
  if (!m) return R(m.status());
  return R(std::optional<Message>(std::move(m).value()));
}

}  // namespace erun::agent
