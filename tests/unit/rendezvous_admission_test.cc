#include <gtest/gtest.h>

#include "rendezvous/admission.h"

namespace erun {
namespace {

using namespace std::chrono_literals;

TEST(Admission, EvictsOnlyTheOldestOnceOldEnough) {
  Admission a(2, 200ms, 2s);
  TimePoint t0{};
  a.accepted(1, t0);
  a.accepted(2, t0 + 10ms);
  EXPECT_TRUE(a.full());
  EXPECT_FALSE(a.evictable(t0 + 100ms));
  EXPECT_EQ(a.evictable(t0 + 250ms), 1u);
  a.done(1);
  EXPECT_FALSE(a.full());
  a.accepted(3, t0 + 300ms);
  EXPECT_EQ(a.evictable(t0 + 300ms), 2u);
  a.done(2);
  a.done(3);
  a.done(3);  // twice is harmless
  EXPECT_EQ(a.unauthenticated(), 0u);
}

TEST(Admission, ABurstOfRefusalsIsOneLineAndACount) {
  Admission a(10, 200ms, 2s);
  TimePoint t0{};
  EXPECT_TRUE(a.refused(t0, "first"));
  for (int i = 1; i <= 4999; ++i) EXPECT_FALSE(a.refused(t0 + i * 100us, "peer " + std::to_string(i)));
  EXPECT_FALSE(a.burst_line(t0 + 1s));  // still going
  auto line = a.burst_line(t0 + 3s);
  ASSERT_TRUE(line);
  EXPECT_NE(line->find("4999 more connections dropped in 0.5 s (the latest: peer 4999)"), std::string::npos)
      << *line;
  EXPECT_FALSE(a.burst_line(t0 + 4s));
  EXPECT_EQ(a.next_burst_check(), TimePoint::max());
  // A new burst logs its first refusal again; a lone refusal has no count line.
  EXPECT_TRUE(a.refused(t0 + 10s, "again"));
  EXPECT_FALSE(a.burst_line(t0 + 13s));
}

TEST(Admission, ALongBurstIsCountedPeriodically) {
  Admission a(10, 200ms, 1s);
  TimePoint t0{};
  a.refused(t0, "x");
  int lines = 0;
  for (int i = 1; i <= 600; ++i) {
    auto now = t0 + i * 100ms;
    a.refused(now, "y");
    if (a.burst_line(now)) ++lines;
  }
  EXPECT_EQ(lines, 4);  // every 15 s of a 60 s burst
}

}  // namespace
}  // namespace erun
