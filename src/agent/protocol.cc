#include "agent/protocol.h"

#include <fmt/format.h>

namespace erun::agent {

namespace {

// Type byte of each Message alternative, in variant order.
constexpr uint8_t kTypes[] = {1, 2, 3, 4, 5, 6, 16, 17, 18, 19, 20, 7, 21, 22, 23};
constexpr const char* kNames[] = {"HELLO", "STARTED",  "START_FAILED", "OUTPUT",    "EXITED",
                                  "HEARTBEAT", "START", "SIGNAL",      "TERMINATE", "KILL",
                                  "SHUTDOWN", "KEEPING", "KEEP",       "REPLICATE", "UNKEEP"};
static_assert(std::size(kTypes) == std::variant_size_v<Message>);

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
  std::string& bytes() { return out_; }

 private:
  std::string out_;
};

// Reads fields from a body; the first short read sets failed and every later
// read returns zero values, so a decoder checks once at the end.
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

struct Encoder {
  Writer& w;
  void operator()(const Hello& m) {
    w.u32(m.version);
    w.str(m.host);
    w.i64(m.pid);
  }
  void operator()(const Started& m) {
    w.u64(m.id);
    w.i64(m.pid);
  }
  void operator()(const StartFailed& m) {
    w.u64(m.id);
    w.str(m.why);
  }
  void operator()(const Output& m) {
    w.u64(m.id);
    w.u8(m.stream);
    w.str(m.data);
  }
  void operator()(const Exited& m) {
    w.u64(m.id);
    w.i32(m.code);
    w.i32(m.signal);
    w.u32(static_cast<uint32_t>(m.stderr_tail.size()));
    for (auto& l : m.stderr_tail) w.str(l);
  }
  void operator()(const Heartbeat&) {}
  void operator()(const Start& m) {
    w.u64(m.id);
    w.i64(m.generation);
    w.i32(m.rank);
    w.i32(m.slot);
    w.u32(static_cast<uint32_t>(m.argv.size()));
    for (auto& a : m.argv) w.str(a);
    w.u32(static_cast<uint32_t>(m.env.size()));
    for (auto& [k, v] : m.env) {
      w.str(k);
      w.str(v);
    }
    w.str(m.cwd);
    w.u64(m.term_grace_ms);
    w.str(m.output_dir);
  }
  void operator()(const Signal& m) {
    w.u64(m.id);
    w.i32(m.sig);
  }
  void operator()(const Terminate& m) { w.u64(m.id); }
  void operator()(const Kill& m) { w.u64(m.id); }
  void operator()(const Shutdown&) {}
  void operator()(const Keeping& m) {
    w.u32(m.port);
    w.str(m.why);
  }
  void operator()(const Keep& m) { w.str(m.commit_dir); }
  void operator()(const Replicate& m) {
    w.str(m.host);
    w.u32(m.port);
    w.str(m.keeper_dir);
  }
  void operator()(const Unkeep& m) { w.u8(m.forget ? 1 : 0); }
};

Message decode_payload(uint8_t type, Reader& r) {
  switch (type) {
    case 1: {
      Hello m;
      m.version = r.u32();
      m.host = r.str();
      m.pid = r.i64();
      return m;
    }
    case 2: {
      Started m;
      m.id = r.u64();
      m.pid = r.i64();
      return m;
    }
    case 3: {
      StartFailed m;
      m.id = r.u64();
      m.why = r.str();
      return m;
    }
    case 4: {
      Output m;
      m.id = r.u64();
      m.stream = r.u8();
      m.data = r.str();
      return m;
    }
    case 5: {
      Exited m;
      m.id = r.u64();
      m.code = r.i32();
      m.signal = r.i32();
      uint32_t n = r.count(4);
      for (uint32_t i = 0; i < n; ++i) m.stderr_tail.push_back(r.str());
      return m;
    }
    case 6:
      return Heartbeat{};
    case 16: {
      Start m;
      m.id = r.u64();
      m.generation = r.i64();
      m.rank = r.i32();
      m.slot = r.i32();
      uint32_t n = r.count(4);
      for (uint32_t i = 0; i < n; ++i) m.argv.push_back(r.str());
      n = r.count(8);
      for (uint32_t i = 0; i < n; ++i) {
        std::string k = r.str();
        m.env.emplace_back(std::move(k), r.str());
      }
      m.cwd = r.str();
      m.term_grace_ms = r.u64();
      m.output_dir = r.str();
      return m;
    }
    case 17: {
      Signal m;
      m.id = r.u64();
      m.sig = r.i32();
      return m;
    }
    case 18:
      return Terminate{r.u64()};
    case 19:
      return Kill{r.u64()};
    case 7: {
      Keeping m;
      m.port = r.u32();
      m.why = r.str();
      return m;
    }
    case 21:
      return Keep{r.str()};
    case 22: {
      Replicate m;
      m.host = r.str();
      m.port = r.u32();
      m.keeper_dir = r.str();
      return m;
    }
    case 23:
      return Unkeep{r.u8() != 0};
    default:  // 20, checked by the caller
      return Shutdown{};
  }
}

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
  w.u8(kTypes[message.index()]);
  std::visit(Encoder{w}, message);
  std::string& out = w.bytes();
  uint32_t length = static_cast<uint32_t>(out.size() - 4);
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  return std::move(out);
}

const char* message_name(const Message& message) { return kNames[message.index()]; }

Result<Message> decode(std::string_view body) {
  if (body.empty()) return Result<Message>::error("agent protocol: empty frame (no message type)");
  uint8_t type = static_cast<uint8_t>(body[0]);
  bool known = false;
  for (uint8_t t : kTypes) known = known || t == type;
  if (!known) {
    return Result<Message>::error(fmt::format(
        "agent protocol: unknown message type {} (driver and agent from different erun versions? "
        "install the same erun on every host or pass --agent-path)",
        type));
  }
  Reader r(body.substr(1));
  Message m = decode_payload(type, r);
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
