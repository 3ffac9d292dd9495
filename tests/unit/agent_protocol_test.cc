// The agent protocol's codec: every message survives a round trip, a stream
// split at any byte is reassembled, and malformed frames (too long, empty,
// unknown type, cut short, bytes left over, impossible list counts) are clear
// errors rather than crashes or huge allocations.
#include <gtest/gtest.h>

#include "agent/protocol.h"

namespace erun::agent {
namespace {

std::string le32(uint32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

Message one(const std::string& bytes) {
  FrameReader r;
  r.feed(bytes);
  auto m = r.next();
  EXPECT_TRUE(m.is_ok()) << m.message();
  EXPECT_TRUE(m.is_ok() && m->has_value());
  return m.is_ok() && m->has_value() ? **m : Message(Heartbeat{});
}

std::string error_of(const std::string& bytes) {
  FrameReader r;
  r.feed(bytes);
  auto m = r.next();
  EXPECT_FALSE(m.is_ok());
  return m.message();
}

TEST(AgentProtocol, StartRoundTripsWithEveryField) {
  Start s;
  s.id = 0x1122334455667788ull;
  s.generation = 42;
  s.rank = 7;
  s.slot = 3;
  s.argv = {"python3", "train.py", "", std::string("a\0b", 3)};
  s.env = {{"FOO", "bar baz"}, {"EMPTY", ""}, {"NL", "x\ny"}};
  s.cwd = "/tmp/w d";
  s.term_grace_ms = 1500;
  auto m = one(encode(s));
  auto* got = std::get_if<Start>(&m);
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(got->id, s.id);
  EXPECT_EQ(got->generation, 42);
  EXPECT_EQ(got->rank, 7);
  EXPECT_EQ(got->slot, 3);
  EXPECT_EQ(got->argv, s.argv);
  EXPECT_EQ(got->env, s.env);
  EXPECT_EQ(got->cwd, s.cwd);
  EXPECT_EQ(got->term_grace_ms, 1500u);
}

TEST(AgentProtocol, AgentMessagesRoundTrip) {
  auto hello = one(encode(Hello{kProtocolVersion, "node7", 1234}));
  ASSERT_TRUE(std::holds_alternative<Hello>(hello));
  EXPECT_EQ(std::get<Hello>(hello).host, "node7");
  EXPECT_EQ(std::get<Hello>(hello).pid, 1234);
  auto out = one(encode(Output{9, 2, "line one\nline two\n"}));
  ASSERT_TRUE(std::holds_alternative<Output>(out));
  EXPECT_EQ(std::get<Output>(out).stream, 2);
  EXPECT_EQ(std::get<Output>(out).data, "line one\nline two\n");
  auto ex = one(encode(Exited{9, 0, 15}));
  ASSERT_TRUE(std::holds_alternative<Exited>(ex));
  EXPECT_EQ(std::get<Exited>(ex).signal, 15);
  auto sig = one(encode(Signal{5, -3}));
  EXPECT_EQ(std::get<Signal>(sig).sig, -3);
  EXPECT_TRUE(std::holds_alternative<Heartbeat>(one(encode(Heartbeat{}))));
  EXPECT_TRUE(std::holds_alternative<Shutdown>(one(encode(Shutdown{}))));
  EXPECT_EQ(std::get<Kill>(one(encode(Kill{77}))).id, 77u);
  EXPECT_EQ(std::get<Terminate>(one(encode(Terminate{78}))).id, 78u);
  EXPECT_EQ(std::get<StartFailed>(one(encode(StartFailed{3, "fork: no"}))).why, "fork: no");
  EXPECT_EQ(std::get<Started>(one(encode(Started{3, 99}))).pid, 99);
}

TEST(AgentProtocol, StreamSplitAtEveryByteIsReassembled) {
  std::string stream = encode(Hello{kProtocolVersion, "h", 1}) + encode(Output{1, 1, "abc\n"}) +
                       encode(Exited{1, 3, 0});
  FrameReader r;
  std::vector<Message> got;
  for (char c : stream) {
    r.feed(std::string_view(&c, 1));
    while (true) {
      auto m = r.next();
      ASSERT_TRUE(m.is_ok()) << m.message();
      if (!m->has_value()) break;
      got.push_back(**m);
    }
  }
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(std::get<Exited>(got[2]).code, 3);
  EXPECT_EQ(r.buffered(), 0u);
}

TEST(AgentProtocol, LengthOutOfBoundsIsAnError) {
  EXPECT_NE(error_of(le32(0)).find("frame length 0"), std::string::npos);
  EXPECT_NE(error_of(le32(kMaxFrame)).find("outside"), std::string::npos);
  // Text where a frame should be (a shell's greeting, a wrong binary).
  EXPECT_NE(error_of("Welcome to node7\n").find("not an erun agent stream"), std::string::npos);
}

TEST(AgentProtocol, UnknownTypeNamesTheVersionProblem) {
  std::string frame = le32(1) + std::string(1, '\x7f');
  EXPECT_NE(error_of(frame).find("unknown message type 127"), std::string::npos);
}

TEST(AgentProtocol, CutShortAndLeftOverAreErrors) {
  std::string good = encode(Exited{1, 2, 0});
  std::string body = good.substr(4);
  std::string shorter = le32(static_cast<uint32_t>(body.size() - 1)) + body.substr(0, body.size() - 1);
  EXPECT_NE(error_of(shorter).find("cut short"), std::string::npos);
  std::string longer = le32(static_cast<uint32_t>(body.size() + 1)) + body + "x";
  EXPECT_NE(error_of(longer).find("left over"), std::string::npos);
}

TEST(AgentProtocol, HugeCountsAndStringLengthsAreRejectedWithoutAllocating) {
  // START whose argv count claims 2^32-1 items in a 40-byte frame.
  std::string body(1, '\x10');
  body += std::string(8 + 8 + 4 + 4, '\0');  // id, generation, rank, slot
  body += le32(0xffffffffu);
  EXPECT_NE(error_of(le32(static_cast<uint32_t>(body.size())) + body).find("cut short"), std::string::npos);
  // OUTPUT whose data length is beyond the frame.
  std::string out(1, '\x04');
  out += std::string(8, '\0') + std::string(1, '\x01') + le32(1u << 30);
  EXPECT_NE(error_of(le32(static_cast<uint32_t>(out.size())) + out).find("cut short"), std::string::npos);
}

TEST(AgentProtocol, AnEmptyStreamWantsMoreBytes) {
  FrameReader r;
  auto m = r.next();
  ASSERT_TRUE(m.is_ok());
  EXPECT_FALSE(m->has_value());
  r.feed(encode(Heartbeat{}).substr(0, 3));
  m = r.next();
  ASSERT_TRUE(m.is_ok());
  EXPECT_FALSE(m->has_value());
}

}  // namespace
}  // namespace erun::agent
