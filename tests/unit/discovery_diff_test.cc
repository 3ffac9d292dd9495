#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "discovery/host_set.h"

namespace erun {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(Diff, NoChange) {
  HostSet a({{"a", 2}, {"b", 2}});
  auto d = diff_hosts(a, a);
  EXPECT_TRUE(d.empty());
  EXPECT_EQ(d.to_string(), "no change");
  EXPECT_TRUE(diff_hosts(HostSet(), HostSet()).empty());
}

TEST(Diff, OrderAloneIsNoChange) {
  auto d = diff_hosts(HostSet({{"a", 1}, {"b", 1}}), HostSet({{"b", 1}, {"a", 1}}));
  EXPECT_TRUE(d.empty());
}

TEST(Diff, AddedRemovedChanged) {
  HostSet before({{"a", 2}, {"b", 2}, {"x", 1}, {"c", 4}});
  HostSet after({{"e", 1}, {"c", 8}, {"b", 4}, {"d", 1}});
  auto d = diff_hosts(before, after);
  EXPECT_THAT(d.added, ElementsAre("e", "d"));          // new set's order
  EXPECT_THAT(d.removed, ElementsAre("a", "x"));        // old set's order
  EXPECT_THAT(d.changed, ElementsAre(SlotChange{"c", 4, 8}, SlotChange{"b", 2, 4}));
  EXPECT_EQ(d.to_string(), "+e +d -a -x c:4->8 b:2->4");
}

TEST(Diff, HeaderExample) {
  auto d = diff_hosts(HostSet({{"a", 1}, {"b", 2}}), HostSet({{"b", 4}, {"c", 1}}));
  EXPECT_EQ(d.to_string(), "+c -a b:2->4");
}

TEST(Diff, FromAndToEmpty) {
  HostSet s({{"a", 1}, {"b", 1}});
  auto grow = diff_hosts(HostSet(), s);
  EXPECT_THAT(grow.added, ElementsAre("a", "b"));
  EXPECT_THAT(grow.removed, IsEmpty());
  auto shrink = diff_hosts(s, HostSet());
  EXPECT_THAT(shrink.removed, ElementsAre("a", "b"));
  EXPECT_THAT(shrink.added, IsEmpty());
  EXPECT_EQ(shrink.to_string(), "-a -b");
}

TEST(Diff, Ipv6ChangeIsBracketed) {
  auto d = diff_hosts(HostSet({{"fe80::1", 1}}), HostSet({{"fe80::1", 2}, {"::1", 1}}));
  EXPECT_EQ(d.to_string(), "+::1 [fe80::1]:1->2");
}

TEST(Diff, AppliedToParsedOutput) {
  auto before = parse_discovery_output("n1:4\nn2:4\n", 1);
  auto after = parse_discovery_output("n2:2\nn3:4\n", 1);
  ASSERT_TRUE(before && after);
  EXPECT_EQ(diff_hosts(*before, *after).to_string(), "+n3 -n1 n2:4->2");
}

}  // namespace
}  // namespace erun
