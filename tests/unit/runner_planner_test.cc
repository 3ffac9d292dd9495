#include <gtest/gtest.h>

#include "common/clock.h"
#include "runner/hosts/host_manager.h"
#include "runner/hosts/planner.h"

namespace erun {
namespace {

HostSet hosts(std::vector<Host> h) { return HostSet(std::move(h)); }

TEST(Planner, FillsHostsInOrderWithLocalAndCrossRanks) {
  Plan p = make_plan(1, hosts({{"a", 2}, {"b", 3}}), 0, nullptr);
  ASSERT_EQ(p.size(), 5);
  EXPECT_EQ(p.ranks[0].slot, (SlotKey{"a", 0}));
  EXPECT_EQ(p.ranks[4].slot, (SlotKey{"b", 2}));
  EXPECT_EQ(p.ranks[3].local_rank, 1);
  EXPECT_EQ(p.ranks[3].local_size, 3);
  EXPECT_EQ(p.ranks[0].local_size, 2);
  // local rank 0 and 1 exist on both hosts, 2 only on b.
  EXPECT_EQ(p.ranks[0].cross_rank, 0);
  EXPECT_EQ(p.ranks[2].cross_rank, 1);
  EXPECT_EQ(p.ranks[0].cross_size, 2);
  EXPECT_EQ(p.ranks[4].cross_rank, 0);
  EXPECT_EQ(p.ranks[4].cross_size, 1);
  for (int i = 0; i < p.size(); ++i) {
    EXPECT_EQ(p.ranks[i].rank, i);
    EXPECT_EQ(p.ranks[i].size, 5);
  }
  EXPECT_EQ(p.to_string(), "5 ranks: a[0-1] b[2-4]");
}

TEST(Planner, CapsAtMaxNp) {
  Plan p = make_plan(1, hosts({{"a", 4}, {"b", 4}}), 6, nullptr);
  EXPECT_EQ(p.size(), 6);
  EXPECT_EQ(p.ranks[5].slot, (SlotKey{"b", 1}));
  EXPECT_EQ(p.ranks[5].local_size, 2);
}

TEST(Planner, SurvivorsKeepOrderNewHostsAppendedRankZeroOnSurvivor) {
  Plan p1 = make_plan(1, hosts({{"b", 2}, {"c", 2}}), 0, nullptr);
  // Discovery now lists a new host first and drops nothing.
  Plan p2 = make_plan(2, hosts({{"a", 2}, {"b", 2}, {"c", 2}}), 0, &p1);
  EXPECT_EQ(p2.hosts(), (std::vector<std::string>{"b", "c", "a"}));
  for (int r = 0; r < 4; ++r) EXPECT_EQ(p2.ranks[r].slot, p1.ranks[r].slot) << r;
  // b disappears: c's workers become ranks 0-1, a follows.
  Plan p3 = make_plan(3, hosts({{"a", 2}, {"c", 2}}), 0, &p2);
  EXPECT_EQ(p3.ranks[0].slot, (SlotKey{"c", 0}));
  EXPECT_EQ(p3.hosts(), (std::vector<std::string>{"c", "a"}));
}

// A blacklisted host kept for its survivors: only their slots, even the
// previous plan's others (a failed worker's), and its free places go to
// other hosts under --max-np.
TEST(Planner, AHostNamedInOnlyTakesJustTheSlotsListedForIt) {
  const HostSet usable = hosts({{"a", 3}, {"b", 3}});
  Plan p1 = make_plan(1, usable, 4, nullptr);
  ASSERT_EQ(p1.to_string(), "4 ranks: a[0-2] b[3]");
  const std::vector<SlotKey> only{{"a", 0}, {"a", 2}};
  Plan p2 = make_plan(2, usable, 4, &p1, only);
  EXPECT_EQ(p2.to_string(), "4 ranks: a[0-1] b[2-3]");
  EXPECT_TRUE(p2.contains(SlotKey{"a", 2}));
  EXPECT_FALSE(p2.contains(SlotKey{"a", 1}));
  EXPECT_TRUE(p2.contains(SlotKey{"b", 1}));
  EXPECT_EQ(plannable_slots(usable, only), 5);
  // No limit: every open slot.
  EXPECT_EQ(make_plan(2, usable, 0, &p1, only).size(), 5);
  // A listed slot beyond the host's slots counts nothing.
  EXPECT_EQ(plannable_slots(usable, {{"a", 0}, {"a", 5}}), 4);
  EXPECT_EQ(plannable_slots(usable, {}), 6);
}

TEST(Planner, SameLayoutIgnoresGeneration) {
  Plan a = make_plan(1, hosts({{"a", 2}}), 0, nullptr);
  Plan b = make_plan(7, hosts({{"a", 2}, {"b", 1}}), 2, &a);
  EXPECT_TRUE(a.same_layout(b));
  Plan c = make_plan(8, hosts({{"a", 1}}), 2, &a);
  EXPECT_FALSE(a.same_layout(c));
  EXPECT_TRUE(a.contains(SlotKey{"a", 1}));
  EXPECT_FALSE(c.contains(SlotKey{"a", 1}));
}

// A host cut off (a partition): every try to relaunch it fails before its
// agent answers. An outage sits out the same cooldown again and again, not
// 10, 20, 40 s: the host rejoins within one cooldown of coming back.
TEST(HostManager, AnUnreachableHostSitsOutTheSameCooldownAgain) {
  FakeClock clock;
  HostHistories record;
  HostManager m(clock, BlacklistPolicy{2, std::chrono::seconds(10), std::chrono::seconds(300)}, record);
  // Lost mid-run (silent): two workers, a failure each: the first blacklisting.
  EXPECT_FALSE(m.record_failure("a"));
  auto first = m.record_failure("a");
  EXPECT_TRUE(first);
  EXPECT_FALSE(first.again);
  EXPECT_EQ(m.blacklisted_until("a"), clock.now() + std::chrono::seconds(10));
  for (int i = 0; i < 4; ++i) {
    clock.advance(std::chrono::seconds(11));
    EXPECT_FALSE(m.is_blacklisted("a"));
    // Relaunched, unreachable: both workers of the try, one blacklisting.
    EXPECT_FALSE(m.record_failure("a", true));
    auto again = m.record_failure("a", true);
    EXPECT_TRUE(again) << i;
    EXPECT_TRUE(again.again) << i;
    EXPECT_EQ(m.blacklisted_until("a"), clock.now() + std::chrono::seconds(10)) << "not doubled, try " << i;
    EXPECT_FALSE(m.record_failure("a", true)) << "a worker of the same try, while it sits out";
  }
  EXPECT_EQ(record["a"].times_blacklisted, 1);
  // Reached again, and its workers fail there: the cooldown doubles.
  clock.advance(std::chrono::seconds(11));
  m.record_failure("a");
  auto reached = m.record_failure("a");
  EXPECT_FALSE(reached.again);
  EXPECT_EQ(m.blacklisted_until("a"), clock.now() + std::chrono::seconds(20));
}

// A host never reached at all sits out the shortest cooldown each time.
TEST(HostManager, AHostNeverReachedSitsOutTheShortestCooldown) {
  FakeClock clock;
  HostHistories record;
  HostManager m(clock, BlacklistPolicy{1, std::chrono::seconds(10), std::chrono::seconds(300)}, record);
  EXPECT_FALSE(m.record_failure("a", true).again);
  EXPECT_EQ(m.blacklisted_until("a"), clock.now() + std::chrono::seconds(10));
  for (int i = 0; i < 3; ++i) {
    clock.advance(std::chrono::seconds(11));
    EXPECT_TRUE(m.record_failure("a", true).again);
    EXPECT_EQ(m.blacklisted_until("a"), clock.now() + std::chrono::seconds(10));
  }
}

TEST(HostManager, BlacklistsAfterConsecutiveFailuresWithDoublingCooldown) {
  FakeClock clock;
  HostHistories record;
  HostManager m(clock, BlacklistPolicy{2, std::chrono::seconds(10), std::chrono::seconds(25)}, record);
  EXPECT_FALSE(m.record_failure("a"));
  m.record_success("a");  // resets the streak
  EXPECT_FALSE(m.record_failure("a"));
  EXPECT_TRUE(m.record_failure("a"));
  EXPECT_TRUE(m.is_blacklisted("a"));
  EXPECT_EQ(m.usable(HostSet({{"a", 1}, {"b", 2}})).to_string(), "b:2");
  clock.advance(std::chrono::seconds(9));
  EXPECT_TRUE(m.is_blacklisted("a"));
  clock.advance(std::chrono::seconds(2));
  EXPECT_FALSE(m.is_blacklisted("a"));
  // Second blacklisting: 20 s; third: capped at 25 s.
  m.record_failure("a");
  EXPECT_TRUE(m.record_failure("a"));
  clock.advance(std::chrono::seconds(19));
  EXPECT_TRUE(m.is_blacklisted("a"));
  clock.advance(std::chrono::seconds(2));
  EXPECT_FALSE(m.is_blacklisted("a"));
  m.record_failure("a");
  m.record_failure("a");
  clock.advance(std::chrono::seconds(24));
  EXPECT_TRUE(m.is_blacklisted("a"));
  EXPECT_EQ(m.blacklisted(), (std::vector<std::string>{"a"}));
  clock.advance(std::chrono::seconds(2));
  EXPECT_FALSE(m.is_blacklisted("a"));
  EXPECT_TRUE(m.blacklisted().empty());
}

// The histories live in the map the manager was given (the driver's
// record): a host's failures and blacklistings, and nothing for a host with
// neither.
TEST(HostManager, KeepsTheHostsHistoriesInTheRecordItWasGiven) {
  FakeClock clock;
  HostHistories record;
  HostManager m(clock, BlacklistPolicy{2, std::chrono::seconds(10), std::chrono::seconds(300)}, record);
  m.record_failure("a");
  m.record_failure("a");  // blacklisted for 10 s
  m.record_failure("b");
  m.record_success("c");  // nothing to record
  EXPECT_EQ(record, (HostHistories{{"a", {0, 1, clock.now() + std::chrono::seconds(10)}}, {"b", {1, 0, {}}}}));
  m.record_success("b");
  EXPECT_EQ(record.count("b"), 0u) << "b has nothing left to carry";
  // A record as the last driver left it: its blacklisting and counts hold.
  record["d"] = HostHistory{1, 1, clock.now() + std::chrono::seconds(3)};
  EXPECT_EQ(m.blacklisted(), (std::vector<std::string>{"a", "d"}));
  EXPECT_TRUE(m.record_failure("d")) << "d's second failure in a row";
  EXPECT_EQ(m.blacklisted_until("d"), clock.now() + std::chrono::seconds(20)) << "its second blacklisting doubles";
}

}  // namespace
}  // namespace erun

#include "runner/hosts/plan_cache.h"

namespace erun {
namespace {

// The per-tick membership check: recomputed only when an input changed.
TEST(PlanCache, RecomputesOnlyWhenHostsBlacklistOrPlanChange) {
  FakeClock clock;
  HostHistories record;
  HostManager m(clock, BlacklistPolicy{1, std::chrono::seconds(10), std::chrono::seconds(10)}, record);
  HostSet discovered = hosts({{"a", 2}, {"b", 2}});
  Plan running;
  PlanCache c;
  c.update(1, discovered, m, 0, running, 0);
  EXPECT_EQ(c.recomputations(), 1);
  EXPECT_EQ(c.usable_slots(), 4);
  EXPECT_EQ(c.next().to_string(), "4 ranks: a[0-1] b[2-3]");
  for (int i = 0; i < 100; ++i) c.update(1, discovered, m, 0, running, 0);
  EXPECT_EQ(c.recomputations(), 1);
  // The plan starts: recomputed once, against it.
  running = make_plan(1, discovered, 0, nullptr);
  c.update(1, discovered, m, 1, running, 0);
  c.update(1, discovered, m, 1, running, 0);
  EXPECT_EQ(c.recomputations(), 2);
  EXPECT_TRUE(c.next().same_layout(running));
  // A blacklisting removes b.
  EXPECT_TRUE(m.record_failure("b"));
  c.update(1, discovered, m, 1, running, 0);
  EXPECT_EQ(c.recomputations(), 3);
  EXPECT_EQ(c.next().to_string(), "2 ranks: a[0-1]");
  // Its cooldown ends: b is back without any other change.
  clock.advance(std::chrono::seconds(11));
  c.update(1, discovered, m, 1, running, 0);
  EXPECT_EQ(c.recomputations(), 4);
  EXPECT_EQ(c.usable_slots(), 4);
  // New discovery epoch.
  discovered = hosts({{"a", 2}, {"b", 2}, {"c", 1}});
  c.update(2, discovered, m, 1, running, 0);
  EXPECT_EQ(c.recomputations(), 5);
  EXPECT_EQ(c.next().to_string(), "5 ranks: a[0-1] b[2-3] c[4]");
  // b blacklisted again, with a survivor kept at b[1]: b is usable for it
  // alone.
  EXPECT_TRUE(m.record_failure("b"));
  const std::vector<SlotKey> keep{{"b", 1}};
  c.update(2, discovered, m, 1, running, 0, keep);
  EXPECT_EQ(c.recomputations(), 6);
  EXPECT_EQ(c.usable_slots(), 4);
  EXPECT_EQ(c.next().to_string(), "4 ranks: a[0-1] b[2] c[3]");
  EXPECT_TRUE(c.next().contains(SlotKey{"b", 1}));
}

// 20,000 hosts with the previous plan on the last ones: linear ordering.
TEST(Planner, OrderHostsIsLinearInHosts) {
  std::vector<Host> v;
  for (int i = 0; i < 20000; ++i) v.push_back({"h" + std::to_string(i), 1});
  HostSet set(v);
  Plan prev;
  for (int i = 19990; i < 20000; ++i) prev.ranks.push_back(RankAssignment{{}, SlotKey{"h" + std::to_string(i), 0}});
  auto order = order_hosts(set, &prev);
  ASSERT_EQ(order.size(), 20000u);
  EXPECT_EQ(order[0].name, "h19990");
  EXPECT_EQ(order[10].name, "h0");
}

// A job record's plan as hosts (a takeover whose discovery fails goes on
// with them): each host's highest slot decides its slot count.
TEST(PlannerTest, HostsOfAPlanCoverEverySlot) {
  EXPECT_EQ(hosts_of_plan({{"a", 0}, {"a", 2}, {"b", 1}, {"a", 1}}).to_string(), "a:3,b:2");
  EXPECT_TRUE(hosts_of_plan({}).empty());
}

TEST(PlannerTest, PlanOverSlotsNumbersLocalRanksDenselyAroundAHole) {
  // Survivors on a[0], a[2], a[3], b[1]: slot a[1] and b[0] are free.
  Plan p = plan_over_slots(7, {{"a", 0}, {"a", 2}, {"a", 3}, {"b", 1}});
  ASSERT_EQ(p.size(), 4);
  EXPECT_EQ(p.generation, 7);
  std::vector<int> local, local_size, cross, cross_size;
  for (int r = 0; r < 4; ++r) {
    auto& a = p.ranks[static_cast<size_t>(r)];
    EXPECT_EQ(a.rank, r);
    EXPECT_EQ(a.size, 4);
    local.push_back(a.local_rank);
    local_size.push_back(a.local_size);
    cross.push_back(a.cross_rank);
    cross_size.push_back(a.cross_size);
  }
  EXPECT_EQ(local, (std::vector<int>{0, 1, 2, 0}));
  EXPECT_EQ(local_size, (std::vector<int>{3, 3, 3, 1}));
  EXPECT_EQ(cross, (std::vector<int>{0, 0, 0, 1}));       // b's only slot is its local rank 0
  EXPECT_EQ(cross_size, (std::vector<int>{2, 1, 1, 2}));  // local rank 0 exists on a and b
  EXPECT_EQ(p.ranks[3].slot, (SlotKey{"b", 1}));
}

// Under --max-np the previous plan's slots on every host come before a
// free slot of an earlier host: a rank moved to a standby's slot on b stays
// there, instead of going back to a's free slot and leaving b's.
TEST(PlannerTest, PreviousSlotsOfEveryHostComeBeforeFreeOnes) {
  Plan prev = plan_over_slots(3, {{"a", 1}, {"b", 1}, {"b", 0}});
  Plan p = make_plan(4, hosts({{"a", 2}, {"b", 2}}), 3, &prev);
  std::vector<SlotKey> slots;
  for (auto& r : p.ranks) slots.push_back(r.slot);
  EXPECT_EQ(slots, (std::vector<SlotKey>{{"a", 1}, {"b", 1}, {"b", 0}}));
  // Room for one more: a's free slot then comes after the kept ones of a.
  Plan q = make_plan(4, hosts({{"a", 2}, {"b", 2}}), 4, &prev);
  slots.clear();
  for (auto& r : q.ranks) slots.push_back(r.slot);
  EXPECT_EQ(slots, (std::vector<SlotKey>{{"a", 1}, {"a", 0}, {"b", 1}, {"b", 0}}));
}

// Standbys are taken nearest: the same host, then the same rack (both
// named alike), then any; unknown hosts and unnamed racks are far.
TEST(PlannerTest, HostDistanceIsHostThenRack) {
  HostSet hosts({Host{"a", 2, false, "r1"}, Host{"b", 2, false, "r1"}, Host{"c", 2, false, "r2"}, Host{"d", 2},
                 Host{"e", 2}});
  EXPECT_EQ(host_distance(hosts, "a", "a"), 0);
  EXPECT_EQ(host_distance(hosts, "a", "b"), 1);
  EXPECT_EQ(host_distance(hosts, "b", "a"), 1);
  EXPECT_EQ(host_distance(hosts, "a", "c"), 2);
  EXPECT_EQ(host_distance(hosts, "d", "e"), 2) << "no rack named is no common rack";
  EXPECT_EQ(host_distance(hosts, "a", "zz"), 2);
}

}  // namespace
}  // namespace erun
