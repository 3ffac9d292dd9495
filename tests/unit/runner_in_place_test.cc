// The driver's in-place decisions over FakeMembership, FakeDiscovery,
// FakeLauncher and FakeClock: a frozen worker reported by the survivors, the
// survivors below --min-np, re-join reasons, retiring slots, the re-join
// deadline. No process, no socket, no sleep.
#include <algorithm>
#include <gtest/gtest.h>
#include <signal.h>

#include <map>
#include <set>
#include <iterator>
#include <fstream>
#include <filesystem>

#include "discovery/discovery.h"
#include "rendezvous/fake_membership.h"
#include "runner/driver.h"
#include "runner/observe/event_log.h"
#include "runner/launch/fake_launcher.h"

namespace erun {
namespace {

using Worker = std::shared_ptr<FakeLauncher::Worker>;

const SlotKey a0{"a", 0}, a1{"a", 1}, a2{"a", 2}, a3{"a", 3}, b0{"b", 0}, c0{"c", 0};

class InPlaceTest : public ::testing::Test {
 protected:
  DriverOptions elastic(int np, int min_np, int max_np) {
    DriverOptions o;
    o.command = {"./train"};
    o.term_grace = std::chrono::milliseconds(10);
    o.np = np;
    o.min_np = min_np;
    o.max_np = max_np;
    o.elastic = true;
    o.discovery_interval = std::chrono::seconds(1);
    o.elastic_timeout = std::chrono::seconds(30);
    o.rendezvous_timeout = std::chrono::seconds(20);
    o.blacklist_after = 5;
    return o;
  }
  void make(DriverOptions o) {
    DriverDeps d;
    d.discovery = &discovery;
    d.local_launcher = &launcher;
    d.clock = &clock;
    d.membership = &membership;
    d.rendezvous_port = 1234;
    d.synchronous_discovery = true;
    d.job_id = "job";
    d.secret = "s3cret";
    driver = std::make_unique<Driver>(o, d);
  }
  // Starts the job and lets every rank of generation 1 join it.
  void start_joined(DriverOptions o) {
    make(o);
    ASSERT_TRUE(driver->start());
    EXPECT_FALSE(steps(1));
    membership.join_all();
    EXPECT_FALSE(steps(1));
    ASSERT_EQ(driver->record().generation, 1);
  }
  std::optional<int> steps(int n) {
    for (int i = 0; i < n; ++i) {
      if (auto c = driver->step()) return c;
      clock.advance(std::chrono::milliseconds(100));
    }
    return std::nullopt;
  }
  static SlotKey slot_of(const Worker& w) {
    std::string host;
    int index = -1;
    for (auto& [k, v] : w->spec.env) {
      if (k == "ERUN_HOSTNAME") host = v;
      if (k == "ERUN_LOCAL_INDEX") index = std::stoi(v);
    }
    return SlotKey{host, index};
  }
  Worker worker_at(const SlotKey& slot) {
    for (auto& w : launcher.running()) {
      if (slot_of(w) == slot) return w;
    }
    return nullptr;
  }
  // The surviving workers of `slots` leave generation `left` after a failed
  // collective, naming `failed_rank` (or none).
  void survivors_rejoin(const std::vector<SlotKey>& slots, long left, int failed_rank = -1,
                        PeerState state = PeerState::kUnknown) {
    for (auto& s : slots) membership.join(s, left, JoinReason::kPeerLost, failed_rank, state, 7);
  }
  // elastic(), with a host blacklisted at its first failure for 600 s.
  DriverOptions blacklisting_at_once(int np, int min_np, int max_np) {
    DriverOptions o = elastic(np, min_np, max_np);
    o.blacklist_after = 1;
    o.cooldown_min_s = o.cooldown_max_s = 600;
    return o;
  }
  // The standby that starts on `slot`, once it waits in the rendezvous.
  Worker ready_standby(const SlotKey& slot) {
    EXPECT_FALSE(steps(1));
    Worker standby = worker_at(slot);
    if (!standby) return nullptr;
    membership.join(slot, -1);
    EXPECT_FALSE(steps(1));
    return standby;
  }
  // Rank `rank` of generation 1, on `slot`, fails (exit code 1) and the
  // `survivors` report it dead.
  void fail_in_first_generation(const SlotKey& slot, int rank, const std::vector<SlotKey>& survivors) {
    launcher.finish(worker_at(slot), ExitStatus{1, 0});
    survivors_rejoin(survivors, 1, rank, PeerState::kDead);
  }

  // Three ranks on host a; a2 is SIGKILLed and the others report it: with
  // --min-np `min_np` (at most 2) they go on alone in generation 2 while a2's
  // replacement starts.
  void lose_a2(int min_np) {
    discovery.set(HostSet({{"a", 3}}));
    start_joined(elastic(3, min_np, 3));
    launcher.finish(worker_at(a2), ExitStatus{0, SIGKILL});
    survivors_rejoin({a0, a1}, 1, 2, PeerState::kDead);
    EXPECT_FALSE(steps(1));
  }

  // a:2 and b:2 joined; then b leaves discovery: generation 2 is a's, and
  // b's workers retire (they leave at the commit the others re-join at).
  void b_leaves() {
    discovery.set(HostSet({{"a", 2}, {"b", 2}}));
    start_joined(elastic(4, 1, 4));
    discovery.set(HostSet({{"a", 2}}));
    clock.advance(std::chrono::seconds(1));
    EXPECT_FALSE(steps(1));
    ASSERT_EQ(driver->record().generation, 2);
  }

  FakeDiscovery discovery;
  FakeLauncher launcher;
  FakeClock clock;
  FakeMembership membership;
  std::unique_ptr<Driver> driver;
};

TEST_F(InPlaceTest, FrozenWorkerReportedBySurvivorsIsKilledAndLeftOutAtOnce) {
  discovery.set(HostSet({{"a", 4}}));
  start_joined(elastic(4, 2, 4));
  Worker frozen = worker_at(a3);
  ASSERT_TRUE(frozen);
  launcher.set_obey_kill(false);  // it does not even die: the driver must not wait for it

  // One survivor timed out on rank 3 and saw its process alive; the others
  // only know that a peer was lost.
  membership.join(a0, 1, JoinReason::kPeerLost, 3, PeerState::kAlive, 7);
  survivors_rejoin({a1, a2}, 1);
  EXPECT_FALSE(steps(1));

  EXPECT_TRUE(frozen->killed);
  EXPECT_EQ(driver->record().generation, 2);
  ASSERT_EQ(membership.published().back(), 2);
  // The survivors are members of generation 2 at once; slot 3 gets a new worker.
  for (auto& s : {a0, a1, a2}) EXPECT_TRUE(membership.is_member(s)) << s.local_index;
  ASSERT_EQ(launcher.launched().size(), 5u);
  EXPECT_EQ(slot_of(launcher.launched().back()), a3);
  EXPECT_NE(launcher.launched().back(), frozen);
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(launcher.launched()[static_cast<size_t>(i)]->terminated);

  // The survivors went on alone; the replacement joins, and they grow.
  EXPECT_EQ(membership.ranks().size(), 3u);
  membership.join(a3, -1);
  EXPECT_FALSE(steps(2));
  EXPECT_EQ(driver->record().generation, 3);
  EXPECT_EQ(membership.ranks().size(), 4u);
  launcher.finish(frozen, ExitStatus{0, SIGKILL});
  for (auto& w : launcher.running()) launcher.finish(w, ExitStatus{0, 0});
  EXPECT_EQ(steps(3), 0);  // the frozen worker's kill is not the job's failure
}

// a:2, b:1 and b0 frozen: a0 (the host leader) times out on it over the
// network and re-joins; a1, waiting on a0 in shared memory, names a0 alive
// but not arriving. a0 re-joined, so it is not stopped: it stays, and b0
// alone is left out, whichever of the two re-joins the driver's look has
// first.
TEST_F(InPlaceTest, ARankNamedAliveThatReJoinedItselfStays) {
  for (bool leader_first : {true, false}) {
    SCOPED_TRACE(leader_first ? "the leader's re-join first" : "the follower's report first");
    discovery.set(HostSet({{"a", 2}, {"b", 1}}));
    start_joined(elastic(3, 2, 3));
    Worker leader = worker_at(a0);
    Worker frozen = worker_at(b0);
    ASSERT_TRUE(leader && frozen);
    auto leader_rejoins = [&] { membership.join(a0, 1, JoinReason::kPeerLost, 2, PeerState::kSilent, 7); };
    if (leader_first) leader_rejoins();
    membership.join(a1, 1, JoinReason::kPeerLost, 0, PeerState::kAlive, 7);
    if (!leader_first) leader_rejoins();
    EXPECT_FALSE(steps(1));
    EXPECT_FALSE(leader->killed);
    EXPECT_TRUE(frozen->killed);
    EXPECT_EQ(driver->record().generation, 2);
    EXPECT_TRUE(membership.is_member(a0));
    EXPECT_TRUE(membership.is_member(a1));
    driver.reset();
    launcher = FakeLauncher();
    membership = FakeMembership();
  }
}

TEST_F(InPlaceTest, AReportAboutAnOlderGenerationDoesNotKillTheReplacement) {
  discovery.set(HostSet({{"a", 4}}));
  start_joined(elastic(4, 2, 4));
  membership.join(a0, 1, JoinReason::kPeerLost, 3, PeerState::kAlive, 7);
  EXPECT_FALSE(steps(1));
  ASSERT_EQ(driver->record().generation, 2);
  Worker replacement = worker_at(a3);
  ASSERT_TRUE(replacement);
  // A late report from another survivor about generation 1's rank 3.
  membership.join(a1, 1, JoinReason::kPeerLost, 3, PeerState::kAlive, 7);
  membership.join(a3, -1);
  EXPECT_FALSE(steps(1));
  EXPECT_FALSE(replacement->killed);
}

TEST_F(InPlaceTest, ReportAboutAMemberOfTheNewGenerationReformsWithoutIt) {
  // Generation 2 was re-formed with every live worker (no rank was named);
  // then a survivor names rank 2 of generation 2: generation 3 leaves it out.
  discovery.set(HostSet({{"a", 3}}));
  start_joined(elastic(3, 1, 3));
  survivors_rejoin({a0, a1}, 1);
  EXPECT_FALSE(steps(1));
  ASSERT_EQ(driver->record().generation, 2);  // re-formed: same three workers
  EXPECT_EQ(launcher.launched().size(), 3u);
  Worker stuck = worker_at(a2);
  membership.join(a0, 2, JoinReason::kFormFailed, 2, PeerState::kUnknown, 7);
  EXPECT_FALSE(steps(1));
  EXPECT_TRUE(stuck->killed);
  EXPECT_EQ(driver->record().generation, 3);
  EXPECT_EQ(launcher.launched().size(), 4u);  // slot 2 relaunched
}

TEST_F(InPlaceTest, AFailureTellsTheMembersOfTheFailedGenerationAtOnce) {
  // Survivors may be forming generation 1 still, waiting for the dead
  // worker's pair connection: they are told that generation 1 is over.
  discovery.set(HostSet({{"a", 1}, {"b", 1}, {"c", 1}}));
  start_joined(elastic(3, 1, 3));
  EXPECT_TRUE(membership.notified().empty());
  launcher.finish(worker_at(c0), ExitStatus{0, SIGKILL});
  EXPECT_FALSE(steps(1));
  EXPECT_EQ(driver->record().generation, 2);
  EXPECT_EQ(membership.notified(), std::vector<long>{1});
}

TEST_F(InPlaceTest, ReJoinWithoutAReportReformsWithTheSameWorkers) {
  discovery.set(HostSet({{"a", 2}}));
  start_joined(elastic(2, 1, 2));
  survivors_rejoin({a0}, 1);
  EXPECT_FALSE(steps(1));
  EXPECT_EQ(driver->record().generation, 2);
  EXPECT_EQ(launcher.launched().size(), 2u);
  EXPECT_TRUE(launcher.running().size() == 2u);
}

TEST_F(InPlaceTest, HostsUpdatedReJoinsDoNotExcludeAnyone) {
  discovery.set(HostSet({{"a", 2}}));
  start_joined(elastic(2, 1, 4));
  discovery.set(HostSet({{"a", 2}, {"b", 1}}));
  clock.advance(std::chrono::seconds(1));
  EXPECT_FALSE(steps(1));
  // The new worker starts while the others train; announced once it waits.
  EXPECT_EQ(driver->record().generation, 1);
  EXPECT_TRUE(membership.notified().empty());
  EXPECT_EQ(driver->record().resets, 0);
  membership.join(b0, -1);
  EXPECT_FALSE(steps(1));
  ASSERT_EQ(driver->record().generation, 2);
  ASSERT_EQ(membership.notified(), std::vector<long>{1});
  EXPECT_EQ(driver->record().resets, 1);
  // A hosts-updated re-join never names a failed rank that the driver acts on.
  membership.join(a0, 1, JoinReason::kHostsUpdated, 1, PeerState::kAlive, 7);
  membership.join(a1, 1, JoinReason::kHostsUpdated);
  EXPECT_FALSE(steps(1));
  EXPECT_EQ(driver->record().generation, 2);
  EXPECT_FALSE(worker_at(a1)->killed);
  EXPECT_EQ(launcher.launched().size(), 3u);
}

TEST_F(InPlaceTest, SurvivorsBelowMinNpWaitInTheRendezvousAndGoOnWhenSlotsReturn) {
  discovery.set(HostSet({{"a", 1}, {"b", 1}, {"c", 1}}));
  start_joined(elastic(3, 3, 3));
  // c leaves and its worker dies: 2 slots, fewer than --min-np 3.
  discovery.set(HostSet({{"a", 1}, {"b", 1}}));
  clock.advance(std::chrono::seconds(1));
  launcher.finish(worker_at(c0), ExitStatus{1, 0});
  survivors_rejoin({a0, b0}, 1);
  EXPECT_FALSE(steps(100));  // 10 s
  EXPECT_EQ(driver->record().generation, 1);
  ASSERT_EQ(launcher.running().size(), 2u);
  for (auto& w : launcher.running()) EXPECT_FALSE(w->terminated);
  EXPECT_TRUE(membership.is_waiting(a0));
  // c returns: the survivors go on in generation 2 with a new worker on c.
  discovery.set(HostSet({{"a", 1}, {"b", 1}, {"c", 1}}));
  EXPECT_FALSE(steps(15));
  EXPECT_EQ(driver->record().generation, 2);
  EXPECT_TRUE(membership.is_member(a0));
  EXPECT_TRUE(membership.is_member(b0));
  EXPECT_EQ(launcher.launched().size(), 4u);
  EXPECT_EQ(launcher.running().size(), 3u);
}

TEST_F(InPlaceTest, SurvivorsBelowMinNpAreStoppedOnlyAfterTheElasticTimeout) {
  discovery.set(HostSet({{"a", 1}, {"b", 1}}));
  start_joined(elastic(2, 2, 2));
  discovery.set(HostSet({{"a", 1}}));
  clock.advance(std::chrono::seconds(1));
  launcher.finish(worker_at(b0), ExitStatus{1, 0});
  survivors_rejoin({a0}, 1);
  EXPECT_FALSE(steps(250));  // 25 s of the 30 s
  EXPECT_FALSE(launcher.running().front()->terminated);
  auto code = steps(100);
  ASSERT_TRUE(code);
  EXPECT_EQ(*code, 1);
  EXPECT_TRUE(launcher.running().empty());
}

TEST_F(InPlaceTest, ABlacklistedHostWhoseSurvivorsLiveKeepsThemInPlace) {
  discovery.set(HostSet({{"a", 4}}));
  start_joined(blacklisting_at_once(4, 2, 4));
  Worker frozen = worker_at(a2);
  membership.join(a0, 1, JoinReason::kPeerLost, 2, PeerState::kAlive, 7);
  survivors_rejoin({a1, a3}, 1);
  EXPECT_FALSE(steps(1));
  EXPECT_TRUE(driver->host_manager().is_blacklisted("a"));
  EXPECT_EQ(driver->record().generation, 2);
  for (auto& s : {a0, a1, a3}) {
    EXPECT_TRUE(membership.is_member(s));
    EXPECT_FALSE(worker_at(s)->terminated);
  }
  EXPECT_TRUE(frozen->killed);
  // The host keeps its survivors, but no new worker while it sits out: the
  // frozen worker's slot stays empty, and the job stays at 3.
  EXPECT_FALSE(steps(50));
  EXPECT_FALSE(worker_at(a2)) << "a new worker on a blacklisted host";
  EXPECT_EQ(driver->record().generation, 2);
  EXPECT_EQ(launcher.launched().size(), 4u);
  // Its cooldown over, the slot grows the job again.
  clock.advance(std::chrono::seconds(600));
  EXPECT_FALSE(steps(3));
  EXPECT_FALSE(driver->host_manager().is_blacklisted("a"));
  EXPECT_TRUE(worker_at(a2)) << "the slot did not return after the cooldown";
}

TEST_F(InPlaceTest, ABlacklistedHostsFreeSlotsGoToOtherHostsUnderMaxNp) {
  // a:2 b:2 with --max-np 3 (a0, a1, b0); a1 fails and a is blacklisted.
  // The plan keeps a0 (a survivor) and takes b1, not a's free slot.
  discovery.set(HostSet({{"a", 2}, {"b", 2}}));
  auto o = blacklisting_at_once(3, 2, 3);
  o.standby = 0;  // b1 is free, not a standby's
  start_joined(o);
  ASSERT_TRUE(worker_at(a1));
  ASSERT_FALSE(worker_at(SlotKey{"b", 1}));
  fail_in_first_generation(a1, 1, {a0, b0});
  EXPECT_FALSE(steps(20));
  EXPECT_TRUE(driver->host_manager().is_blacklisted("a"));
  EXPECT_FALSE(worker_at(a0)->terminated);
  EXPECT_FALSE(worker_at(a1)) << "a new worker on a blacklisted host";
  EXPECT_TRUE(worker_at(SlotKey{"b", 1})) << "the free place went nowhere";
}

TEST_F(InPlaceTest, WhenNoWorkerHoldsACommitTheJobRestartsFromScratch) {
  discovery.set(HostSet({{"a", 1}, {"b", 1}}));
  start_joined(elastic(2, 2, 2));
  discovery.set(HostSet({{"a", 1}}));
  clock.advance(std::chrono::seconds(1));
  for (auto& w : launcher.running()) launcher.finish(w, ExitStatus{1, 0});
  EXPECT_FALSE(steps(5));
  discovery.set(HostSet({{"a", 1}, {"b", 1}}));
  EXPECT_FALSE(steps(15));
  EXPECT_EQ(driver->record().generation, 2);
  EXPECT_EQ(launcher.launched().size(), 4u);  // both started again
}

TEST_F(InPlaceTest, SlotsThatLeaveAreRetiredOnceTheirWorkersReJoin) {
  ASSERT_NO_FATAL_FAILURE(b_leaves());
  EXPECT_EQ(membership.notified(), std::vector<long>{1});
  Worker leaving = worker_at(SlotKey{"b", 1});
  ASSERT_TRUE(leaving);
  EXPECT_FALSE(leaving->terminated);
  for (auto& s : {a0, a1, SlotKey{"b", 1}}) membership.join(s, 1, JoinReason::kHostsUpdated);
  EXPECT_FALSE(steps(1));
  EXPECT_TRUE(leaving->terminated);
  // The other leaving worker never re-joins: stopped at the rendezvous timeout.
  Worker silent = worker_at(b0);
  ASSERT_TRUE(silent);
  EXPECT_FALSE(steps(150));
  EXPECT_FALSE(silent->terminated);
  EXPECT_FALSE(steps(60));
  EXPECT_TRUE(silent->terminated);
}

// After a failure a retiring worker (its host left discovery) is stopped at
// once: its generation is broken and the next one restores the last commit
// without it, so it does not train on until its next re-join.
TEST_F(InPlaceTest, AfterAFailureAWorkerOfASlotThatLeftIsStoppedAtOnce) {
  ASSERT_NO_FATAL_FAILURE(b_leaves());
  Worker leaving0 = worker_at(b0), leaving1 = worker_at(SlotKey{"b", 1});
  ASSERT_TRUE(leaving0 && leaving1);
  EXPECT_FALSE(leaving0->terminated);
  // a1 dies before the commit the others would re-join at.
  launcher.finish(worker_at(a1), ExitStatus{0, SIGKILL});
  survivors_rejoin({a0}, 1, 1, PeerState::kDead);
  EXPECT_FALSE(steps(1));
  EXPECT_TRUE(leaving0->terminated);
  EXPECT_TRUE(leaving1->terminated);
  EXPECT_FALSE(worker_at(a0)->terminated);
}

// A standby still starting when a member is lost: the survivor goes on
// alone and a cold replacement starts. The standby, ready first, takes the
// replacement's place (the job grows back through it) and the cold worker
// is stopped, no failure.
TEST_F(InPlaceTest, AStandbyReadyBeforeTheColdReplacementTakesItsPlace) {
  discovery.set(HostSet({{"a", 3}}));
  start_joined(elastic(2, 1, 2));
  EXPECT_FALSE(steps(1));
  Worker standby = worker_at(a2);
  ASSERT_TRUE(standby) << "no standby on the free slot";
  launcher.finish(worker_at(a0), ExitStatus{0, SIGKILL});
  survivors_rejoin({a1}, 1, 0, PeerState::kDead);
  EXPECT_FALSE(steps(1));
  ASSERT_EQ(driver->record().generation, 2);
  ASSERT_EQ(membership.ranks().size(), 1u) << "the survivor goes on alone";
  Worker cold = worker_at(a0);
  ASSERT_TRUE(cold);
  EXPECT_FALSE(steps(5));
  EXPECT_EQ(driver->record().generation, 2);
  membership.join(a2, -1);  // the standby reaches its join first
  EXPECT_FALSE(steps(3));
  EXPECT_TRUE(cold->terminated);
  EXPECT_FALSE(standby->terminated);
  ASSERT_EQ(driver->record().generation, 3);
  ASSERT_EQ(membership.ranks().size(), 2u);
  EXPECT_TRUE(membership.is_member(a2));
  std::set<SlotKey> planned;
  for (auto& r : membership.ranks()) planned.insert(r.slot);
  EXPECT_EQ(planned, (std::set<SlotKey>{a1, a2}));
  EXPECT_EQ(driver->record().resets, 1);
  EXPECT_FALSE(steps(5));
  EXPECT_EQ(driver->record().generation, 3) << "the stopped replacement is no failure";
}

// A ready standby on a host that a failure blacklists, where a survivor
// stays: it takes no place (not the failed worker's, nor any other) and is
// stopped; the job goes on without the host's free slots.
TEST_F(InPlaceTest, AStandbyOnAHostThatIsBlacklistedIsStoppedNotPromoted) {
  const SlotKey b1{"b", 1}, b2{"b", 2};
  discovery.set(HostSet({{"a", 2}, {"b", 3}}));
  start_joined(blacklisting_at_once(4, 2, 4));
  Worker standby = ready_standby(b2);
  ASSERT_TRUE(standby) << "no standby on the free slot";
  fail_in_first_generation(b1, 3, {a0, a1, b0});
  EXPECT_FALSE(steps(2));
  EXPECT_TRUE(driver->host_manager().is_blacklisted("b"));
  ASSERT_EQ(driver->record().generation, 2);
  std::set<SlotKey> planned;
  for (auto& r : membership.ranks()) planned.insert(r.slot);
  EXPECT_EQ(planned, (std::set<SlotKey>{a0, a1, b0}));
  EXPECT_TRUE(standby->terminated) << "a standby kept on a blacklisted host";
  EXPECT_FALSE(steps(20));
  EXPECT_FALSE(worker_at(b1));
  EXPECT_FALSE(worker_at(b2));
  EXPECT_FALSE(worker_at(b0)->terminated);
}

// A ready standby on a blacklisted host takes no place on another host
// either: the free slot elsewhere gets a cold worker of its own.
TEST_F(InPlaceTest, AStandbyOnABlacklistedHostDoesNotTakeAFreePlaceElsewhere) {
  const SlotKey b1{"b", 1}, b2{"b", 2};
  discovery.set(HostSet({{"a", 2}, {"b", 3}, {"c", 1}}));
  start_joined(blacklisting_at_once(4, 2, 4));
  Worker standby = ready_standby(b2);
  ASSERT_TRUE(standby) << "no standby beside the members";
  fail_in_first_generation(b1, 3, {a0, a1, b0});
  EXPECT_FALSE(steps(2));
  ASSERT_TRUE(driver->host_manager().is_blacklisted("b"));
  EXPECT_FALSE(membership.is_member(b2)) << "the standby on the blacklisted host became a member";
  EXPECT_TRUE(standby->terminated);
  Worker cold = worker_at(c0);
  ASSERT_TRUE(cold) << "c's free slot got no worker";
  membership.join(c0, -1);
  EXPECT_FALSE(steps(3));
  EXPECT_TRUE(membership.is_member(c0));
  EXPECT_FALSE(membership.is_member(b2));
}

// A host's cooldown ends while the plan stays the same (--max-np reached):
// its free slot gets a standby again.
TEST_F(InPlaceTest, AStandbyReturnsToABlacklistedHostsSlotAfterItsCooldown) {
  const SlotKey b1{"b", 1};
  discovery.set(HostSet({{"a", 2}, {"b", 2}}));
  start_joined(blacklisting_at_once(3, 2, 3));
  ASSERT_TRUE(ready_standby(b1)) << "no standby on the free slot";
  fail_in_first_generation(a1, 1, {a0, b0});
  EXPECT_FALSE(steps(5));
  ASSERT_TRUE(driver->host_manager().is_blacklisted("a"));
  EXPECT_TRUE(membership.is_member(b1)) << "the standby took a1's place";
  EXPECT_FALSE(worker_at(a1)) << "a standby on a blacklisted host";
  clock.advance(std::chrono::seconds(600));
  EXPECT_FALSE(steps(3));
  EXPECT_FALSE(driver->host_manager().is_blacklisted("a"));
  EXPECT_TRUE(worker_at(a1)) << "no standby after the cooldown";
  EXPECT_FALSE(membership.is_member(a1)) << "a standby, not a member: the plan is at --max-np";
}

// The plan a joined replacement enters keeps its slot, even where a lower
// free slot holds a standby that is still starting.
TEST_F(InPlaceTest, AJoinedReplacementKeepsItsSlotOverALowerOneOfAStartingStandby) {
  discovery.set(HostSet({{"a", 3}}));
  start_joined(elastic(2, 1, 2));
  EXPECT_FALSE(steps(1));
  ASSERT_TRUE(worker_at(a2));
  membership.join(a2, -1);
  EXPECT_FALSE(steps(1));  // the standby is ready
  // a0 lost: the ready standby takes its place at once.
  launcher.finish(worker_at(a0), ExitStatus{0, SIGKILL});
  survivors_rejoin({a1}, 1, 0, PeerState::kDead);
  EXPECT_FALSE(steps(1));
  ASSERT_EQ(driver->record().generation, 2);
  ASSERT_EQ(membership.ranks().size(), 2u);
  EXPECT_TRUE(membership.is_member(a2));
  EXPECT_FALSE(steps(2));
  Worker second_standby = worker_at(a0);
  ASSERT_TRUE(second_standby) << "no new standby on the freed slot";
  // a1 lost while that standby still starts: a cold replacement on a1.
  int a1_rank = -1;
  for (auto& r : membership.ranks()) {
    if (r.slot == a1) a1_rank = r.rank;
  }
  launcher.finish(worker_at(a1), ExitStatus{0, SIGKILL});
  survivors_rejoin({a2}, 2, a1_rank, PeerState::kDead);
  EXPECT_FALSE(steps(1));
  ASSERT_EQ(driver->record().generation, 3);
  Worker cold = worker_at(a1);
  ASSERT_TRUE(cold);
  membership.join(a1, -1);
  EXPECT_FALSE(steps(2));
  ASSERT_EQ(driver->record().generation, 4);
  EXPECT_TRUE(membership.is_member(a1));
  EXPECT_FALSE(membership.is_member(a0));
  EXPECT_FALSE(cold->terminated);
  EXPECT_FALSE(second_standby->terminated) << "still the standby";
}

// A standby goes to a free slot of a host that runs members first; only
// when none has one, to a spare host (beyond --max-np), where a ready one
// takes a lost member's place as well (the next test).
TEST_F(InPlaceTest, AStandbyGoesToAMembersHostFirstThenToASpareHost) {
  discovery.set(HostSet({{"a", 3}, {"b", 1}}));
  start_joined(elastic(2, 1, 2));
  EXPECT_FALSE(steps(1));
  EXPECT_TRUE(worker_at(a2)) << "no standby on the members' host";
  EXPECT_FALSE(worker_at(b0)) << "a standby on the spare host while the members' host had a free slot";
  EXPECT_EQ(launcher.running().size(), 3u);
}

TEST_F(InPlaceTest, AReadyStandbyOnASpareHostTakesALostMembersPlace) {
  discovery.set(HostSet({{"a", 2}, {"b", 1}, {"c", 1}}));
  start_joined(elastic(2, 1, 2));
  EXPECT_FALSE(steps(1));
  Worker standby = worker_at(b0);
  ASSERT_TRUE(standby) << "no standby on the first spare host";
  EXPECT_FALSE(worker_at(c0)) << "more standbys than --standby's default of 1";
  membership.join(b0, -1);
  EXPECT_FALSE(steps(1));  // ready
  launcher.finish(worker_at(a0), ExitStatus{0, SIGKILL});
  survivors_rejoin({a1}, 1, 0, PeerState::kDead);
  EXPECT_FALSE(steps(1));
  ASSERT_EQ(driver->record().generation, 2);
  ASSERT_EQ(membership.ranks().size(), 2u) << "the spare's standby joins with the survivor";
  EXPECT_TRUE(membership.is_member(b0));
  EXPECT_FALSE(standby->terminated);
  EXPECT_FALSE(steps(2));
  EXPECT_TRUE(worker_at(c0) || worker_at(a0)) << "no new standby after the promotion";
}

// A blacklisted host still keeps, and is sent, replicas: with a alone
// running workers after b's failure blacklisted b, b is the keeper that
// --commit-replicas 1 asks for (there is no usable spare); without the
// blacklisting it would run workers itself.
TEST_F(InPlaceTest, ABlacklistedHostKeepsTheRunningHostsCommits) {
  discovery.set(HostSet({{"a", 1}, {"b", 1}}));
  DriverOptions o = elastic(2, 1, 2);
  o.blacklist_after = 1;
  start_joined(o);
  EXPECT_FALSE(steps(1));
  EXPECT_EQ(launcher.kept().count("b"), 0u) << "b runs a worker: no keeper";
  launcher.finish(worker_at(b0), ExitStatus{1, 0});
  survivors_rejoin({a0}, 1, 1, PeerState::kDead);
  EXPECT_FALSE(steps(3));
  ASSERT_EQ(driver->record().generation, 2);
  ASSERT_EQ(driver->plan().size(), 1);
  EXPECT_FALSE(worker_at(b0)) << "b is blacklisted";
  EXPECT_GE(launcher.kept().count("b") ? launcher.kept().at("b") : 0, 1) << "b keeps no replica of a's commits";
  EXPECT_EQ(launcher.kept().count("a"), 0u);
}

// A retired worker that takes its --term-grace to exit is told to stop once,
// not on every tick while it is still waiting in the rendezvous.
TEST_F(InPlaceTest, ARetiredWorkerIsToldToStopOnce) {
  discovery.set(HostSet({{"a", 2}, {"b", 2}}));
  start_joined(elastic(4, 1, 4));
  launcher.set_obey_terminate(false);
  discovery.set(HostSet({{"a", 2}}));
  clock.advance(std::chrono::seconds(1));
  EXPECT_FALSE(steps(1));
  Worker leaving = worker_at(SlotKey{"b", 1});
  ASSERT_TRUE(leaving);
  for (auto& s : {a0, a1, SlotKey{"b", 1}}) membership.join(s, 1, JoinReason::kHostsUpdated);
  EXPECT_FALSE(steps(20));
  EXPECT_EQ(leaving->terminate_calls, 1);
}

// A host that leaves on notice (its agent said DRAINING) leaves the plan at
// once, with the announcement marked a drain; its workers are stopped once
// they left at a commit. No failure: no blacklist, one membership reset.
TEST_F(InPlaceTest, ADrainingHostLeavesAtTheNextCommitWithNoFailure) {
  discovery.set(HostSet({{"a", 2}, {"b", 2}}));
  start_joined(elastic(4, 1, 4));
  launcher.drain("b", "SIGTERM to the agent");
  EXPECT_FALSE(steps(1));
  ASSERT_EQ(driver->record().generation, 2);
  EXPECT_EQ(driver->plan().size(), 2);
  EXPECT_EQ(membership.drains_notified(), std::vector<long>{1});
  Worker b_0 = worker_at(b0), b_1 = worker_at(SlotKey{"b", 1});
  ASSERT_TRUE(b_0 && b_1);
  EXPECT_FALSE(b_0->terminated);  // still training until the commit
  for (auto& s : {a0, a1, b0, SlotKey{"b", 1}}) membership.join(s, 1, JoinReason::kHostsUpdated);
  EXPECT_FALSE(steps(2));
  EXPECT_TRUE(b_0->terminated);
  EXPECT_TRUE(b_1->terminated);
  EXPECT_FALSE(b_0->killed);
  EXPECT_FALSE(driver->host_manager().is_blacklisted("b"));
  EXPECT_EQ(driver->record().resets, 1);
  EXPECT_TRUE(worker_at(a0) && worker_at(a1)) << "a survivor was stopped";
  // Discovery still lists b: it stays out (no worker is started there).
  const size_t launched = launcher.launched().size();
  clock.advance(std::chrono::seconds(2));
  EXPECT_FALSE(steps(20));
  EXPECT_EQ(launcher.launched().size(), launched);
  EXPECT_EQ(driver->plan().size(), 2);
}

// Workers of a draining host that reach no commit within --drain-timeout
// are killed; a discovery line marked `draining` drains as a notice does,
// and the host grows the job again once listed without the mark.
TEST_F(InPlaceTest, ADrainPastItsTimeoutKillsAndADiscoveryMarkDrainsUntilItIsGone) {
  discovery.set(HostSet({{"a", 1}, {"b", 1}}));
  DriverOptions o = elastic(2, 1, 2);
  o.drain_timeout = std::chrono::seconds(2);
  start_joined(o);
  discovery.set(HostSet({Host{"a", 1}, Host{"b", 1, /*draining=*/true}}));
  clock.advance(std::chrono::seconds(1));
  EXPECT_FALSE(steps(1));
  ASSERT_EQ(driver->record().generation, 2);
  EXPECT_EQ(membership.drains_notified(), std::vector<long>{1});
  Worker b_0 = worker_at(b0);
  ASSERT_TRUE(b_0);
  EXPECT_FALSE(steps(15));  // 1.5 s: b's worker has not committed yet
  EXPECT_FALSE(b_0->killed);
  EXPECT_FALSE(steps(10));
  EXPECT_TRUE(b_0->killed) << "not stopped at --drain-timeout";
  EXPECT_EQ(driver->record().resets, 2) << "the membership change, and the failure";
  // Listed again without the mark: b grows the job again.
  discovery.set(HostSet({{"a", 1}, {"b", 1}}));
  clock.advance(std::chrono::seconds(1));
  EXPECT_FALSE(steps(5));
  Worker again = worker_at(b0);
  ASSERT_TRUE(again) << "b did not grow the job again";
  EXPECT_NE(again, b_0);
}

// Draining below --min-np: the host leaves anyway; the survivors wait in
// the rendezvous with their commit.
TEST_F(InPlaceTest, ADrainBelowMinNpLeavesTheSurvivorsWaitingInTheRendezvous) {
  discovery.set(HostSet({{"a", 1}, {"b", 1}}));
  start_joined(elastic(2, 2, 2));
  launcher.drain("b", "SIGTERM to worker");
  EXPECT_FALSE(steps(1));
  EXPECT_EQ(driver->phase(), JobPhase::kWaitingWithSurvivors);
  EXPECT_EQ(membership.drains_notified(), std::vector<long>{1});
  Worker b_0 = worker_at(b0);
  ASSERT_TRUE(b_0);
  for (auto& s : {a0, b0}) membership.join(s, 1, JoinReason::kHostsUpdated);
  EXPECT_FALSE(steps(2));
  EXPECT_TRUE(b_0->terminated);
  EXPECT_FALSE(b_0->killed);
  EXPECT_TRUE(worker_at(a0));
  EXPECT_EQ(driver->phase(), JobPhase::kWaitingWithSurvivors);
}

// Three commit intervals in which `slow` computes five times as long as the
// other members of generation `gen`.
void slow_intervals(FakeMembership& m, const std::vector<SlotKey>& members, const SlotKey& slow, long gen) {
  for (uint64_t id = 1; id <= 3; ++id) {
    for (auto& s : members) m.timing(RankTiming{s, gen, id, 1.01, s == slow ? 0.01 : 0.81});
  }
}

// A straggler's slot leaves at the next commit (announced as a drain), with
// no failure; after its cooldown the slot grows the job again.
TEST_F(InPlaceTest, AStragglerLeavesAtTheNextCommitAndItsSlotReturnsAfterTheCooldown) {
  const SlotKey b1{"b", 1};
  discovery.set(HostSet({{"a", 2}, {"b", 2}}));
  DriverOptions o = elastic(4, 1, 4);
  o.cooldown_min_s = 5;
  start_joined(o);
  slow_intervals(membership, {a0, a1, b0, b1}, b1, 1);
  EXPECT_FALSE(steps(1));
  ASSERT_EQ(driver->record().generation, 2);
  EXPECT_EQ(driver->plan().size(), 3);
  EXPECT_FALSE(driver->plan().contains(b1));
  EXPECT_EQ(membership.drains_notified(), std::vector<long>{1});
  Worker slow = worker_at(b1);
  ASSERT_TRUE(slow);
  EXPECT_FALSE(slow->terminated);
  for (auto& s : {a0, a1, b0, b1}) membership.join(s, 1, JoinReason::kHostsUpdated);
  EXPECT_FALSE(steps(2));
  EXPECT_TRUE(slow->terminated);
  EXPECT_FALSE(slow->killed);
  EXPECT_FALSE(driver->host_manager().is_blacklisted("b"));
  EXPECT_EQ(driver->record().resets, 1);
  // Out for the cooldown, then a new worker in that slot.
  EXPECT_FALSE(steps(40));
  EXPECT_FALSE(worker_at(b1));
  EXPECT_FALSE(steps(20));
  Worker again = worker_at(b1);
  ASSERT_TRUE(again) << "the slot did not return after its cooldown";
  EXPECT_NE(again, slow);
}

// At --min-np, or with --stragglers report, a straggler is only reported.
TEST_F(InPlaceTest, AStragglerAtMinNpOrUnderReportIsOnlyReported) {
  for (bool at_min : {true, false}) {
    membership = FakeMembership();
    discovery.set(HostSet({{"a", 1}, {"b", 1}}));
    DriverOptions o = elastic(2, at_min ? 2 : 1, 2);
    if (!at_min) o.stragglers = StragglerPolicy::kReport;
    start_joined(o);
    slow_intervals(membership, {a0, b0}, b0, 1);
    EXPECT_FALSE(steps(5));
    EXPECT_EQ(driver->record().generation, 1) << at_min;
    EXPECT_EQ(driver->plan().size(), 2) << at_min;
    EXPECT_TRUE(membership.drains_notified().empty()) << at_min;
  }
}

// Two hosts join a running job; the one whose pre-flight check took more
// than three times the members' is held back (stopped, its slot resting, no
// failure), the other joins; with --preflight off both do.
TEST_F(InPlaceTest, ANewHostSlowAtItsPreflightCheckIsHeldBackAndAHealthyOneJoins) {
  for (bool preflight : {true, false}) {
    membership = FakeMembership();
    discovery.set(HostSet({{"a", 1}}));
    DriverOptions o = elastic(1, 1, 3);
    o.preflight = preflight;
    o.cooldown_min_s = 600;
    start_joined(o);
    discovery.set(HostSet({{"a", 1}, {"b", 1}, {"c", 1}}));
    clock.advance(std::chrono::seconds(1));
    EXPECT_FALSE(steps(1));
    Worker b_0 = worker_at(b0), c_0 = worker_at(c0);
    ASSERT_TRUE(b_0 && c_0);
    membership.join(b0, -1, JoinReason::kStart, -1, PeerState::kUnknown, 0, 25000);
    membership.join(c0, -1, JoinReason::kStart, -1, PeerState::kUnknown, 0, 100000);  // 5x the member's 20 ms
    EXPECT_FALSE(steps(2));
    EXPECT_EQ(c_0->terminated, preflight) << preflight;
    EXPECT_FALSE(b_0->terminated);
    EXPECT_EQ(driver->plan().size(), preflight ? 2 : 3) << preflight;
    EXPECT_EQ(driver->plan().contains(c0), !preflight);
    EXPECT_FALSE(driver->host_manager().is_blacklisted("c"));
    if (preflight) {
      clock.advance(std::chrono::seconds(2));
      EXPECT_FALSE(steps(10));
      EXPECT_FALSE(worker_at(c0)) << "tried again before its cooldown";
    }
  }
}

// A worker launched on a host new to the job is told a member on another
// host to time its link with (ERUN_PROBE_PEER, that member's responder
// port); one whose probe did not finish within the bound, or took more than
// three times the members' probes, is held back as a slow compute check is;
// a healthy one joins. A worker of the first generation is told none.
TEST_F(InPlaceTest, ANewHostWithASlowLinkIsHeldBackAndOneWithAHealthyLinkJoins) {
  auto peer_of = [](const Worker& w) {
    for (auto& [k, v] : w->spec.env) {
      if (k == "ERUN_PROBE_PEER") return v;
    }
    return std::string();
  };
  const SlotKey d0{"d", 0};
  membership.probe_port = 4242;
  membership.link_us = 2000;
  discovery.set(HostSet({{"a", 2}}));
  DriverOptions o = elastic(2, 1, 5);
  o.cooldown_min_s = 600;
  start_joined(o);
  EXPECT_EQ(peer_of(worker_at(a0)), "") << "a first generation has nobody to probe";
  discovery.set(HostSet({{"a", 2}, {"b", 1}, {"c", 1}, {"d", 1}}));
  clock.advance(std::chrono::seconds(1));
  EXPECT_FALSE(steps(1));
  Worker b_0 = worker_at(b0), c_0 = worker_at(c0), d_0 = worker_at(d0);
  ASSERT_TRUE(b_0 && c_0 && d_0);
  for (auto* w : {&b_0, &c_0, &d_0}) {
    const std::string peer = peer_of(*w);
    EXPECT_TRUE(peer.size() > 5 && peer.substr(peer.size() - 5) == ":4242") << peer;
  }
  membership.join(b0, -1, JoinReason::kStart, -1, PeerState::kUnknown, 0, 20000, 2500);
  membership.join(c0, -1, JoinReason::kStart, -1, PeerState::kUnknown, 0, 20000, kLinkProbeBoundUs);
  // 10x the members' 2 ms (as if they had probed when they came), within the bound.
  membership.join(d0, -1, JoinReason::kStart, -1, PeerState::kUnknown, 0, 20000, 20000);
  EXPECT_FALSE(steps(2));
  EXPECT_FALSE(b_0->terminated);
  EXPECT_TRUE(c_0->terminated) << "past the bound";
  EXPECT_TRUE(d_0->terminated) << "10x the members' link probe";
  EXPECT_TRUE(driver->plan().contains(b0));
  EXPECT_FALSE(driver->plan().contains(c0));
  EXPECT_FALSE(driver->plan().contains(d0));
  EXPECT_FALSE(driver->host_manager().is_blacklisted("c"));
  EXPECT_FALSE(driver->host_manager().is_blacklisted("d"));
}

TEST_F(InPlaceTest, AWorkerThatDoesNotJoinWithinTheRendezvousTimeoutIsKilled) {
  discovery.set(HostSet({{"a", 2}}));
  start_joined(elastic(2, 1, 2));
  survivors_rejoin({a0}, 1);  // a1 never re-joins (a worker hung outside collectives)
  EXPECT_FALSE(steps(1));
  ASSERT_EQ(driver->record().generation, 2);
  Worker hung = worker_at(a1);
  EXPECT_FALSE(steps(150));  // 15 s of the 20 s
  EXPECT_FALSE(hung->killed);
  EXPECT_FALSE(steps(60));
  EXPECT_TRUE(hung->killed);
  EXPECT_EQ(driver->record().generation, 3);  // recovered in place: its slot gets a new worker
  EXPECT_EQ(launcher.launched().size(), 3u);
}

TEST_F(InPlaceTest, AfterAFailureASurvivorThatDoesNotReJoinWithinTheCollectiveTimeoutIsLeftOut) {
  // Across hosts nobody can name a stopped rank: the live survivors re-join,
  // the stopped one never does.
  discovery.set(HostSet({{"a", 1}, {"b", 1}, {"c", 1}}));
  auto o = elastic(3, 2, 3);
  o.collective_timeout = std::chrono::seconds(2);
  start_joined(o);
  survivors_rejoin({a0, b0}, 1);
  EXPECT_FALSE(steps(1));
  ASSERT_EQ(driver->record().generation, 2);  // re-formed with c0 still in it
  Worker stopped = worker_at(c0);
  EXPECT_FALSE(steps(25));  // 2.5 s
  EXPECT_FALSE(stopped->killed);
  EXPECT_FALSE(steps(6));  // past 3 s: killed and left out, long before --rendezvous-timeout
  EXPECT_TRUE(stopped->killed);
  EXPECT_EQ(driver->record().generation, 3);
  EXPECT_FALSE(worker_at(a0)->killed);
  EXPECT_FALSE(worker_at(b0)->killed);
}

TEST_F(InPlaceTest, AWorkerWaitingInTheRendezvousIsNeverKilledByTheDeadline) {
  discovery.set(HostSet({{"a", 2}}));
  start_joined(elastic(2, 1, 2));
  survivors_rejoin({a0}, 1);
  EXPECT_FALSE(steps(1));
  ASSERT_EQ(driver->record().generation, 2);
  EXPECT_FALSE(steps(199));  // just before the 20 s deadline a1 has not joined generation 2...
  membership.join(a1, 2, JoinReason::kFormFailed);  // ...and now waits for a newer one, as the deadline passes
  EXPECT_FALSE(steps(2));
  EXPECT_FALSE(worker_at(a1)->killed);
  EXPECT_EQ(driver->record().generation, 3);
  EXPECT_TRUE(membership.is_member(a1));
}

// The new rule: survivors that alone meet --min-np never wait for a
// replacement's start-up. They go on in a generation of their own at once;
// the replacement waits in the rendezvous, and only then is a membership
// change announced, so that the survivors grow at their next commit.
TEST_F(InPlaceTest, SurvivorsGoOnAloneAndGrowOnceTheReplacementWaitsInTheRendezvous) {
  discovery.set(HostSet({{"a", 4}}));
  start_joined(elastic(4, 2, 4));
  launcher.finish(worker_at(a1), ExitStatus{0, SIGKILL});
  survivors_rejoin({a0, a2, a3}, 1, 1, PeerState::kDead);
  EXPECT_FALSE(steps(1));
  ASSERT_EQ(driver->record().generation, 2);
  // Generation 2 is the survivors' alone, with dense local ranks (a hole at slot 1).
  ASSERT_EQ(membership.ranks().size(), 3u);
  const std::vector<SlotKey> expect{a0, a2, a3};
  for (int r = 0; r < 3; ++r) {
    const RankAssignment& ra = membership.ranks()[static_cast<size_t>(r)];
    EXPECT_EQ(ra.slot, expect[static_cast<size_t>(r)]);
    EXPECT_EQ(ra.rank, r);
    EXPECT_EQ(ra.size, 3);
    EXPECT_EQ(ra.local_rank, r);
    EXPECT_EQ(ra.local_size, 3);
  }
  for (auto& s : expect) EXPECT_TRUE(membership.is_member(s));
  // The replacement was launched into the free slot at once.
  ASSERT_EQ(launcher.launched().size(), 5u);
  Worker replacement = launcher.launched().back();
  EXPECT_EQ(slot_of(replacement), a1);
  // While it starts (seconds of `import torch`), nothing is announced: the
  // free slot is not a membership change. (Generation 1's members were told
  // it ended, so that any still forming it give up at once.)
  EXPECT_FALSE(steps(50));
  EXPECT_EQ(driver->record().generation, 2);
  EXPECT_EQ(membership.notified(), std::vector<long>{1});
  EXPECT_EQ(driver->record().resets, 1);
  // It waits in the rendezvous: announce, and publish the grown generation.
  membership.join(a1, -1);
  EXPECT_FALSE(steps(1));
  EXPECT_EQ(membership.notified(), (std::vector<long>{1, 2}));
  ASSERT_EQ(driver->record().generation, 3);
  ASSERT_EQ(membership.ranks().size(), 4u);
  EXPECT_TRUE(membership.is_member(a1));
  EXPECT_EQ(driver->record().resets, 1);  // one failure, one reset
  // The survivors re-join at their next commit and are members at once.
  for (auto& s : expect) membership.join(s, 2, JoinReason::kHostsUpdated);
  EXPECT_FALSE(steps(1));
  for (auto& s : {a0, a1, a2, a3}) EXPECT_TRUE(membership.is_member(s));
  EXPECT_EQ(driver->record().generation, 3);
  EXPECT_EQ(launcher.launched().size(), 5u);
  for (auto& w : launcher.running()) EXPECT_FALSE(w->terminated);
}

TEST_F(InPlaceTest, SurvivorsBelowMinNpAloneWaitForTheReplacementAsBefore) {
  discovery.set(HostSet({{"a", 2}}));
  start_joined(elastic(2, 2, 2));
  launcher.finish(worker_at(a1), ExitStatus{0, SIGKILL});
  survivors_rejoin({a0}, 1, 1, PeerState::kDead);
  EXPECT_FALSE(steps(1));
  ASSERT_EQ(driver->record().generation, 2);
  EXPECT_EQ(membership.ranks().size(), 2u);  // the replacement is in the generation
  membership.join(a1, -1);
  EXPECT_FALSE(steps(2));
  EXPECT_TRUE(membership.is_member(a1));
  EXPECT_EQ(driver->record().generation, 2);
  EXPECT_EQ(membership.notified(), std::vector<long>{1});  // only the failed generation's end
}

TEST_F(InPlaceTest, AReplacementThatFailsBeforeJoiningDoesNotFailTheSurvivorsGeneration) {
  discovery.set(HostSet({{"a", 2}, {"b", 1}}));
  auto o = elastic(3, 2, 3);
  o.blacklist_after = 2;
  o.cooldown_min_s = o.cooldown_max_s = 600;
  start_joined(o);
  launcher.finish(worker_at(b0), ExitStatus{0, SIGKILL});
  survivors_rejoin({a0, a1}, 1, 2, PeerState::kDead);
  EXPECT_FALSE(steps(1));
  ASSERT_EQ(driver->record().generation, 2);
  EXPECT_EQ(driver->record().resets, 1);
  Worker replacement = worker_at(b0);
  ASSERT_TRUE(replacement);
  launcher.finish(replacement, ExitStatus{1, 0});  // e.g. an import error on b
  EXPECT_FALSE(steps(30));
  // No reset, no new generation: the survivors never saw it. Its host is
  // blacklisted (its second failure in a row), so nothing more starts there.
  EXPECT_EQ(driver->record().generation, 2);
  EXPECT_EQ(driver->record().resets, 1);
  EXPECT_TRUE(driver->host_manager().is_blacklisted("b"));
  EXPECT_EQ(launcher.launched().size(), 4u);
  for (auto& s : {a0, a1}) EXPECT_FALSE(worker_at(s)->terminated);
  for (auto& w : launcher.running()) launcher.finish(w, ExitStatus{0, 0});
  EXPECT_EQ(steps(3), 0);
}

TEST_F(InPlaceTest, AReplacementThatNeverJoinsIsKilledAtTheRendezvousTimeoutAndTheSurvivorsGoOn) {
  lose_a2(2);
  ASSERT_EQ(driver->record().generation, 2);
  Worker stuck = worker_at(a2);
  ASSERT_TRUE(stuck);
  EXPECT_FALSE(steps(190));  // 19 s of --rendezvous-timeout 20 s
  EXPECT_FALSE(stuck->killed);
  EXPECT_EQ(driver->record().generation, 2);
  EXPECT_FALSE(steps(15));
  EXPECT_TRUE(stuck->killed);
  for (auto& s : {a0, a1}) EXPECT_FALSE(worker_at(s)->terminated);
  EXPECT_EQ(driver->record().resets, 1);  // the survivors' generation did not fail
  EXPECT_EQ(driver->record().generation, 2);
  // The slot gets another pending worker; the survivors still train alone.
  Worker next = worker_at(a2);
  ASSERT_TRUE(next);
  EXPECT_NE(next, stuck);
  membership.join(a2, -1);
  EXPECT_FALSE(steps(1));
  EXPECT_EQ(driver->record().generation, 3);
  EXPECT_EQ(membership.notified(), (std::vector<long>{1, 2}));
}

TEST_F(InPlaceTest, APendingReplacementIsStoppedWhenTrainingEnds) {
  lose_a2(2);
  Worker replacement = worker_at(a2);
  ASSERT_TRUE(replacement);
  launcher.finish(worker_at(a0), ExitStatus{0, 0});
  launcher.finish(worker_at(a1), ExitStatus{0, 0});
  EXPECT_EQ(steps(5), 0);  // the job ends with the survivors' success
  EXPECT_TRUE(replacement->terminated);
}

// The survivors finish before they re-join the generation announced for the
// replacement: it holds nothing to finish and would wait for them forever.
TEST_F(InPlaceTest, AReplacementInAGenerationTheFinishedRanksNeverJoinedIsStopped) {
  lose_a2(1);
  membership.join(a2, -1);
  EXPECT_FALSE(steps(1));
  ASSERT_EQ(driver->record().generation, 3);
  Worker replacement = worker_at(a2);
  ASSERT_TRUE(replacement);
  EXPECT_TRUE(membership.is_member(a2));
  launcher.finish(worker_at(a0), ExitStatus{0, 0});
  launcher.finish(worker_at(a1), ExitStatus{0, 0});
  EXPECT_EQ(steps(5), 0);  // not a --finish-timeout failure
  EXPECT_TRUE(replacement->terminated);
}

// A worker launched into the job that then trained in a complete generation
// is one of the ranks: it is never stopped early.
TEST_F(InPlaceTest, AReplacementThatTrainedWithTheOthersFinishesLikeThem) {
  lose_a2(1);
  membership.join(a2, -1);
  EXPECT_FALSE(steps(1));
  for (auto& s : {a0, a1}) membership.join(s, 2, JoinReason::kHostsUpdated);
  EXPECT_FALSE(steps(1));  // generation 3 complete
  Worker replacement = worker_at(a2);
  launcher.finish(worker_at(a0), ExitStatus{0, 0});
  EXPECT_FALSE(steps(5));
  EXPECT_FALSE(replacement->terminated);
  launcher.finish(worker_at(a1), ExitStatus{0, 0});
  launcher.finish(replacement, ExitStatus{0, 0});
  EXPECT_EQ(steps(2), 0);
}

// ---- A rank named silent over the network (erun's TCP transport between
// hosts): it may be frozen, or alive and blocked on a frozen rank itself. ----

const SlotKey d0{"d", 0};

// One re-join of a survivor leaving generation `left`, naming `failed_rank`
// as silent (or nobody).
struct SilentReport {
  SlotKey slot;
  int failed_rank = -1;
};

class InPlaceSilentTest : public InPlaceTest {
 protected:
  // Four hosts of one slot each (ranks 0-3 on a, b, c, d), in place, with a
  // 2 s collective timeout: the re-join deadline after a failure is 3 s.
  void start_ring(std::vector<SlotKey> frozen) {
    discovery.set(HostSet({{"a", 1}, {"b", 1}, {"c", 1}, {"d", 1}}));
    auto o = elastic(4, 2, 4);
    o.collective_timeout = std::chrono::seconds(2);
    start_joined(o);
    for (auto& s : {a0, b0, c0, d0}) at_start[s] = worker_at(s);
    frozen_ = std::move(frozen);
  }
  void rejoin(const SilentReport& r) {
    membership.join(r.slot, 1, JoinReason::kPeerLost, r.failed_rank,
                    r.failed_rank >= 0 ? PeerState::kSilent : PeerState::kUnknown, 7);
  }
  // No worker that is not frozen was killed or stopped.
  void expect_no_healthy_worker_killed(const std::string& when) {
    for (auto& [slot, w] : at_start) {
      if (std::find(frozen_.begin(), frozen_.end(), slot) != frozen_.end()) continue;
      EXPECT_FALSE(w->killed) << slot.host << " " << when;
      EXPECT_FALSE(w->terminated) << slot.host << " " << when;
    }
  }
  // `slots`, members of the generation re-formed at the first re-join (which
  // still held the excluded rank), leave it once the next one is published,
  // and are members of that one at once.
  void expect_members_after_leaving_the_reformed_generation(const std::vector<SlotKey>& slots) {
    for (auto& s : slots) {
      if (!membership.is_member(s)) membership.join(s, driver->record().generation - 1, JoinReason::kFormFailed);
    }
    const long gen = driver->record().generation;
    EXPECT_FALSE(steps(1));
    for (auto& s : slots) EXPECT_TRUE(membership.is_member(s)) << s.host;
    EXPECT_EQ(driver->record().generation, gen);
  }
  std::map<SlotKey, Worker> at_start;
  std::vector<SlotKey> frozen_;
};

// The ring 0 -> 1 -> 2 -> 3 -> 0 (each rank receives from its left
// neighbour) with rank 2 (c) frozen: rank 3 times out on 2, rank 0 on 3 (alive
// but blocked), rank 1 on 0 (alive but blocked). Whatever order their re-joins
// arrive in, one tick apart, the frozen rank is left out with the last of
// them (long before the 3 s re-join deadline) and no one else is touched.
class InPlaceSilentRingTest : public InPlaceSilentTest, public ::testing::WithParamInterface<std::vector<int>> {};

TEST_P(InPlaceSilentRingTest, AFrozenRankIsLeftOutOnceEveryOtherMemberReJoined) {
  const std::vector<SilentReport> reports{{d0, 2}, {a0, 3}, {b0, 0}};
  const std::vector<int>& order = GetParam();
  start_ring({c0});
  const TimePoint first = clock.now();
  for (size_t i = 0; i < order.size(); ++i) {
    rejoin(reports[static_cast<size_t>(order[i])]);
    EXPECT_FALSE(steps(1));
    expect_no_healthy_worker_killed("after " + std::to_string(i + 1) + " re-joins");
    EXPECT_EQ(at_start[c0]->killed, i + 1 == order.size()) << "after " << i + 1 << " re-joins";
  }
  // Killed 0.3 s after the first re-join; the survivors go on alone.
  EXPECT_LT(clock.now() - first, std::chrono::seconds(1));
  EXPECT_EQ(membership.ranks().size(), 3u);
  for (auto& r : membership.ranks()) EXPECT_NE(r.slot, c0);
  expect_members_after_leaving_the_reformed_generation({a0, b0, d0});
  expect_no_healthy_worker_killed("at the end");
  EXPECT_EQ(driver->record().resets, 1);  // one failure
}

INSTANTIATE_TEST_SUITE_P(EveryOrder, InPlaceSilentRingTest,
                         ::testing::Values(std::vector<int>{0, 1, 2}, std::vector<int>{0, 2, 1},
                                           std::vector<int>{1, 0, 2}, std::vector<int>{1, 2, 0},
                                           std::vector<int>{2, 0, 1}, std::vector<int>{2, 1, 0}));

TEST_F(InPlaceSilentTest, AllReJoinsInOneTickLeaveOutOnlyTheFrozenRank) {
  start_ring({c0});
  for (auto& r : std::vector<SilentReport>{{b0, 0}, {a0, 3}, {d0, 2}}) rejoin(r);
  EXPECT_FALSE(steps(1));
  expect_no_healthy_worker_killed("after the tick");
  EXPECT_TRUE(at_start[c0]->killed);
  for (auto& r : membership.ranks()) EXPECT_NE(r.slot, c0);
}

// The unsafe shortcut: ranks 3 and 1 re-joined naming 2 and 0. Both are
// named and neither re-joined, but rank 0 is alive (blocked on 3, which only
// just aborted): it must not be killed while it may still re-join. Two
// frozen ranks (0 and 2) look exactly the same, so both wait until the
// members stayed as they are for the settle time (0.5 s).
TEST_F(InPlaceSilentTest, TwoNamedMembersThatHaveNotReJoinedAreNotExcludedOnTheReportsAlone) {
  start_ring({c0});
  rejoin({d0, 2});
  rejoin({b0, 0});
  EXPECT_FALSE(steps(4));
  expect_no_healthy_worker_killed("while rank 0 is still blocked");
  EXPECT_FALSE(at_start[c0]->killed);
  rejoin({a0, 3});  // rank 0 sees rank 3's connection close and re-joins in its turn
  EXPECT_FALSE(steps(1));
  expect_no_healthy_worker_killed("after rank 0 re-joined");
  EXPECT_TRUE(at_start[c0]->killed);
}

// Ranks 0 and 2 (a, c) frozen: rank 1 names 0, rank 3 names 2. Once nobody
// else re-joined for the settle time, both are left out together, long
// before the 3 s re-join deadline.
TEST_F(InPlaceSilentTest, TwoFrozenMembersAreLeftOutTogetherOnceTheOthersSettled) {
  start_ring({a0, c0});
  const TimePoint first = clock.now();
  rejoin({b0, 0});
  rejoin({d0, 2});
  EXPECT_FALSE(steps(5));  // 0.4 s after the re-joins were seen
  EXPECT_FALSE(at_start[a0]->killed);
  EXPECT_FALSE(at_start[c0]->killed);
  EXPECT_FALSE(steps(1));
  EXPECT_TRUE(at_start[a0]->killed);
  EXPECT_TRUE(at_start[c0]->killed);
  EXPECT_LT(clock.now() - first, std::chrono::seconds(1));
  expect_no_healthy_worker_killed("after the settle time");
  expect_members_after_leaving_the_reformed_generation({b0, d0});
  expect_no_healthy_worker_killed("at the end");
}

// Ranks 1 and 2 (b, c) frozen side by side: rank 3 names 2, rank 0 times out
// on 3 (alive but blocked) and names it; nobody watches rank 1, whose right
// neighbour is frozen too. It goes with the named one.
TEST_F(InPlaceSilentTest, AdjacentFrozenMembersGoTogetherWhenOneOfThemIsNamed) {
  start_ring({b0, c0});
  rejoin({d0, 2});
  EXPECT_FALSE(steps(2));
  rejoin({a0, 3});
  EXPECT_FALSE(steps(5));
  EXPECT_FALSE(at_start[b0]->killed);
  EXPECT_FALSE(steps(1));
  EXPECT_TRUE(at_start[b0]->killed);
  EXPECT_TRUE(at_start[c0]->killed);
  expect_no_healthy_worker_killed("after the settle time");
  expect_members_after_leaving_the_reformed_generation({a0, d0});
}

// Rank 3 (d) was SIGKILLed and rank 1 (b) is frozen: rank 0 names 3 (its
// connection closed), rank 2 times out on 1. With the dead member gone, the
// frozen one is the only open member: left out after the settle time.
TEST_F(InPlaceSilentTest, AFrozenMemberBesideADeadOneIsLeftOutOnceTheOthersSettled) {
  start_ring({b0, d0});
  launcher.finish(at_start[d0], ExitStatus{0, SIGKILL});
  rejoin({a0, 3});
  rejoin({c0, 1});
  EXPECT_FALSE(steps(5));
  EXPECT_FALSE(at_start[b0]->killed);
  EXPECT_FALSE(steps(1));
  EXPECT_TRUE(at_start[b0]->killed);
  expect_no_healthy_worker_killed("after the settle time");
  expect_members_after_leaving_the_reformed_generation({a0, c0});
}

// Rank 3 (d) was SIGKILLed and rank 2 (c), whose only watcher it was, is
// frozen: rank 0 names 3, rank 1 names 0 (which aborted). No report names
// the open member, so it is left out at the re-join deadline.
TEST_F(InPlaceSilentTest, AFrozenMemberNobodyNamedIsLeftOutAtTheReJoinDeadline) {
  start_ring({c0, d0});
  launcher.finish(at_start[d0], ExitStatus{0, SIGKILL});
  rejoin({a0, 3});
  rejoin({b0, 0});
  EXPECT_FALSE(steps(25));  // 2.5 s of the 3 s deadline after the re-form
  EXPECT_FALSE(at_start[c0]->killed);
  EXPECT_FALSE(steps(6));
  EXPECT_TRUE(at_start[c0]->killed);
  expect_no_healthy_worker_killed("at the deadline");
  expect_members_after_leaving_the_reformed_generation({a0, b0});
}

// Rank 3 was SIGKILLed and the driver has not seen its exit yet: rank 0 named
// it, rank 2 named rank 1, which is alive and about to re-join (it was
// blocked on the dead rank). Once the exit is seen, rank 1 is the only member
// that neither re-joined nor exited: the rule must not take the dead rank's
// place for rank 1's.
TEST_F(InPlaceSilentTest, ADeadMemberKeepsASilentReportFromExcludingAnAliveOne) {
  start_ring({d0});
  rejoin({a0, 3});
  rejoin({c0, 1});
  EXPECT_FALSE(steps(1));
  launcher.finish(at_start[d0], ExitStatus{0, SIGKILL});
  EXPECT_FALSE(steps(3));
  expect_no_healthy_worker_killed("with rank 1 still blocked");
  rejoin({b0, 3});
  EXPECT_FALSE(steps(2));
  expect_no_healthy_worker_killed("after rank 1 re-joined");
  expect_members_after_leaving_the_reformed_generation({a0, b0, c0});
  expect_no_healthy_worker_killed("at the end");
}

// Two hosts, a:2 and b:1 (hierarchical): a's leader (rank 0) times out on b's
// leader (rank 2) and names it silent; a's other rank times out on its
// leader, busy in its cross-host step, and names no one.
class InPlaceSilentHostTest : public InPlaceSilentTest, public ::testing::WithParamInterface<bool> {};

TEST_P(InPlaceSilentHostTest, AFrozenWorkerAloneOnItsHostIsLeftOutWhenTheLeaderAndItsFollowerReJoined) {
  const bool leader_first = GetParam();
  discovery.set(HostSet({{"a", 2}, {"b", 1}}));
  auto o = elastic(3, 2, 3);
  o.collective_timeout = std::chrono::seconds(2);
  start_joined(o);
  Worker frozen = worker_at(b0), leader = worker_at(a0), follower = worker_at(a1);
  auto leader_rejoins = [&] { membership.join(a0, 1, JoinReason::kPeerLost, 2, PeerState::kSilent, 7); };
  auto follower_rejoins = [&] { membership.join(a1, 1, JoinReason::kPeerLost); };
  leader_first ? leader_rejoins() : follower_rejoins();
  EXPECT_FALSE(steps(1));
  EXPECT_FALSE(frozen->killed);
  leader_first ? follower_rejoins() : leader_rejoins();
  EXPECT_FALSE(steps(1));
  EXPECT_TRUE(frozen->killed);
  EXPECT_FALSE(leader->killed || leader->terminated);
  EXPECT_FALSE(follower->killed || follower->terminated);
  EXPECT_EQ(membership.ranks().size(), 2u);
  expect_members_after_leaving_the_reformed_generation({a0, a1});
}

INSTANTIATE_TEST_SUITE_P(LeaderFirstOrNot, InPlaceSilentHostTest, ::testing::Bool());

using Lost = std::vector<std::pair<long, std::vector<int>>>;

TEST_F(InPlaceTest, AWorkerThatDiesIsReportedToTheSurvivorsBeforeTheNextGeneration) {
  discovery.set(HostSet({{"a", 2}, {"b", 2}}));
  start_joined(elastic(4, 2, 4));
  // b:1 (rank 3) goes (its host lost, or it crashed): the survivors, who may
  // be blocked in a collective with it, hear of it in the same tick, for the
  // generation they compute in (the fake drops a notice for any other).
  launcher.finish(worker_at(SlotKey{"b", 1}), ExitStatus{255, 0});
  EXPECT_FALSE(steps(1));
  EXPECT_EQ(membership.peers_lost(), (Lost{{1, {3}}}));
  EXPECT_EQ(driver->record().generation, 2);
  // Told once: later ticks and the next generation do not repeat it.
  survivors_rejoin({a0, a1, b0}, 1, 3);
  EXPECT_FALSE(steps(3));
  EXPECT_EQ(membership.peers_lost().size(), 1u);
}

TEST_F(InPlaceTest, LossesOfOneTickAreOneNotice) {
  discovery.set(HostSet({{"a", 4}}));
  start_joined(elastic(4, 1, 4));
  launcher.finish(worker_at(a3), ExitStatus{0, SIGKILL});
  launcher.finish(worker_at(a1), ExitStatus{1, 0});
  EXPECT_FALSE(steps(1));
  EXPECT_EQ(membership.peers_lost(), (Lost{{1, {1, 3}}}));
}

TEST_F(InPlaceTest, ARankReportedBySurvivorsIsToldToTheOthers) {
  discovery.set(HostSet({{"a", 1}, {"b", 1}, {"c", 1}}));
  start_joined(elastic(3, 2, 3));
  launcher.set_obey_kill(false);  // frozen: it stays "running" after the kill
  // a0 timed out on rank 2; b0 is still blocked in a collective with it.
  membership.join(a0, 1, JoinReason::kPeerLost, 2, PeerState::kAlive, 7);
  EXPECT_FALSE(steps(1));
  EXPECT_TRUE(worker_at(c0)->killed);
  EXPECT_EQ(membership.peers_lost(), (Lost{{1, {2}}}));
  // In generation 2 (the survivors alone) the frozen worker is no member; its
  // replacement joins them in generation 3, and a later loss names only the
  // new one, in the generation it was lost from.
  ASSERT_EQ(driver->record().generation, 2);
  membership.join(b0, 1, JoinReason::kPeerLost, 2);
  membership.join(c0, -1);
  EXPECT_FALSE(steps(1));
  Worker replacement = launcher.launched().back();
  launcher.finish(replacement, ExitStatus{1, 0});
  EXPECT_FALSE(steps(1));
  ASSERT_EQ(membership.peers_lost().size(), 2u);
  EXPECT_EQ(membership.peers_lost()[1], (std::pair<long, std::vector<int>>{3, {2}}));
}

// A replacement that failed before it was admitted holds a rank of the full
// plan, which the survivors never formed (there, that rank is a live
// survivor's): a later loss in their generation names only the lost member.
TEST_F(InPlaceTest, AFailedReplacementIsNotToldToTheSurvivorsAsALostRank) {
  discovery.set(HostSet({{"a", 2}, {"b", 2}}));
  start_joined(elastic(4, 2, 4));
  launcher.finish(worker_at(a1), ExitStatus{0, SIGKILL});
  survivors_rejoin({a0, b0, SlotKey{"b", 1}}, 1, 1, PeerState::kDead);
  EXPECT_FALSE(steps(1));
  ASSERT_EQ(driver->record().generation, 2);  // a0, b0, b1 as ranks 0-2; a1's replacement pending with rank 1
  membership.join_all();
  EXPECT_FALSE(steps(1));
  launcher.finish(worker_at(a1), ExitStatus{1, 0});
  EXPECT_FALSE(steps(1));
  launcher.finish(worker_at(SlotKey{"b", 1}), ExitStatus{0, SIGKILL});
  EXPECT_FALSE(steps(1));
  ASSERT_EQ(membership.peers_lost().size(), 2u);
  EXPECT_EQ(membership.peers_lost()[1], (std::pair<long, std::vector<int>>{2, {2}}));
}

// The job's phases while survivors wait below --min-np: they wait with their
// state, go on when slots return, and the job waits for hosts (restarting
// from scratch) once they are gone.
TEST_F(InPlaceTest, SurvivorsBelowMinNpWaitInTheirOwnPhase) {
  discovery.set(HostSet({{"a", 1}, {"b", 1}, {"c", 1}}));
  start_joined(elastic(3, 3, 3));
  EXPECT_EQ(driver->phase(), JobPhase::kRunning);
  discovery.set(HostSet({{"a", 1}, {"b", 1}}));
  clock.advance(std::chrono::seconds(1));
  launcher.finish(worker_at(c0), ExitStatus{1, 0});
  survivors_rejoin({a0, b0}, 1);
  EXPECT_FALSE(steps(2));
  EXPECT_EQ(driver->phase(), JobPhase::kWaitingWithSurvivors);
  discovery.set(HostSet({{"a", 1}, {"b", 1}, {"c", 1}}));
  EXPECT_FALSE(steps(15));
  EXPECT_EQ(driver->phase(), JobPhase::kRunning);
  EXPECT_EQ(driver->record().generation, 2);
  // Below --min-np again, then every survivor dies while waiting.
  discovery.set(HostSet({{"a", 1}}));
  clock.advance(std::chrono::seconds(1));
  membership.join_all();
  launcher.finish(worker_at(c0), ExitStatus{1, 0});
  launcher.finish(worker_at(b0), ExitStatus{1, 0});
  survivors_rejoin({a0}, 2);
  EXPECT_FALSE(steps(2));
  EXPECT_EQ(driver->phase(), JobPhase::kWaitingWithSurvivors);
  launcher.finish(worker_at(a0), ExitStatus{1, 0});
  EXPECT_FALSE(steps(1));
  EXPECT_EQ(driver->phase(), JobPhase::kWaitingForHosts);
  discovery.set(HostSet({{"a", 1}, {"b", 1}, {"c", 1}}));
  EXPECT_FALSE(steps(15));
  EXPECT_EQ(driver->phase(), JobPhase::kRunning);
  EXPECT_EQ(launcher.running().size(), 3u);  // all started again
}

TEST_F(InPlaceTest, SurvivorsThatWaitPastTheElasticTimeoutAreStoppedAndTheJobEnds) {
  discovery.set(HostSet({{"a", 1}, {"b", 1}}));
  start_joined(elastic(2, 2, 2));
  discovery.set(HostSet({{"a", 1}}));
  clock.advance(std::chrono::seconds(1));
  launcher.finish(worker_at(b0), ExitStatus{1, 0});
  survivors_rejoin({a0}, 1);
  launcher.set_obey_terminate(false);
  EXPECT_FALSE(steps(305));
  EXPECT_EQ(driver->phase(), JobPhase::kStopping);  // the survivor takes its time to stop
  EXPECT_TRUE(worker_at(a0)->terminated);
  launcher.finish(worker_at(a0), ExitStatus{0, SIGTERM});
  EXPECT_EQ(steps(1), 1);
  EXPECT_EQ(driver->phase(), JobPhase::kDone);
}

// Workers learn their host's host-memory directory (one per job and host, in
// /dev/shm, named after the host), unless --no-host-commits.
TEST_F(InPlaceTest, WorkersAreToldWhereTheirHostKeepsCommits) {
  for (bool on : {true, false}) {
    launcher = FakeLauncher();
    discovery.set(HostSet({{"a", 2}, {"b/c", 1}}));
    auto o = elastic(3, 1, 3);
    o.host_commits = on;
    make(o);
    ASSERT_TRUE(driver->start());
    EXPECT_FALSE(steps(1));
    std::vector<std::string> dirs;
    for (auto& w : launcher.launched()) {
      for (auto& [k, v] : w->spec.env) {
        if (k == "ERUN_COMMIT_DIR") dirs.push_back(v);
      }
    }
    if (!on) {
      EXPECT_TRUE(dirs.empty());
      continue;
    }
    ASSERT_EQ(dirs.size(), 3u);
    std::sort(dirs.begin(), dirs.end());
    EXPECT_EQ(dirs[0], dirs[1]);
    const std::string base = "/dev/shm/erun-commits-";
    EXPECT_EQ(dirs[0].rfind(base, 0), 0u) << dirs[0];
    EXPECT_EQ(dirs[0].size(), base.size() + 24 + 2) << dirs[0];
    EXPECT_EQ(dirs[0].substr(base.size() + 24), "-a");
    // Never a path separator from a host's name; the same job's random part.
    EXPECT_EQ(dirs[2].substr(0, base.size() + 24), dirs[0].substr(0, base.size() + 24));
    EXPECT_EQ(dirs[2].find('/', base.size()), std::string::npos) << dirs[2];
  }
}

// Every worker died: the next generation's workers report, in their first
// joins, the commit their hosts kept; the driver says where training resumes.
TEST_F(InPlaceTest, ANewGenerationWithoutSurvivorsSaysWhichCommitItResumesAt) {
  char tmpl[] = "/tmp/erun-events-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string path = std::string(tmpl) + "/events.jsonl";
  EventLog events;
  ASSERT_TRUE(events.open(path));
  discovery.set(HostSet({{"a", 1}, {"b", 1}}));
  auto o = elastic(2, 2, 2);
  DriverDeps d;
  d.discovery = &discovery;
  d.local_launcher = &launcher;
  d.clock = &clock;
  d.membership = &membership;
  d.rendezvous_port = 1234;
  d.synchronous_discovery = true;
  d.events = &events;
  driver = std::make_unique<Driver>(o, d);
  ASSERT_TRUE(driver->start());
  EXPECT_FALSE(steps(1));
  membership.join_all();
  EXPECT_FALSE(steps(1));
  for (auto& w : launcher.running()) launcher.finish(w, ExitStatus{0, SIGKILL});
  EXPECT_FALSE(steps(3));
  ASSERT_EQ(driver->record().generation, 2);
  membership.join(a0, -1, JoinReason::kStart, -1, PeerState::kUnknown, 41);
  membership.join(b0, -1, JoinReason::kStart, -1, PeerState::kUnknown, 42);
  EXPECT_FALSE(steps(1));
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(text.find("\"event\":\"commit_restored\",\"generation\":2,\"commit\":42,\"host\":\"b\""),
            std::string::npos)
      << text;
  // A generation re-formed in place around survivors says nothing of the kind.
  membership.join(a0, 2, JoinReason::kHostsUpdated, -1, PeerState::kUnknown, 50);
  membership.join(b0, 2, JoinReason::kHostsUpdated, -1, PeerState::kUnknown, 50);
  EXPECT_FALSE(steps(2));
  std::ifstream again(path);
  std::string all((std::istreambuf_iterator<char>(again)), {});
  EXPECT_EQ(all.find("commit_restored"), all.rfind("commit_restored")) << all;
  std::filesystem::remove_all(tmpl);
}

// Every worker killed at once is reaped over several ticks, and each death
// re-forms the generation around the others: one failure, not a crash loop.
TEST_F(InPlaceTest, WorkersKilledTogetherButReapedOverSeveralTicksAreNoCrashLoop) {
  discovery.set(HostSet({{"a", 1}, {"b", 1}, {"c", 1}, {"d", 1}}));
  auto o = elastic(4, 1, 4);
  o.crash_loop_limit = 3;
  start_joined(o);
  for (auto s : {a0, b0, c0, SlotKey{"d", 0}}) {
    Worker w = worker_at(s);
    ASSERT_TRUE(w);
    launcher.finish(w, ExitStatus{0, SIGKILL});
    EXPECT_FALSE(driver->step()) << "ended at the death of " << s.host;
  }
  EXPECT_FALSE(steps(3));
  EXPECT_EQ(driver->phase(), JobPhase::kRunning);
  EXPECT_EQ(launcher.running().size(), 4u);  // all started again
}

TEST_F(InPlaceTest, ARestartModeFailureTellsNoOne) {
  discovery.set(HostSet({{"a", 2}}));
  auto o = elastic(2, 1, 2);
  o.elastic = false;
  o.mode = WorkerMode::kRestart;
  make(o);
  ASSERT_TRUE(driver->start());
  EXPECT_FALSE(steps(1));
  launcher.finish(launcher.launched().back(), ExitStatus{1, 0});
  EXPECT_FALSE(steps(2));
  EXPECT_TRUE(membership.peers_lost().empty());  // every worker is stopped and restarted instead
}

}  // namespace
}  // namespace erun
