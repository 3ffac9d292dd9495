// The agent protocol's codec: every message survives a round trip, a stream
// split at any byte is reassembled, and malformed frames (too long, empty,
// unknown type, cut short, bytes left over, impossible list counts) are clear
// errors rather than crashes or huge allocations. EXITED's stderr lines keep
// their bounds on both sides: LineTail builds them from a byte stream, the
// decoder refuses a frame past them.
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
  auto keeping = std::get<Keeping>(one(encode(Keeping{40123, ""})));
  EXPECT_EQ(keeping.port, 40123u);
  EXPECT_EQ(std::get<Keeping>(one(encode(Keeping{0, "cannot listen"}))).why, "cannot listen");
  EXPECT_EQ(std::get<Keep>(one(encode(Keep{"/dev/shm/erun-commits-x-h"}))).commit_dir, "/dev/shm/erun-commits-x-h");
  auto rep = std::get<Replicate>(one(encode(Replicate{"node8", 40123, "/dev/shm/erun-commits-x-node8"})));
  EXPECT_EQ(rep.host, "node8");
  EXPECT_EQ(rep.port, 40123u);
  EXPECT_EQ(rep.keeper_dir, "/dev/shm/erun-commits-x-node8");
  EXPECT_STREQ(message_name(Replicate{}), "REPLICATE");
  EXPECT_STREQ(message_name(Keeping{}), "KEEPING");
  EXPECT_TRUE(std::get<Unkeep>(one(encode(Unkeep{true}))).forget);
  EXPECT_FALSE(std::get<Unkeep>(one(encode(Unkeep{false}))).forget);
  EXPECT_STREQ(message_name(Unkeep{}), "UNKEEP");
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

TEST(AgentProtocol, ExitedCarriesItsStderrLines) {
  Exited e{9, 3, 0, {"Traceback (most recent call last):", "", std::string("a\0b", 3), "caf\xc3\xa9 partial"}};
  auto m = one(encode(e));
  auto* got = std::get_if<Exited>(&m);
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(got->id, 9u);
  EXPECT_EQ(got->code, 3);
  EXPECT_EQ(got->stderr_tail, e.stderr_tail);
  // At the bounds exactly: accepted.
  Exited full{1, 1, 0, std::vector<std::string>(kExitTailBytes / kExitTailLineMax, std::string(kExitTailLineMax, 'x'))};
  EXPECT_EQ(std::get<Exited>(one(encode(full))).stderr_tail, full.stderr_tail);
  Exited many{1, 1, 0, std::vector<std::string>(kExitTailLines, "short")};
  EXPECT_EQ(std::get<Exited>(one(encode(many))).stderr_tail.size(), kExitTailLines);
}

TEST(AgentProtocol, ExitedPastItsBoundsIsAnError) {
  Exited lines{1, 1, 0, std::vector<std::string>(kExitTailLines + 1, "x")};
  EXPECT_NE(error_of(encode(lines)).find("21 stderr lines (at most 20)"), std::string::npos);
  Exited wide{1, 1, 0, {std::string(kExitTailLineMax + 1, 'x')}};
  EXPECT_NE(error_of(encode(wide)).find("a stderr line of 513 bytes"), std::string::npos);
  const std::string longest(kExitTailLineMax, 'x');
  Exited heavy{1, 1, 0, std::vector<std::string>(kExitTailBytes / kExitTailLineMax + 1, longest)};
  EXPECT_NE(error_of(encode(heavy)).find("in all (at most 4096)"), std::string::npos);
}

TEST(AgentProtocol, ExitedCutAnywhereIsCutShort) {
  std::string body = encode(Exited{1, 2, 0, {"first", "second"}}).substr(4);
  for (size_t n = 1; n < body.size(); ++n) {
    EXPECT_NE(error_of(le32(static_cast<uint32_t>(n)) + body.substr(0, n)).find("EXITED frame of"), std::string::npos)
        << n;
  }
  // Version 1's EXITED (no list) from an old agent.
  std::string v1 = body.substr(0, 1 + 8 + 4 + 4);
  EXPECT_NE(error_of(le32(static_cast<uint32_t>(v1.size())) + v1).find("cut short"), std::string::npos);
}

std::vector<std::string> tail_of(std::string_view bytes, size_t piece) {
  LineTail t;
  for (size_t i = 0; i < bytes.size(); i += piece) t.feed(bytes.substr(i, piece));
  t.finish();
  return t.lines();
}

TEST(LineTail, KeepsTheLastLinesAndThePartialOneWhateverTheReads) {
  std::string stream;
  for (int i = 1; i <= 30; ++i) stream += "line " + std::to_string(i) + "\n";
  stream += "\nlast words";
  std::vector<std::string> want;
  for (int i = 13; i <= 30; ++i) want.push_back("line " + std::to_string(i));
  want.push_back("");
  want.push_back("last words");
  for (size_t piece : {size_t{1}, size_t{7}, stream.size()}) EXPECT_EQ(tail_of(stream, piece), want) << piece;
  EXPECT_EQ(tail_of("a\nb\n", 1), (std::vector<std::string>{"a", "b"}));  // no empty line after the last newline
  EXPECT_TRUE(tail_of("", 1).empty());
}

TEST(LineTail, CutsLongLinesAndDropsTheOldestPastTheByteBound) {
  // "é" is 2 bytes: a cut at 509 bytes would fall inside one.
  std::string accents;
  while (accents.size() < 2 * kExitTailLineMax) accents += "\xc3\xa9";
  auto t = tail_of(accents + "\nnext", 100);
  ASSERT_EQ(t.size(), 2u);
  EXPECT_LE(t[0].size(), kExitTailLineMax);
  EXPECT_EQ(t[0].substr(t[0].size() - 3), "...");
  EXPECT_EQ(t[0].substr(0, t[0].size() - 3), accents.substr(0, 508));  // 509 would split an "é"
  EXPECT_EQ(t[1], "next");

  std::string wide;
  for (int i = 0; i < 12; ++i) wide += std::string(400, static_cast<char>('a' + i)) + "\n";
  t = tail_of(wide, 4096);
  size_t total = 0;
  for (auto& l : t) total += l.size();
  EXPECT_LE(total, kExitTailBytes);
  ASSERT_EQ(t.size(), kExitTailBytes / 400);  // 10 of 400 bytes fit in 4096
  EXPECT_EQ(t.back(), std::string(400, 'l'));
  EXPECT_EQ(t.front(), std::string(400, 'c'));
  // What LineTail keeps always encodes into a valid EXITED.
  EXPECT_EQ(std::get<Exited>(one(encode(Exited{1, 1, 0, t}))).stderr_tail, t);
}

TEST(AgentProtocol, TakeoverMessagesRoundTrip) {
  auto hello = one(encode(Hello{kProtocolVersion, "n1", 77, "/tmp/erun-agent-x/attach"}));
  EXPECT_EQ(std::get<Hello>(hello).attach_path, "/tmp/erun-agent-x/attach");
  auto attach = std::get<Attach>(one(encode(Attach{9, "login2", 40123})));
  EXPECT_EQ(attach.term, 9u);
  EXPECT_EQ(attach.rdzv_host, "login2");
  EXPECT_EQ(attach.rdzv_port, 40123u);
  State st;
  st.term = 9;
  st.workers = {WorkerReport{41, 3, 1, 2, 5000, false}, WorkerReport{40, 2, 0, 0, 4999, true}};
  st.dropped_output = 12;
  auto back = std::get<State>(one(encode(st)));
  EXPECT_EQ(back.term, 9u);
  ASSERT_EQ(back.workers.size(), 2u);
  EXPECT_EQ(back.workers[0].id, 41u);
  EXPECT_EQ(back.workers[0].generation, 3);
  EXPECT_EQ(back.workers[0].rank, 1);
  EXPECT_EQ(back.workers[0].slot, 2);
  EXPECT_EQ(back.workers[0].pid, 5000);
  EXPECT_FALSE(back.workers[0].exited);
  EXPECT_TRUE(back.workers[1].exited);
  EXPECT_EQ(back.dropped_output, 12u);
  EXPECT_EQ(std::get<Superseded>(one(encode(Superseded{4}))).term, 4u);
  EXPECT_STREQ(message_name(Attach{}), "ATTACH");
  EXPECT_STREQ(message_name(State{}), "STATE");
  EXPECT_STREQ(message_name(Superseded{}), "SUPERSEDED");
}

TEST(AgentProtocol, DrainingRoundTrips) {
  EXPECT_EQ(std::get<Draining>(one(encode(Draining{"SIGTERM to the agent"}))).reason, "SIGTERM to the agent");
  EXPECT_EQ(std::get<Draining>(one(encode(Draining{}))).reason, "");
  EXPECT_STREQ(message_name(Draining{}), "DRAINING");
}

TEST(AgentProtocol, EndedIsFoundAtTheEndOfAStreamAFrameLeftHalfWritten) {
  EXPECT_EQ(std::get<Ended>(one(encode(Ended{1}))).oom_killed, 1);
  EXPECT_STREQ(message_name(Ended{}), "ENDED");
  // Whole frames, then ENDED: next() reads it; nothing is left to look at.
  FrameReader whole;
  whole.feed(encode(Heartbeat{}) + encode(Ended{1}));
  ASSERT_TRUE(whole.next().is_ok());
  auto m = whole.next();
  ASSERT_TRUE(m.is_ok() && m->has_value());
  EXPECT_EQ(std::get<Ended>(**m).oom_killed, 1);
  EXPECT_FALSE(whole.trailing_ended());
  // The agent died after writing part of an OUTPUT frame; its watchdog's
  // ENDED follows: next() waits for the rest of OUTPUT, the tail is ENDED.
  for (uint8_t oom : {uint8_t{0}, uint8_t{1}}) {
    const std::string output = encode(Output{7, 1, std::string(1000, 'x')});
    FrameReader torn;
    torn.feed(encode(Heartbeat{}) + output.substr(0, 300) + encode(Ended{oom}));
    ASSERT_TRUE(torn.next().is_ok());
    auto rest = torn.next();
    ASSERT_TRUE(rest.is_ok());
    EXPECT_FALSE(rest->has_value()) << "the torn frame waits for bytes that never come";
    auto tail = torn.trailing_ended();
    ASSERT_TRUE(tail);
    EXPECT_EQ(tail->oom_killed, oom);
  }
  // A stream cut short without ENDED has none.
  FrameReader cut;
  cut.feed(encode(Output{7, 1, "line\n"}).substr(0, 9));
  EXPECT_FALSE(cut.trailing_ended());
}

TEST(AgentProtocol, AnOlderAgentsHelloStillNamesItsVersion) {
  // Version 4's HELLO ends after the pid: read as such, so that the driver
  // can refuse the version in words instead of a malformed frame.
  std::string body = std::string(1, '\x01') + le32(4) + le32(3) + "old" + std::string(8, '\0');
  auto m = one(le32(static_cast<uint32_t>(body.size())) + body);
  ASSERT_TRUE(std::holds_alternative<Hello>(m));
  EXPECT_EQ(std::get<Hello>(m).version, 4u);
  EXPECT_EQ(std::get<Hello>(m).host, "old");
  EXPECT_TRUE(std::get<Hello>(m).attach_path.empty());
  // A STATE cut short is still an error.
  std::string state = encode(State{1, {WorkerReport{1, 1, 0, 0, 1, false}}, 0});
  std::string cut = state.substr(0, state.size() - 3);
  cut.replace(0, 4, le32(static_cast<uint32_t>(cut.size() - 4)));
  EXPECT_NE(error_of(cut).find("cut short"), std::string::npos);
}

}  // namespace
}  // namespace erun::agent
