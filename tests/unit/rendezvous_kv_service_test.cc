// The rendezvous server's key-value store without sockets or real time: a
// get waits for a later set or its deadline, a new generation drops the keys
// and fails the waiting gets, requests of another generation are refused.
// Replies are recorded by a RecordingOutbox and decoded with the wire codec.
#include <gtest/gtest.h>

#include "rendezvous/kv_service.h"
#include "rendezvous_test_outbox.h"

namespace erun::testing {
namespace {

using namespace std::chrono_literals;
using wire::Type;

struct KvServiceTest : ::testing::Test {
  KvServiceTest() { kv.new_generation(0); }

  RecordingOutbox out;
  KvService kv{out};
  FakeClock clock;

  static Request req(ConnId conn, uint32_t rid, int64_t gen = 0) { return Request{conn, rid, gen}; }
  static std::string value_of(const Sent& s) {
    EXPECT_EQ(s.type, Type::kKvValue);
    return wire::decode_str(s.payload).value_or("<malformed KV_VALUE payload>");
  }
};

TEST_F(KvServiceTest, AGetWaitsForALaterSetOfItsKey) {
  kv.get(req(1, 11), "addr/0", 10'000, clock.now());
  kv.get(req(3, 31), "addr/0", 10'000, clock.now());
  kv.get(req(4, 41), "other", 10'000, clock.now());
  EXPECT_TRUE(out.take().empty());
  EXPECT_EQ(kv.waiting(), 3u);
  kv.set(req(2, 21), "addr/0", "10.0.0.2:5000");
  auto sent = out.take();
  ASSERT_EQ(sent.size(), 3u);
  EXPECT_EQ(sent[0].conn, 2u);  // the set is acknowledged first
  EXPECT_EQ(sent[0].type, Type::kKvSetOk);
  EXPECT_EQ(sent[0].request_id, 21u);
  EXPECT_EQ(sent[1].conn, 1u);  // then the gets, in the order they came
  EXPECT_EQ(sent[1].request_id, 11u);
  EXPECT_EQ(value_of(sent[1]), "10.0.0.2:5000");
  EXPECT_EQ(sent[2].conn, 3u);
  EXPECT_EQ(value_of(sent[2]), "10.0.0.2:5000");
  EXPECT_EQ(kv.waiting(), 1u);
  kv.get(req(5, 51), "addr/0", 0, clock.now());  // there now: answered at once
  sent = out.take();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(value_of(sent[0]), "10.0.0.2:5000");
}

TEST_F(KvServiceTest, AGetTimesOutAtItsDeadline) {
  const TimePoint t0 = clock.now();
  kv.get(req(1, 11), "go", 1500, t0);
  EXPECT_EQ(kv.next_deadline(), t0 + 1500ms);
  kv.expire_next(t0 + 1499ms);  // not due
  EXPECT_TRUE(out.take().empty());
  EXPECT_EQ(kv.waiting(), 1u);
  kv.expire_next(t0 + 1500ms);
  auto sent = out.take();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].conn, 1u);
  EXPECT_EQ(sent[0].request_id, 11u);
  EXPECT_NE(error_text(sent[0]).find("store: timed out after 1.5 s waiting for key 'go' in generation 0"),
            std::string::npos)
      << error_text(sent[0]);
  EXPECT_EQ(kv.next_deadline(), TimePoint::max());
  kv.set(req(2, 21), "go", "1");  // too late for the get
  EXPECT_EQ(out.take().size(), 1u);
}

TEST_F(KvServiceTest, AnAnsweredGetDoesNotTimeOutAndAWaitIsCappedAtADay) {
  const TimePoint t0 = clock.now();
  kv.get(req(1, 11), "k", 1000, t0);
  kv.set(req(2, 21), "k", "v");
  out.take();
  kv.expire_next(t0 + 1s);
  EXPECT_TRUE(out.take().empty());
  kv.get(req(1, 12), "never", UINT64_MAX, t0);
  EXPECT_EQ(kv.next_deadline(), t0 + 24h);
}

TEST_F(KvServiceTest, RequestsOfAnotherGenerationAreRefused) {
  kv.new_generation(2);
  EXPECT_TRUE(kv.admit(req(1, 1, 2)));
  EXPECT_TRUE(out.take().empty());
  EXPECT_FALSE(kv.admit(req(1, 5, 1)));
  EXPECT_FALSE(kv.admit(req(1, 6, 3)));
  auto sent = out.take();
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[0].request_id, 5u);
  EXPECT_EQ(sent[0].generation, 2);
  EXPECT_EQ(error_text(sent[0]), "stale generation 1, current 2 (re-join to get the current generation's rank)");
  EXPECT_EQ(error_text(sent[1]), "unknown generation 3, current 2 (re-join to get the current generation's rank)");
}

TEST_F(KvServiceTest, ANewGenerationDropsTheKeysAndFailsTheWaitingGets) {
  kv.set(req(1, 1), "ready/0", "");
  kv.get(req(2, 7), "go", 60'000, clock.now());
  out.take();
  kv.new_generation(1);
  auto sent = out.take();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].conn, 2u);
  EXPECT_EQ(sent[0].request_id, 7u);
  EXPECT_EQ(sent[0].generation, 1);
  EXPECT_EQ(error_text(sent[0]), "stale generation 0, current 1 (re-join to get the current generation's rank)");
  EXPECT_EQ(kv.waiting(), 0u);
  kv.check(req(1, 2, 1), {"ready/0"});
  sent = out.take();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].type, Type::kKvCheckResult);
  EXPECT_EQ(wire::decode_check_result(sent[0].payload), false);
  kv.set(req(2, 3, 1), "go", "1");  // the old get is not answered
  EXPECT_EQ(out.take().size(), 1u);
}

TEST_F(KvServiceTest, CheckSaysWhetherEveryKeyExists) {
  kv.set(req(1, 1), "a", "1");
  kv.set(req(1, 2), "b", "2");
  out.take();
  kv.check(req(1, 3), {"a", "b"});
  kv.check(req(1, 4), {"a", "c"});
  auto sent = out.take();
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(wire::decode_check_result(sent[0].payload), true);
  EXPECT_EQ(wire::decode_check_result(sent[1].payload), false);
}

TEST_F(KvServiceTest, AClosedConnectionsGetsAreDropped) {
  kv.get(req(1, 11), "k", 10'000, clock.now());
  kv.get(req(2, 21), "k", 10'000, clock.now());
  kv.drop(1);
  EXPECT_EQ(kv.waiting(), 1u);
  kv.set(req(3, 31), "k", "v");
  EXPECT_EQ(conns_of(out.take()), (std::vector<ConnId>{3, 2}));
  clock.advance(10s);
  kv.expire_next(clock.now());
  EXPECT_TRUE(out.take().empty());
}

}  // namespace
}  // namespace erun::testing
