// The driver's side of commit replicas (runner/policies/replicas.h): which spare
// hosts keep replicas and who pushes to each, and how the agents are moved
// toward that plan as their answers come, through a launcher that records
// what it was asked.
#include <gtest/gtest.h>

#include <list>
#include <map>
#include <string>
#include <vector>

#include "runner/policies/replicas.h"

namespace erun {
namespace {

using Plan = std::vector<std::pair<std::string, std::string>>;

TEST(PlanKeepers, SparesMakeUpWhatTheHoldersLack) {
  // One holder, --commit-replicas 1: one spare keeps a replica.
  EXPECT_EQ(plan_keepers({"a"}, {"b", "c"}, 1), (Plan{{"b", "a"}}));
  // Two holders already hold every commit twice.
  EXPECT_TRUE(plan_keepers({"a", "b"}, {"c"}, 1).empty());
  // Three replicas over two holders: the spares take the holders in turn.
  EXPECT_EQ(plan_keepers({"a", "b"}, {"c", "d", "e"}, 3), (Plan{{"c", "a"}, {"d", "b"}}));
  // Fewer spares than wanted: all of them.
  EXPECT_EQ(plan_keepers({"a"}, {"b"}, 4), (Plan{{"b", "a"}}));
  // Nothing to replicate, or replicas off.
  EXPECT_TRUE(plan_keepers({}, {"b"}, 1).empty());
  EXPECT_TRUE(plan_keepers({"a"}, {"b"}, 0).empty());
}

TEST(PlanKeepers, KeepersStayKeepersWithTheirHoldersWhileTheyCan) {
  // A spare listed before the keeper does not take its place: a new keeper
  // would be sent the whole state again.
  EXPECT_EQ(plan_keepers({"a"}, {"x", "b", "c"}, 1, {{"b", "a"}}), (Plan{{"b", "a"}}));
  // A keeper that left the spares is replaced by the first other spare.
  EXPECT_EQ(plan_keepers({"a"}, {"x", "c"}, 1, {{"b", "a"}}), (Plan{{"x", "a"}}));
  // Its holder stays while it is one; a new keeper takes the least loaded holder.
  EXPECT_EQ(plan_keepers({"a", "b"}, {"c", "d", "e"}, 3, {{"d", "a"}}), (Plan{{"c", "b"}, {"d", "a"}}));
  // A holder that is one no more: the keeper gets another.
  EXPECT_EQ(plan_keepers({"b"}, {"c"}, 1, {{"c", "a"}}), (Plan{{"c", "b"}}));
  // Fewer keepers wanted: the current ones first, in the spares' order.
  EXPECT_EQ(plan_keepers({"a", "b"}, {"c", "d", "e"}, 2, {{"e", "a"}, {"d", "b"}}), (Plan{{"d", "b"}}));
}

class RecordingLauncher final : public Launcher {
 public:
  Result<std::unique_ptr<WorkerHandle>> launch(const WorkerSpec&) override {
    return Result<std::unique_ptr<WorkerHandle>>::error("not in this test");
  }
  std::vector<std::string> command_line(const WorkerSpec&) const override { return {}; }
  bool keep(const std::string& host, const std::string& dir, const std::string& secret) override {
    asked.push_back(host + " " + dir + " " + secret);
    return can_start;
  }
  std::optional<int> keeper_port(const std::string& host) override {
    auto it = ports.find(host);
    if (it == ports.end()) return std::nullopt;
    return it->second;
  }
  void replicate(const std::string& holder, const std::string& keeper, int port, const std::string& dir) override {
    told.push_back(port == 0 ? holder + " stops " + keeper : holder + " -> " + keeper + ":" + std::to_string(port) +
                                                                 " " + dir);
  }
  void unkeep(const std::string& host, bool forget) override {
    unkept.push_back(host + (forget ? " forgets" : " keeps its replicas"));
  }
  bool can_start = true;
  std::map<std::string, int> ports;  // absent: no answer yet
  std::vector<std::string> asked, told, unkept;
};

class CommitReplicasTest : public ::testing::Test {
 protected:
  // `record`: the driver's record's keepers it starts from (a job taken
  // over names some) and keeps.
  CommitReplicas make(int replicas, std::map<std::string, std::string> record = {}) {
    // Keepers are reached at the address the driver gives (ip-of-HOST).
    records_.push_back(std::move(record));
    return CommitReplicas(
        replicas, "s3cret", [](const std::string& h) { return "/dev/shm/c-" + h; },
        [](const std::string& h) { return "ip-of-" + h; },
        [this](const std::string&) -> Launcher& { return launcher_; }, clock_, records_.back());
  }
  // What the driver does each tick (it plans again only when the hosts
  // changed; planning again with the same hosts changes nothing).
  static void tick(CommitReplicas& r, const std::vector<std::string>& holders,
                   const std::vector<std::string>& spares) {
    r.plan(holders, spares);
    r.tick();
  }
  RecordingLauncher launcher_;
  FakeClock clock_;
  std::list<std::map<std::string, std::string>> records_;  // one per make(), in order
};

TEST_F(CommitReplicasTest, AKeeperIsAskedAndItsHolderToldOnceItAnsweredBothAgainNowAndThen) {
  CommitReplicas r = make(1);
  tick(r, {"a"}, {"b"});
  EXPECT_EQ(launcher_.asked, std::vector<std::string>{"b /dev/shm/c-b s3cret"});
  EXPECT_TRUE(launcher_.told.empty());  // no answer yet
  tick(r, {"a"}, {"b"});
  EXPECT_EQ(launcher_.asked.size(), 1u);
  launcher_.ports["b"] = 4000;
  tick(r, {"a"}, {"b"});
  EXPECT_EQ(launcher_.told, std::vector<std::string>{"a -> ip-of-b:4000 /dev/shm/c-b"});
  EXPECT_EQ(r.serving(), (std::map<std::string, std::string>{{"b", "a"}}));
  tick(r, {"a"}, {"b"});
  EXPECT_EQ(launcher_.told.size(), 1u);
  EXPECT_EQ(launcher_.asked.size(), 1u);
  // Both said again after a while: a keeper or a pusher that ended is
  // started again by its agent.
  clock_.advance(std::chrono::seconds(6));
  tick(r, {"a"}, {"b"});
  EXPECT_EQ(launcher_.asked.size(), 2u);
  EXPECT_EQ(launcher_.told.size(), 2u);
}

TEST_F(CommitReplicasTest, AKeeperStartedAgainOnAnotherPortIsToldToItsHolderAtOnce) {
  CommitReplicas r = make(1);
  launcher_.ports["b"] = 4000;
  tick(r, {"a"}, {"b"});
  ASSERT_EQ(launcher_.told.size(), 1u);
  launcher_.ports["b"] = 4002;
  tick(r, {"a"}, {"b"});
  EXPECT_EQ(launcher_.told.back(), "a -> ip-of-b:4002 /dev/shm/c-b");
}

TEST_F(CommitReplicasTest, OneHolderPushesToEachOfSeveralKeepersAndDroppingOneStopsOnlyIt) {
  CommitReplicas r = make(2);
  launcher_.ports = {{"b", 4000}, {"c", 4001}};
  tick(r, {"a"}, {"b", "c"});
  EXPECT_EQ(launcher_.told, (std::vector<std::string>{"a -> ip-of-b:4000 /dev/shm/c-b",
                                                      "a -> ip-of-c:4001 /dev/shm/c-c"}));
  // c runs a worker now: a and c hold every commit, b keeps the third copy.
  tick(r, {"a", "c"}, {"b"});
  EXPECT_EQ(launcher_.told.back(), "a stops ip-of-c");
  EXPECT_EQ(launcher_.unkept, std::vector<std::string>{"c keeps its replicas"});
  EXPECT_EQ(r.serving(), (std::map<std::string, std::string>{{"b", "a"}}));
}

TEST_F(CommitReplicasTest, AKeeperThatBecomesAHolderIsDroppedAndItsPusherStopped) {
  CommitReplicas r = make(1);
  launcher_.ports["b"] = 4000;
  tick(r, {"a"}, {"b"});
  ASSERT_EQ(launcher_.told.size(), 1u);
  // b runs a worker now: both hold every commit. Its keeper ends at once;
  // its replica stays until its own workers hold a commit as new (it may be
  // what they restore from).
  tick(r, {"a", "b"}, {});
  EXPECT_EQ(launcher_.told.back(), "a stops ip-of-b");
  EXPECT_EQ(launcher_.unkept, std::vector<std::string>{"b keeps its replicas"});
  EXPECT_TRUE(r.serving().empty());
  EXPECT_TRUE(records_.back().empty()) << "the driver's record names no keeper any more";
}

// A job taken over: the keeper its record names (c, not the first spare b)
// stays the keeper, with its holder; its agent is asked again (KEEP answers
// with the running keeper's port) and its holder told again.
TEST_F(CommitReplicasTest, ATakenOverJobKeepsTheKeepersItsRecordNames) {
  CommitReplicas fresh = make(1);
  tick(fresh, {"a"}, {"b", "c"});
  ASSERT_EQ(records_.back(), (std::map<std::string, std::string>{{"b", "a"}})) << "the first spare, untaken-over";
  launcher_.asked.clear();
  CommitReplicas r = make(1, {{"c", "a"}});
  EXPECT_EQ(r.keepers(), (std::map<std::string, std::string>{{"c", "a"}}));
  launcher_.ports["c"] = 4100;
  tick(r, {"a"}, {"b", "c"});
  EXPECT_EQ(launcher_.asked, std::vector<std::string>{"c /dev/shm/c-c s3cret"});
  EXPECT_EQ(launcher_.told, std::vector<std::string>{"a -> ip-of-c:4100 /dev/shm/c-c"});
  EXPECT_EQ(records_.back(), (std::map<std::string, std::string>{{"c", "a"}}));
  EXPECT_TRUE(launcher_.unkept.empty());
}

TEST_F(CommitReplicasTest, ASpareNoLongerNeededForgetsItsReplicasAfterAMinuteUnlessWantedAgain) {
  CommitReplicas r = make(1);
  launcher_.ports = {{"b", 4000}};
  tick(r, {"a"}, {"b", "c"});
  ASSERT_EQ(launcher_.told, std::vector<std::string>{"a -> ip-of-b:4000 /dev/shm/c-b"});
  // c runs a worker now: a and c hold every commit, b is not needed. Its
  // pusher stops at once, but its replica stays a minute: c's workers may
  // not have synced the commit yet.
  tick(r, {"a", "c"}, {"b"});
  EXPECT_EQ(launcher_.told.back(), "a stops ip-of-b");
  EXPECT_TRUE(r.serving().empty());
  clock_.advance(std::chrono::seconds(59));
  tick(r, {"a", "c"}, {"b"});
  EXPECT_TRUE(launcher_.unkept.empty());
  const size_t asked = launcher_.asked.size();
  EXPECT_EQ(asked, 1u);  // KEEP is not repeated to a keeper being retired
  // Wanted again before the minute is over (c lost): it keeps, and a pushes
  // to it again.
  tick(r, {"a"}, {"b"});
  EXPECT_EQ(launcher_.told.back(), "a -> ip-of-b:4000 /dev/shm/c-b");
  EXPECT_TRUE(launcher_.unkept.empty());
  // Not needed again: a minute later it is told to forget its replicas.
  tick(r, {"a", "c"}, {"b"});
  clock_.advance(std::chrono::seconds(30));
  tick(r, {"a", "c"}, {"b"});
  EXPECT_TRUE(launcher_.unkept.empty());
  clock_.advance(std::chrono::seconds(31));
  tick(r, {"a", "c"}, {"b"});
  EXPECT_EQ(launcher_.unkept, std::vector<std::string>{"b forgets"});
  tick(r, {"a", "c"}, {"b"});
  EXPECT_EQ(launcher_.unkept.size(), 1u);
}

TEST_F(CommitReplicasTest, TheMinuteStartsAgainWhenTheHoldersChange) {
  CommitReplicas r = make(1);
  launcher_.ports = {{"b", 4000}};
  tick(r, {"a"}, {"b"});
  tick(r, {"a", "c"}, {"b"});  // b retiring
  clock_.advance(std::chrono::seconds(50));
  // c is lost and d joins: d's workers have not synced yet.
  tick(r, {"a", "d"}, {"b"});
  clock_.advance(std::chrono::seconds(11));
  tick(r, {"a", "d"}, {"b"});
  EXPECT_TRUE(launcher_.unkept.empty()) << "forgot 11 s after new holders came";
  clock_.advance(std::chrono::seconds(50));
  tick(r, {"a", "d"}, {"b"});
  EXPECT_EQ(launcher_.unkept, std::vector<std::string>{"b forgets"});
}

TEST_F(CommitReplicasTest, ASurplusKeeperThatIsStillASpareIsRetiredToo) {
  // Two replicas over one holder: b and c keep. A second holder makes c's
  // copy surplus, although the holders alone are still too few.
  CommitReplicas r = make(2);
  launcher_.ports = {{"b", 4000}, {"c", 4001}};
  tick(r, {"a"}, {"b", "c"});
  tick(r, {"a", "d"}, {"b", "c"});
  EXPECT_EQ(r.serving(), (std::map<std::string, std::string>{{"b", "a"}}));
  EXPECT_TRUE(launcher_.unkept.empty());
  clock_.advance(std::chrono::seconds(61));
  tick(r, {"a", "d"}, {"b", "c"});
  EXPECT_EQ(launcher_.unkept, std::vector<std::string>{"c forgets"});
  // A keeper that leaves the spares is told at once, and keeps its replicas
  // (it may come back while they are the newest).
  tick(r, {"a", "d"}, {"c"});
  EXPECT_EQ(launcher_.unkept.back(), "b keeps its replicas");
}

TEST_F(CommitReplicasTest, WithoutHoldersNothingChangesForTheKeepers) {
  CommitReplicas r = make(1);
  launcher_.ports = {{"b", 4000}};
  tick(r, {"a"}, {"b"});
  ASSERT_EQ(launcher_.told.size(), 1u);
  // A plan without holders (the driver keeps the last plan's hosts, so
  // this is a guard): b's replica may be the only copy, b stays a keeper.
  tick(r, {}, {"b"});
  clock_.advance(std::chrono::seconds(120));
  tick(r, {}, {"b"});
  EXPECT_TRUE(launcher_.unkept.empty());
  EXPECT_EQ(r.serving(), (std::map<std::string, std::string>{{"b", "a"}}));
  // The next generation runs on b: it is a holder now, and keeps its
  // replica for its workers to restore.
  tick(r, {"b"}, {});
  EXPECT_EQ(launcher_.unkept, std::vector<std::string>{"b keeps its replicas"});
}

TEST_F(CommitReplicasTest, ALostOrRefusingKeeperIsAskedAgainAfterAWaitThatDoubles) {
  CommitReplicas r = make(1);
  launcher_.ports["b"] = 0;  // could not keep
  tick(r, {"a"}, {"b"});
  tick(r, {"a"}, {"b"});
  EXPECT_EQ(launcher_.asked.size(), 1u);
  EXPECT_TRUE(launcher_.told.empty());
  clock_.advance(std::chrono::seconds(6));
  launcher_.ports["b"] = 4001;
  tick(r, {"a"}, {"b"});
  EXPECT_EQ(launcher_.asked.size(), 2u);
  EXPECT_EQ(launcher_.told, std::vector<std::string>{"a -> ip-of-b:4001 /dev/shm/c-b"});
  // Its agent lost: the pusher stops, and b is asked again after 5 s.
  launcher_.ports["b"] = 0;
  tick(r, {"a"}, {"b"});
  EXPECT_EQ(launcher_.told.back(), "a stops ip-of-b");
  tick(r, {"a"}, {"b"});
  EXPECT_EQ(launcher_.asked.size(), 2u);
  clock_.advance(std::chrono::seconds(6));
  launcher_.ports.erase("b");
  tick(r, {"a"}, {"b"});
  EXPECT_EQ(launcher_.asked.size(), 3u);
  // A launcher without agents cannot keep: each failure doubles the wait, 5 s, then 10 s.
  launcher_.can_start = false;
  CommitReplicas other = make(1);
  tick(other, {"a"}, {"b"});
  tick(other, {"a"}, {"b"});
  EXPECT_EQ(launcher_.asked.size(), 4u);
  clock_.advance(std::chrono::seconds(6));
  tick(other, {"a"}, {"b"});
  EXPECT_EQ(launcher_.asked.size(), 5u);
  clock_.advance(std::chrono::seconds(6));
  tick(other, {"a"}, {"b"});
  EXPECT_EQ(launcher_.asked.size(), 5u);
  clock_.advance(std::chrono::seconds(5));
  tick(other, {"a"}, {"b"});
  EXPECT_EQ(launcher_.asked.size(), 6u);
}

}  // namespace
}  // namespace erun
