// StragglerDetector: which rank holds the job back, from the commit
// intervals the ranks report (runner/policies/stragglers.h).
#include <gtest/gtest.h>

#include "runner/policies/stragglers.h"

namespace erun {
namespace {

const SlotKey a{"a", 0}, b{"b", 0}, c{"c", 0}, d{"d", 0};

// One interval of four ranks, the fourth computing `slow` times as long:
// in synchronous training every rank's interval is the slowest's, and the
// others wait for it.
void interval(StragglerDetector& det, long gen, uint64_t id, double slow, double compute = 0.2,
              double comm = 0.01) {
  const double length = compute * slow + comm;
  for (const SlotKey& s : {a, b, c, d}) {
    const double mine = s == d ? compute * slow : compute;
    det.add(RankTiming{s, gen, id, length, length - mine});
  }
}

TEST(Stragglers, ARankSlowInEveryIntervalOfTheWindowIsFoundOnce) {
  StragglerDetector det(StragglerOptions{1.5, 3});
  det.start_generation(1, {a, b, c, d});
  interval(det, 1, 1, 5);
  interval(det, 1, 2, 5);
  EXPECT_TRUE(det.take_found().empty()) << "two intervals are not the window";
  interval(det, 1, 3, 5);
  auto found = det.take_found();
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].slot, d);
  EXPECT_NEAR(found[0].factor, 5, 0.01);
  EXPECT_NEAR(found[0].interval_s, 1.01, 1e-6);
  EXPECT_NEAR(found[0].without_s, 0.21, 1e-6);
  EXPECT_GT(found[0].gain(), 0.75);
  interval(det, 1, 4, 5);
  EXPECT_TRUE(det.take_found().empty()) << "found once per streak";
  // Healthy again, then slow again: a new streak, found again.
  interval(det, 1, 5, 1);
  for (uint64_t id = 6; id <= 8; ++id) interval(det, 1, id, 4);
  EXPECT_EQ(det.take_found().size(), 1u);
}

TEST(Stragglers, AJobSlowEverywhereAlikeAndASlightlySlowRankHaveNone) {
  StragglerDetector det(StragglerOptions{1.5, 3});
  det.start_generation(1, {a, b, c, d});
  for (uint64_t id = 1; id <= 6; ++id) interval(det, 1, id, 1, /*compute=*/2.0);  // all ten times slower
  for (uint64_t id = 7; id <= 12; ++id) interval(det, 1, id, 1.4);                 // under the factor
  EXPECT_TRUE(det.take_found().empty());
  EXPECT_EQ(det.judged(), 12);
}

TEST(Stragglers, ARoundIsJudgedOnceEveryMemberReported) {
  StragglerDetector det(StragglerOptions{1.5, 1});
  det.start_generation(1, {a, b, c, d});
  det.add(RankTiming{d, 1, 1, 1.0, 0.0});
  det.add(RankTiming{a, 1, 1, 1.0, 0.8});
  det.add(RankTiming{b, 1, 1, 1.0, 0.8});
  EXPECT_EQ(det.judged(), 0);
  det.add(RankTiming{c, 2, 1, 1.0, 0.8});  // another generation's: ignored
  det.add(RankTiming{{"e", 0}, 1, 1, 1.0, 0.8});  // not a member
  EXPECT_EQ(det.judged(), 0);
  det.add(RankTiming{c, 1, 1, 1.0, 0.8});
  EXPECT_EQ(det.judged(), 1);
  EXPECT_EQ(det.take_found().size(), 1u);
  // A new generation forgets streaks and open intervals.
  det.start_generation(2, {a, b});
  det.add(RankTiming{a, 2, 2, 1.0, 0.0});
  det.add(RankTiming{b, 2, 2, 1.0, 0.9});
  auto found = det.take_found();
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].slot, a);
  EXPECT_EQ(found[0].generation, 2);
}

// Ranks report every 100 ms, each covering the commits since: the times
// are compared per commit interval.
TEST(Stragglers, ReportsCoveringDifferentNumbersOfCommitsCompareByCommit) {
  StragglerDetector det(StragglerOptions{1.5, 2});
  det.start_generation(1, {a, b, c});
  for (uint64_t round = 1; round <= 2; ++round) {
    det.add(RankTiming{a, 1, 4 * round, 4.0, 3.2, 4});  // 0.2 s of compute per commit
    det.add(RankTiming{b, 1, 2 * round, 2.0, 1.6, 2});
    det.add(RankTiming{c, 1, round, 1.0, 0.0, 1});      // 1.0 s of compute per commit
  }
  auto found = det.take_found();
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].slot, c);
  EXPECT_NEAR(found[0].factor, 5, 1e-9);
  EXPECT_EQ(det.judged(), 2);
}

TEST(Stragglers, AWorldOfOneHasNone) {
  StragglerDetector det(StragglerOptions{1.5, 1});
  det.start_generation(1, {a});
  det.add(RankTiming{a, 1, 1, 1.0, 0.0});
  EXPECT_EQ(det.judged(), 0);
  EXPECT_TRUE(det.take_found().empty());
}

}  // namespace
}  // namespace erun
