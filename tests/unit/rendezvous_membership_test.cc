// The rendezvous server's membership logic without sockets: joins wait for a
// generation that lists their slot, take-overs and the one-process-per-rank
// check, re-joins for the driver, the pushes to a generation's members, and
// closed connections. Connections are numbers; what the logic sends and
// closes is recorded by a RecordingOutbox and decoded with the wire codec.
#include <gtest/gtest.h>

#include "rendezvous/server_membership.h"
#include "rendezvous_test_outbox.h"

namespace erun::testing {
namespace {

using wire::Type;

RankAssignment rank_of(const std::string& host, int index, int rank, int size) {
  RankAssignment a;
  a.slot = {host, index};
  a.rank = rank;
  a.size = size;
  a.local_rank = index;
  a.local_size = 1;
  a.cross_rank = rank;
  a.cross_size = size;
  return a;
}

JoinRequest slot_join(const std::string& host, int index, long pid,
                      JoinReason reason = JoinReason::kStart) {
  JoinRequest j;
  j.slot = {host, index};
  j.pid = pid;
  j.reason = reason;
  return j;
}

struct MembershipTest : ::testing::Test {
  RecordingOutbox out;
  ServerMembership m{out};

  // A JOIN on `conn` with request id `rid` leaving generation `left`; fails
  // the test when the connection is refused.
  void join(ConnId conn, uint32_t rid, int64_t left, JoinRequest req) {
    auto refused = m.join(Request{conn, rid, left}, fmt::format("10.0.0.{}:4000", conn), std::move(req));
    ASSERT_FALSE(refused) << *refused;
  }

  // The connection layer closing `conn` and finishing with it.
  void peer_closes(ConnId conn) {
    m.closed(conn, "closed by the peer");
    m.released(conn);
  }

  // The rank and generation of an ASSIGNMENT.
  static std::pair<int, int64_t> assigned(const Sent& s) {
    EXPECT_EQ(s.type, Type::kAssignment);
    int64_t gen = -1;
    auto a = wire::decode_assignment(s.payload, &gen);
    EXPECT_TRUE(a);
    EXPECT_EQ(gen, s.generation);
    return {a ? a->rank : -1, gen};
  }

  static std::vector<SlotKey> slots(const std::vector<JoinRequest>& joins) {
    std::vector<SlotKey> v;
    for (auto& j : joins) v.push_back(j.slot);
    return v;
  }
};

TEST_F(MembershipTest, JoinsWaitForAGenerationThatListsTheirSlotThenGetTheirRanks) {
  join(1, 7, -1, slot_join("b", 0, 100));
  join(2, 9, -1, slot_join("a", 0, 101));
  EXPECT_TRUE(out.take().empty());  // nothing published yet
  EXPECT_EQ(slots(*m.waiting()), (std::vector<SlotKey>{{"a", 0}, {"b", 0}}));

  m.publish(1, {rank_of("a", 0, 0, 2), rank_of("b", 0, 1, 2)});
  auto sent = out.take();
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[0].conn, 2u);
  EXPECT_EQ(sent[0].request_id, 9u);  // the JOIN's request id
  EXPECT_EQ(assigned(sent[0]), (std::pair<int, int64_t>{0, 1}));
  EXPECT_EQ(sent[1].conn, 1u);
  EXPECT_EQ(sent[1].request_id, 7u);
  EXPECT_EQ(assigned(sent[1]), (std::pair<int, int64_t>{1, 1}));
  EXPECT_TRUE(m.waiting()->empty());
  EXPECT_EQ(slots(*m.members()), (std::vector<SlotKey>{{"a", 0}, {"b", 0}}));
  auto s = m.snapshot();
  EXPECT_EQ(s.generation, 1);
  EXPECT_TRUE(s.rejoined.empty());  // first joins are not re-joins
}

TEST_F(MembershipTest, ASlotNotInThePublishedListKeepsWaiting) {
  join(1, 1, -1, slot_join("a", 0, 100));
  join(2, 1, -1, slot_join("b", 0, 101));
  m.publish(1, {rank_of("a", 0, 0, 1)});
  EXPECT_EQ(conns_of(out.take()), (std::vector<ConnId>{1}));
  EXPECT_EQ(slots(*m.waiting()), (std::vector<SlotKey>{{"b", 0}}));
  m.publish(2, {rank_of("a", 0, 0, 2), rank_of("b", 0, 1, 2)});
  auto sent = out.take();
  ASSERT_EQ(conns_of(sent), (std::vector<ConnId>{2}));  // "a" holds gen 1 and did not re-join
  EXPECT_EQ(assigned(sent[0]), (std::pair<int, int64_t>{1, 2}));
}

TEST_F(MembershipTest, AJoinIsAnsweredAtOnceByAPublishedGenerationNewerThanTheOneItLeaves) {
  m.publish(1, {rank_of("a", 0, 0, 1)});
  m.publish(2, {rank_of("a", 0, 0, 1)});
  join(1, 3, 1, slot_join("a", 0, 100, JoinReason::kPeerLost));  // a survivor of gen 1
  auto sent = out.take();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(assigned(sent[0]), (std::pair<int, int64_t>{0, 2}));
}

TEST_F(MembershipTest, ARejoinWaitsForANewerGenerationAndIsReportedOnce) {
  join(1, 1, -1, slot_join("a", 0, 100));
  m.publish(1, {rank_of("a", 0, 0, 1)});
  out.take();
  JoinRequest again = slot_join("a", 0, 100, JoinReason::kPeerLost);
  again.failed_rank = 3;
  again.failed_state = PeerState::kSilent;
  join(1, 2, 1, again);
  EXPECT_TRUE(out.take().empty());  // generation 1 again is never the answer
  EXPECT_TRUE(m.members()->empty());
  auto s = m.snapshot();
  ASSERT_EQ(s.rejoined.size(), 1u);
  EXPECT_EQ(s.rejoined[0].left_generation, 1);
  EXPECT_EQ(s.rejoined[0].failed_rank, 3);
  EXPECT_EQ(s.rejoined[0].failed_state, PeerState::kSilent);
  EXPECT_EQ(s.waiting.size(), 1u);
  EXPECT_TRUE(m.snapshot().rejoined.empty());
  m.publish(2, {rank_of("a", 0, 0, 1)});
  auto sent = out.take();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].request_id, 2u);
  EXPECT_EQ(assigned(sent[0]), (std::pair<int, int64_t>{0, 2}));
}

TEST_F(MembershipTest, RejoinsTheDriverDoesNotReadAreBounded) {
  join(1, 1, -1, slot_join("a", 0, 100));
  for (size_t i = 0; i < ServerMembership::kMaxRejoins + 1; ++i) {
    join(1, 2, -1, slot_join("a", 0, 100, JoinReason::kHostsUpdated));
  }
  EXPECT_EQ(m.snapshot().rejoined.size(), ServerMembership::kMaxRejoins / 2 + 1);
}

TEST_F(MembershipTest, AJoinFromAnotherProcessTakesTheSlotOverFromAWaitingHolder) {
  join(1, 5, -1, slot_join("x", 0, 100));
  join(2, 6, -1, slot_join("x", 0, 200));
  auto sent = out.take();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].conn, 1u);
  EXPECT_EQ(sent[0].request_id, 5u);  // the reply to its pending JOIN
  EXPECT_EQ(error_text(sent[0]), "slot x:0 was taken over by process 200");
  ASSERT_EQ(out.closes.size(), 1u);
  EXPECT_EQ(out.closes[0].first, 1u);
  EXPECT_FALSE(m.joined(1));
  m.closed(1, out.closes[0].second);  // the connection layer's call back changes nothing
  m.released(1);
  auto s = m.snapshot();
  ASSERT_EQ(s.waiting.size(), 1u);
  EXPECT_EQ(s.waiting[0].pid, 200);
  EXPECT_TRUE(s.disconnected.empty());  // the slot has a live worker
  m.publish(1, {rank_of("x", 0, 0, 1)});
  EXPECT_EQ(conns_of(out.take()), (std::vector<ConnId>{2}));
}

TEST_F(MembershipTest, TheSameProcessReconnectingReplacesItsOldConnectionQuietly) {
  join(1, 5, -1, slot_join("x", 0, 100));
  join(2, 6, -1, slot_join("x", 0, 100));
  EXPECT_TRUE(out.take().empty());  // no ERROR
  ASSERT_EQ(out.closes.size(), 1u);
  EXPECT_EQ(out.closes[0], (std::pair<ConnId, std::string>{1, "process 100 re-connected"}));
  m.released(1);
  EXPECT_TRUE(m.snapshot().disconnected.empty());
  m.publish(1, {rank_of("x", 0, 0, 1)});
  EXPECT_EQ(conns_of(out.take()), (std::vector<ConnId>{2}));
}

TEST_F(MembershipTest, ASecondProcessForALiveRankIsRefusedAndTheMemberKeepsIt) {
  join(1, 1, -1, slot_join("x", 0, 100));
  m.publish(1, {rank_of("x", 0, 0, 1)});
  out.take();
  join(2, 4, -1, slot_join("x", 0, 200));  // a fresh process names no generation
  auto sent = out.take();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].conn, 2u);
  EXPECT_EQ(sent[0].request_id, 4u);
  EXPECT_NE(error_text(sent[0]).find("slot x:0 is held by a live worker (pid 100 from 10.0.0.1:4000) in "
                                     "generation 1, and this join names generation -1"),
            std::string::npos)
      << error_text(sent[0]);
  EXPECT_TRUE(out.closes.empty());
  ASSERT_EQ(m.members()->size(), 1u);
  EXPECT_EQ(m.members()->front().pid, 100);
  EXPECT_FALSE(m.joined(2));
}

TEST_F(MembershipTest, AHolderWhosePeerClosedIsLetGoForItsReplacement) {
  join(1, 1, -1, slot_join("x", 0, 100));
  m.publish(1, {rank_of("x", 0, 0, 1)});
  out.take();
  out.dead.insert(1);  // the worker died; its close is not handled yet
  join(2, 4, -1, slot_join("x", 0, 200));
  ASSERT_EQ(out.closes.size(), 1u);
  EXPECT_EQ(out.closes[0], (std::pair<ConnId, std::string>{1, "closed by the peer"}));
  auto sent = out.take();
  ASSERT_EQ(sent.size(), 1u);  // the replacement is served: gen 1 lists the slot
  EXPECT_EQ(sent[0].conn, 2u);
  EXPECT_EQ(assigned(sent[0]), (std::pair<int, int64_t>{0, 1}));
  m.released(1);
  EXPECT_TRUE(m.snapshot().disconnected.empty());
}

TEST_F(MembershipTest, ProtocolViolationsRefuseTheConnection) {
  auto never = m.join(Request{1, 1, 4}, "p", slot_join("a", 0, 100));
  ASSERT_TRUE(never);
  EXPECT_EQ(*never, "JOIN leaving generation 4, which was never published (current -1)");
  join(1, 1, -1, slot_join("a", 0, 100));
  auto other = m.join(Request{1, 2, -1}, "p", slot_join("b", 0, 100));
  ASSERT_TRUE(other);
  EXPECT_EQ(*other, "JOIN for slot b:0 on a connection of slot a:0; one connection serves one slot");
  EXPECT_EQ(slots(*m.waiting()), (std::vector<SlotKey>{{"a", 0}}));
}

TEST_F(MembershipTest, HostsUpdatedReachesTheMembersOfTheGenerationOnly) {
  join(1, 1, -1, slot_join("a", 0, 100));
  join(2, 1, -1, slot_join("b", 0, 101));
  join(3, 1, -1, slot_join("c", 0, 102));  // never listed: waits
  m.publish(1, {rank_of("a", 0, 0, 2), rank_of("b", 0, 1, 2)});
  out.take();
  m.notify_hosts_updated(1);
  auto sent = out.take();
  EXPECT_EQ(conns_of(sent), (std::vector<ConnId>{1, 2}));
  for (auto& s : sent) {
    EXPECT_EQ(s.type, Type::kHostsUpdated);
    EXPECT_EQ(s.generation, 1);
    EXPECT_EQ(s.request_id, 0u);
  }
  join(2, 2, 1, slot_join("b", 0, 101, JoinReason::kHostsUpdated));  // left gen 1
  m.notify_hosts_updated(1);
  EXPECT_EQ(conns_of(out.take()), (std::vector<ConnId>{1}));
  // Generation 2 without "a": "a" still holds gen 1 and hears of it; gen 2's member does not.
  m.publish(2, {rank_of("b", 0, 0, 1)});
  EXPECT_EQ(conns_of(out.take()), (std::vector<ConnId>{2}));
  m.notify_hosts_updated(1);
  EXPECT_EQ(conns_of(out.take()), (std::vector<ConnId>{1}));
  m.notify_hosts_updated(2);
  EXPECT_EQ(conns_of(out.take()), (std::vector<ConnId>{2}));
}

TEST_F(MembershipTest, PeersLostClosesTheLostRanksAndTellsTheOtherMembers) {
  for (ConnId c = 1; c <= 3; ++c) join(c, 1, -1, slot_join("h", static_cast<int>(c), 100 + static_cast<long>(c)));
  join(4, 1, -1, slot_join("w", 0, 200));  // waiting, not a member
  m.publish(1, {rank_of("h", 1, 0, 3), rank_of("h", 2, 1, 3), rank_of("h", 3, 2, 3)});
  out.take();
  m.notify_peers_lost(1, {1});
  ASSERT_EQ(out.closes.size(), 1u);
  EXPECT_EQ(out.closes[0], (std::pair<ConnId, std::string>{2, "its rank was reported lost in generation 1"}));
  auto sent = out.take();
  EXPECT_EQ(conns_of(sent), (std::vector<ConnId>{1, 3}));
  for (auto& s : sent) {
    EXPECT_EQ(s.type, Type::kPeersLost);
    EXPECT_EQ(s.generation, 1);
    EXPECT_EQ(wire::decode_peers_lost(s.payload), (std::vector<int>{1}));
  }
  EXPECT_EQ(slots(*m.members()), (std::vector<SlotKey>{{"h", 1}, {"h", 3}}));
  m.notify_peers_lost(0, {0});  // not the last published generation
  m.notify_peers_lost(1, {});
  EXPECT_TRUE(out.take().empty());
  EXPECT_EQ(out.closes.size(), 1u);
}

TEST_F(MembershipTest, AClosedConnectionDropsItsWaitingJoinAndIsReportedOnce) {
  join(1, 1, -1, slot_join("a", 0, 100));
  join(2, 1, -1, slot_join("b", 0, 101));
  m.closed(1, "closed by the peer");
  EXPECT_EQ(slots(*m.waiting()), (std::vector<SlotKey>{{"b", 0}}));
  EXPECT_TRUE(m.snapshot().disconnected.empty());  // reported once the server is done with it
  m.released(1);
  m.publish(1, {rank_of("a", 0, 0, 2), rank_of("b", 0, 1, 2)});
  EXPECT_EQ(conns_of(out.take()), (std::vector<ConnId>{2}));  // nothing for the closed one
  peer_closes(2);
  EXPECT_TRUE(m.members()->empty());
  auto s = m.snapshot();
  EXPECT_EQ(s.disconnected, (std::vector<SlotKey>{{"a", 0}, {"b", 0}}));
  EXPECT_TRUE(m.snapshot().disconnected.empty());
}

TEST_F(MembershipTest, AJoinForTheSlotBeforeTheCloseIsDoneKeepsTheSlotFromBeingReported) {
  // A relay connection's RELAY_CLOSED and the replacement's JOIN in one read.
  join(1, 1, -1, slot_join("a", 0, 100));
  m.closed(1, "its worker's connection to the agent closed");
  join(2, 1, -1, slot_join("a", 0, 200));
  EXPECT_TRUE(out.take().empty());
  EXPECT_TRUE(out.closes.empty());
  m.released(1);
  auto s = m.snapshot();
  EXPECT_TRUE(s.disconnected.empty());
  ASSERT_EQ(s.waiting.size(), 1u);
  EXPECT_EQ(s.waiting[0].pid, 200);
}

TEST_F(MembershipTest, ASnapshotsListsStayAsTheyWereWhileTheIndexesChange) {
  for (int i = 0; i < 5; ++i) join(static_cast<ConnId>(i + 1), 1, -1, slot_join("h", i, 100 + i));
  auto before = m.snapshot();
  peer_closes(2);
  join(9, 1, -1, slot_join("a", 0, 300));
  auto after = m.snapshot();
  EXPECT_EQ(slots(before.waiting),
            (std::vector<SlotKey>{{"h", 0}, {"h", 1}, {"h", 2}, {"h", 3}, {"h", 4}}));
  EXPECT_EQ(slots(after.waiting), (std::vector<SlotKey>{{"a", 0}, {"h", 0}, {"h", 2}, {"h", 3}, {"h", 4}}));
}

}  // namespace
}  // namespace erun::testing

namespace erun::testing {
namespace {

// TIMING (commit intervals, for the straggler detector): a member's report
// of the current generation reaches the next snapshot; a report of another
// generation, or from a connection that holds no slot, does not. The codec
// refuses a span of no commits and more waiting than the span.
TEST_F(MembershipTest, TimingFromAMemberOfTheCurrentGenerationReachesTheSnapshot) {
  join(1, 1, -1, slot_join("a", 0, 100));
  m.publish(1, {rank_of("a", 0, 0, 1)});
  out.take();
  m.timing(Request{1, 0, 1}, wire::Timing{5, 2, 400000, 100000});
  m.timing(Request{1, 0, 0}, wire::Timing{4, 1, 1, 0});  // an older generation's
  m.timing(Request{2, 0, 1}, wire::Timing{5, 1, 1, 0});  // never joined
  auto s = m.snapshot();
  ASSERT_EQ(s.timings.size(), 1u);
  EXPECT_EQ(s.timings[0].slot, (SlotKey{"a", 0}));
  EXPECT_EQ(s.timings[0].generation, 1);
  EXPECT_EQ(s.timings[0].commit_id, 5u);
  EXPECT_EQ(s.timings[0].commits, 2u);
  EXPECT_DOUBLE_EQ(s.timings[0].interval_s, 0.4);
  EXPECT_DOUBLE_EQ(s.timings[0].wait_s, 0.1);
  EXPECT_TRUE(m.snapshot().timings.empty()) << "reported twice";
  EXPECT_TRUE(out.take().empty()) << "TIMING has no reply";

  auto back = wire::decode_timing(wire::encode_timing(wire::Timing{7, 3, 9, 8}));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->commit_id, 7u);
  EXPECT_EQ(back->commits, 3u);
  EXPECT_FALSE(wire::decode_timing(wire::encode_timing(wire::Timing{7, 0, 9, 8})));
  EXPECT_FALSE(wire::decode_timing(wire::encode_timing(wire::Timing{7, 1, 8, 9})));
  EXPECT_FALSE(wire::decode_timing(wire::encode_timing(wire::Timing{7, 1, 9, 8}).substr(1)));
}

}  // namespace
}  // namespace erun::testing
