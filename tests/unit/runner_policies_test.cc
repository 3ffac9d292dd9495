// The driver's policies on snapshots built by hand, with no driver
// (runner/policies/policy.h): draining, stragglers and pre-flight, the
// agents kept for the job's host memory, and the generation's joining.
#include <gtest/gtest.h>

#include <signal.h>

#include <string>
#include <variant>
#include <vector>

#include "runner/policies/departed.h"
#include "runner/policies/drain.h"
#include "runner/policies/host_memory.h"
#include "runner/policies/peer_reports.h"
#include "runner/policies/rejoin.h"
#include "runner/policies/standbys.h"
#include "runner/policies/straggler_watch.h"

namespace erun {
namespace {

using std::chrono::seconds;

// A job of `plan`'s ranks, one member worker per rank (keys 1, 2, ...),
// over the hosts `listed` (each with 2 slots; "name!" marks it draining).
struct Job {
  Plan plan;
  HostSet listed, hosts;
  JobSnapshot s;

  Job(const std::vector<SlotKey>& slots, const std::vector<std::string>& names,
      TimePoint now = TimePoint{} + std::chrono::seconds(1000)) {
    plan = plan_over_slots(3, slots);
    std::vector<Host> all, usable;
    for (std::string n : names) {
      Host h;
      h.draining = !n.empty() && n.back() == '!';
      if (h.draining) n.pop_back();
      h.name = n;
      h.slots = 2;
      all.push_back(h);
      if (!h.draining) usable.push_back(h);
    }
    listed = HostSet(all);
    hosts = HostSet(usable);
    s.now = now;
    s.generation = 3;
    s.plan = &plan;
    s.listed = &listed;
    s.hosts = &hosts;
    s.in_place = true;
    s.min_np = 1;
    long key = 1;
    for (auto& r : plan.ranks) s.workers.push_back(WorkerView{key++, r, WorkerState::kMember, WorkerStage::kSettled, true});
  }
  WorkerView& worker(long key) { return s.workers.at(static_cast<size_t>(key - 1)); }
};

template <class A>
std::vector<A> all_of(const Actions& actions) {
  std::vector<A> out;
  for (auto& a : actions) {
    if (auto* x = std::get_if<A>(&a)) out.push_back(*x);
  }
  return out;
}

template <class E>
std::vector<E> events_of(const Actions& actions) {
  std::vector<E> out;
  for (auto& e : all_of<act::Emit>(actions)) {
    if (auto* x = std::get_if<E>(&e.event)) out.push_back(*x);
  }
  return out;
}

std::vector<long> keys(const std::vector<act::Dismiss>& v) {
  std::vector<long> out;
  for (auto& d : v) out.push_back(d.worker);
  return out;
}

// ---- DrainPolicy ----

TEST(DrainPolicy, ANoticeStartsOneDrainThatTheUsableHostsLeaveOut) {
  Job job({{"a", 0}, {"a", 1}, {"b", 0}}, {"a", "b"});
  DrainPolicy drains(seconds(30));
  Actions out = drains.start(job.s, "a", "SIGTERM to its agent", false);
  auto started = events_of<ev::HostDraining>(out);
  ASSERT_EQ(started.size(), 1u);
  EXPECT_EQ(started[0].host, "a");
  EXPECT_EQ(started[0].workers, 2);
  EXPECT_EQ(all_of<act::HostsChanged>(out).size(), 1u);
  EXPECT_TRUE(drains.draining("a"));
  EXPECT_EQ(drains.usable(job.listed).to_string(), HostSet({Host{"b", 2}}).to_string());
  EXPECT_TRUE(drains.start(job.s, "a", "again", false).empty()) << "a host drains once";
  // A host of no worker that discovery does not list is not the job's.
  EXPECT_TRUE(drains.start(job.s, "z", "a stray notice", false).empty());
  EXPECT_FALSE(drains.draining("z"));
}

TEST(DrainPolicy, UsableHostsCarryNoDrainingMark) {
  Job job({{"a", 0}}, {"a", "b!"});
  DrainPolicy drains(seconds(30));
  EXPECT_FALSE(drains.usable(job.listed).hosts()[1].draining);
  drains.start(job.s, "b", "discovery lists it draining", true);
  EXPECT_EQ(drains.usable(job.listed).size(), 1u);
}

TEST(DrainPolicy, WorkersLeaveWhenTheirPartIsDoneAndAreKilledOnceAfterTheTimeout) {
  Job job({{"a", 0}, {"a", 1}, {"b", 0}}, {"a", "b"});
  job.s.workers.push_back(WorkerView{4, {}, WorkerState::kPending, WorkerStage::kReplacement, true});
  job.s.workers.back().assignment.slot = {"a", 1};
  DrainPolicy drains(seconds(30));
  drains.start(job.s, "a", "notice", false);
  // The pending worker and the member waiting at a commit leave; the other member trains on.
  job.s.waiting = {{"a", 0}};
  Actions out = drains.tend(job.s);
  EXPECT_EQ(keys(all_of<act::Dismiss>(out)), (std::vector<long>{1, 4}));
  EXPECT_TRUE(all_of<act::Kill>(out).empty());
  job.worker(1).state = WorkerState::kDismissed;
  job.s.workers.back().state = WorkerState::kDismissed;
  job.s.waiting.clear();
  EXPECT_TRUE(all_of<act::Dismiss>(drains.tend(job.s)).empty()) << "told once";
  // Past --drain-timeout: the member still training is killed, once.
  job.s.now += seconds(31);
  out = drains.tend(job.s);
  ASSERT_EQ(all_of<act::Kill>(out).size(), 1u);
  EXPECT_EQ(all_of<act::Kill>(out)[0].worker, 2);
  EXPECT_TRUE(all_of<act::CountReset>(out).empty()) << "a member's end is the generation's failure";
  EXPECT_TRUE(all_of<act::Kill>(drains.tend(job.s)).empty());
}

TEST(DrainPolicy, ARetiringWorkerKilledAtTheTimeoutCountsAReset) {
  Job job({{"a", 0}, {"b", 0}}, {"a", "b"});
  job.worker(1).state = WorkerState::kRetiring;
  DrainPolicy drains(seconds(5));
  drains.start(job.s, "a", "notice", false);
  job.s.now += seconds(6);
  Actions out = drains.tend(job.s);
  ASSERT_EQ(all_of<act::CountReset>(out).size(), 1u);
  EXPECT_EQ(all_of<act::CountReset>(out)[0].reason, "worker failed");
}

TEST(DrainPolicy, ADrainIsDrainedOnceEmptyAndEndsWhenDiscoveryLetsTheHostGo) {
  Job job({{"a", 0}, {"b", 0}}, {"a!", "b"});
  DrainPolicy drains(seconds(30));
  drains.start(job.s, "a", "discovery lists it draining", /*from_discovery=*/true);
  job.worker(1).alive = false;
  job.s.now += seconds(2);
  Actions out = drains.tend(job.s);
  auto drained = events_of<ev::HostDrained>(out);
  ASSERT_EQ(drained.size(), 1u);
  EXPECT_DOUBLE_EQ(drained[0].seconds, 2.0);
  EXPECT_TRUE(drains.draining("a")) << "discovery still marks it";
  EXPECT_TRUE(events_of<ev::HostDrained>(drains.tend(job.s)).empty()) << "drained once";
  // Listed without the mark: the drain ends and the host is usable again.
  Job unmarked({{"b", 0}}, {"a", "b"});
  job.listed = unmarked.listed;
  out = drains.tend(job.s);
  EXPECT_EQ(all_of<act::HostsChanged>(out).size(), 1u);
  EXPECT_FALSE(drains.draining("a"));
  EXPECT_FALSE(drains.any());
}

TEST(DrainPolicy, ANoticeDrainEndsOnlyWhenTheHostLeavesDiscovery) {
  Job job({{"a", 0}, {"b", 0}}, {"a", "b"});
  DrainPolicy drains(seconds(30));
  drains.start(job.s, "a", "SIGTERM to its agent", false);
  job.worker(1).alive = false;
  drains.tend(job.s);
  EXPECT_TRUE(drains.draining("a")) << "still listed: the agent's notice holds it out";
  Job without_a({{"b", 0}}, {"b"});
  job.listed = without_a.listed;
  drains.tend(job.s);
  EXPECT_FALSE(drains.draining("a"));
}

// ---- StragglerWatch ----

DriverOptions straggler_options(StragglerPolicy mode = StragglerPolicy::kEvict) {
  DriverOptions o;
  o.stragglers = mode;
  o.straggler_factor = 1.5;
  o.straggler_window = 1;
  o.cooldown_min_s = 10;
  o.cooldown_max_s = 25;
  return o;
}

// One round of commit intervals of the plan's ranks, `slow` computing 5 times as long.
std::vector<RankTiming> round_with(const Job& job, const SlotKey& slow, uint64_t id) {
  std::vector<RankTiming> out;
  for (auto& r : job.plan.ranks) {
    const double mine = r.slot == slow ? 1.0 : 0.2;
    out.push_back(RankTiming{r.slot, job.s.generation, id, 1.01, 1.01 - mine});
  }
  return out;
}

TEST(StragglerWatch, AStragglerIsEvictedItsSlotRestsAndComesBackAfterTheCooldown) {
  Job job({{"a", 0}, {"b", 0}, {"c", 0}}, {"a", "b", "c"});
  StragglerWatch watch(straggler_options());
  EXPECT_TRUE(watch.watch(job.s, round_with(job, {"c", 0}, 1)).empty()) << "a generation is watched once complete";
  job.s.complete = true;
  Actions out = watch.watch(job.s, round_with(job, {"c", 0}, 2));
  auto found = events_of<ev::Straggler>(out);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].host, "c");
  EXPECT_EQ(found[0].rank, 2);
  EXPECT_EQ(found[0].action, "evict");
  EXPECT_DOUBLE_EQ(found[0].cooldown, 10);
  EXPECT_EQ(all_of<act::SlotsChanged>(out).size(), 1u);
  EXPECT_TRUE(watch.resting({"c", 0}));
  EXPECT_EQ(watch.without_resting(job.plan).size(), 2);
  EXPECT_FALSE(watch.without_resting(job.plan).contains({"c", 0}));
  job.s.now += seconds(9);
  EXPECT_TRUE(watch.watch(job.s, {}).empty());
  job.s.now += seconds(2);
  out = watch.watch(job.s, {});
  EXPECT_EQ(all_of<act::SlotsChanged>(out).size(), 1u);
  EXPECT_FALSE(watch.resting({"c", 0}));
  EXPECT_FALSE(watch.any_resting());
}

TEST(StragglerWatch, AStragglerIsOnlyReportedWhereLeavingWouldHurt) {
  struct Case {
    const char* why;
    StragglerPolicy mode;
    bool in_place;
    int min_np;
  };
  for (const Case& c : {Case{"--stragglers report", StragglerPolicy::kReport, true, 1},
                        Case{"restart mode", StragglerPolicy::kEvict, false, 1},
                        Case{"below --min-np", StragglerPolicy::kEvict, true, 3}}) {
    Job job({{"a", 0}, {"b", 0}, {"c", 0}}, {"a", "b", "c"});
    job.s.in_place = c.in_place;
    job.s.min_np = c.min_np;
    job.s.complete = true;
    StragglerWatch watch(straggler_options(c.mode));
    Actions out = watch.watch(job.s, round_with(job, {"c", 0}, 1));
    auto found = events_of<ev::Straggler>(out);
    ASSERT_EQ(found.size(), 1u) << c.why;
    EXPECT_EQ(found[0].action, "report") << c.why;
    EXPECT_TRUE(all_of<act::SlotsChanged>(out).empty()) << c.why;
    EXPECT_FALSE(watch.any_resting()) << c.why;
  }
  Job job({{"a", 0}, {"b", 0}, {"c", 0}}, {"a", "b", "c"});
  job.s.complete = true;
  StragglerWatch off(straggler_options(StragglerPolicy::kOff));
  EXPECT_TRUE(off.watch(job.s, round_with(job, {"c", 0}, 1)).empty());
}

JoinRequest join_of(const SlotKey& slot, uint32_t probe_us, uint32_t link_us, uint32_t probe_port = 0) {
  JoinRequest j;
  j.slot = slot;
  j.probe_us = probe_us;
  j.link_us = link_us;
  j.probe_port = probe_port;
  return j;
}

TEST(StragglerWatch, PreflightHoldsBackANewHostsSlowWorkerAndItsRestsDouble) {
  Job job({{"a", 0}, {"b", 0}}, {"a", "b", "n"});
  MembershipSnapshot m;
  m.generation = 3;
  m.members = std::vector<JoinRequest>{join_of({"a", 0}, 1000, 2000), join_of({"b", 0}, 1200, 2200)};
  WorkerView fresh{7, {}, WorkerState::kPending, WorkerStage::kGrowth, true};
  fresh.assignment.slot = {"n", 0};
  StragglerWatch watch(straggler_options());
  // Within 3 times the members' medians: it joins.
  EXPECT_TRUE(watch.preflight(job.s, fresh, join_of({"n", 0}, 3000, 6000), m).empty());
  // Its link 4 times theirs: held back, stopped, and its slot rests 10 s.
  Actions out = watch.preflight(job.s, fresh, join_of({"n", 0}, 1000, 9000), m);
  auto held = events_of<ev::PreflightHeldBack>(out);
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].check, "link");
  EXPECT_DOUBLE_EQ(held[0].cooldown, 10);
  EXPECT_EQ(keys(all_of<act::Dismiss>(out)), std::vector<long>{7});
  EXPECT_TRUE(watch.resting({"n", 0}));
  // The compute check, next time, rests twice as long; the cap holds after.
  out = watch.preflight(job.s, fresh, join_of({"n", 0}, 5000, 0), m);
  ASSERT_EQ(events_of<ev::PreflightHeldBack>(out).size(), 1u);
  EXPECT_EQ(events_of<ev::PreflightHeldBack>(out)[0].check, "compute");
  EXPECT_DOUBLE_EQ(events_of<ev::PreflightHeldBack>(out)[0].cooldown, 20);
  out = watch.preflight(job.s, fresh, join_of({"n", 0}, 0, kLinkProbeBoundUs), m);
  EXPECT_DOUBLE_EQ(events_of<ev::PreflightHeldBack>(out)[0].cooldown, 25) << "--blacklist-cooldown-range's max";
  // A host the plan already uses is not checked; nor any with --stragglers off.
  WorkerView known = fresh;
  known.assignment.slot = {"a", 1};
  EXPECT_TRUE(watch.preflight(job.s, known, join_of({"a", 1}, 0, 99000), m).empty());
  StragglerWatch off(straggler_options(StragglerPolicy::kOff));
  EXPECT_FALSE(off.preflight_on());
  EXPECT_TRUE(off.preflight(job.s, fresh, join_of({"n", 0}, 0, 99000), m).empty());
}

TEST(StragglerWatch, ANewHostTimesItsLinkWithAMemberOnAnotherHost) {
  Job job({{"a", 0}, {"a", 1}, {"b", 0}}, {"a", "b", "n"});
  MembershipSnapshot m;
  m.generation = 3;
  m.members = std::vector<JoinRequest>{join_of({"a", 0}, 0, 0, 4000), join_of({"a", 1}, 0, 0, 4001),
                                       join_of({"b", 0}, 0, 0, 0)};
  StragglerWatch watch(straggler_options());
  watch.note_probe_responders(m);
  auto peer = watch.probe_peer_for("n", job.plan);
  ASSERT_TRUE(peer);
  EXPECT_EQ(peer->first, (SlotKey{"a", 0})) << "one responder per host, b answers none";
  EXPECT_EQ(peer->second, 4000u);
  EXPECT_FALSE(watch.probe_peer_for("a", job.plan)) << "a host of the plan is not new";
}

// ---- HostMemoryKeeper ----

TEST(HostMemoryKeeper, AHostWithoutAgentOrWorkerGetsAKeeperWithBackoffUntilItsWorkersReturn) {
  Job job({{"a", 0}, {"b", 0}}, {"a", "b"});
  HostMemoryKeeper keeper;
  EXPECT_FALSE(keeper.due(job.s.now)) << "no host holds the job's memory yet";
  keeper.holds("a");
  keeper.holds("b");
  job.worker(2).alive = false;  // b: no worker, and its agent is gone
  auto alive = [](const std::string& host) { return host != "b"; };
  auto blacklisted = [](const std::string&) { return false; };
  ASSERT_TRUE(keeper.due(job.s.now));
  EXPECT_TRUE(keeper.tend(job.s, alive, blacklisted).empty()) << "a moment for the plan to use it again";
  EXPECT_FALSE(keeper.due(job.s.now + seconds(1) / 2)) << "once a second";
  job.s.now += seconds(3);
  Actions out = keeper.tend(job.s, alive, blacklisted);
  ASSERT_EQ(all_of<act::KeepMemory>(out).size(), 1u);
  EXPECT_EQ(all_of<act::KeepMemory>(out)[0].host, "b");
  keeper.kept("b", false);  // the start failed
  job.s.now += seconds(2);
  EXPECT_TRUE(keeper.tend(job.s, alive, blacklisted).empty()) << "tried again after 5 s";
  job.s.now += seconds(4);
  out = keeper.tend(job.s, alive, blacklisted);
  ASSERT_EQ(all_of<act::KeepMemory>(out).size(), 1u);
  keeper.kept("b", true);
  // Workers run on b again: their agent holds the memory, the keeper goes.
  job.worker(2).alive = true;
  job.s.now += seconds(1);
  out = keeper.tend(job.s, alive, blacklisted);
  ASSERT_EQ(all_of<act::UnkeepMemory>(out).size(), 1u);
  EXPECT_EQ(all_of<act::UnkeepMemory>(out)[0].host, "b");
}

TEST(HostMemoryKeeper, AHostOutOfDiscoveryOrDrainingGetsNoKeeper) {
  Job job({{"a", 0}}, {"a", "b!"});
  HostMemoryKeeper keeper;
  keeper.holds("b");
  keeper.holds("gone");
  auto dead = [](const std::string&) { return false; };
  auto blacklisted = [](const std::string&) { return false; };
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(keeper.tend(job.s, dead, blacklisted).empty());
    job.s.now += seconds(3);
  }
}

// ---- DepartedHosts ----

HostSet hosts_named(const std::vector<std::string>& names) {
  std::vector<Host> v;
  for (auto& n : names) v.push_back(Host{.name = n, .slots = 2});
  return HostSet(v);
}

TEST(DepartedHosts, AHostDiscoveryDroppedIsReleasedOnceNothingOfTheJobRunsOrIsKeptThere) {
  // Ranks on a, b and c; discovery now lists a and d only.
  Job job({{"a", 0}, {"b", 0}, {"c", 0}}, {"a", "d"});
  DepartedHosts departed;
  EXPECT_FALSE(departed.due(job.s.now)) << "nothing dropped yet";
  departed.listed(hosts_named({"a", "b", "c", "e"}), job.listed);
  EXPECT_EQ(departed.pending(), 3u) << "b, c and e left discovery";
  auto keeps = [](const std::string& host) { return host == "e"; };  // e keeps a commit replica
  ASSERT_TRUE(departed.due(job.s.now));
  EXPECT_TRUE(departed.tend(job.s, keeps).empty()) << "b's and c's workers still run; e keeps a replica";
  EXPECT_FALSE(departed.due(job.s.now + seconds(1) / 2)) << "once a second";
  job.worker(2).alive = false;  // b's worker ended (dismissed)
  job.s.now += seconds(1);
  Actions out = departed.tend(job.s, keeps);
  ASSERT_EQ(all_of<act::ReleaseAgent>(out).size(), 1u);
  EXPECT_EQ(all_of<act::ReleaseAgent>(out)[0].host, "b");
  EXPECT_EQ(out.size(), 1u) << "a released host gets nothing else";
  EXPECT_EQ(departed.pending(), 2u) << "b is released once";
  job.s.now += seconds(1);
  EXPECT_TRUE(departed.tend(job.s, keeps).empty()) << "c's worker runs, e keeps";
  job.worker(3).alive = false;
  job.s.now += seconds(1);
  out = departed.tend(job.s, keeps);
  ASSERT_EQ(all_of<act::ReleaseAgent>(out).size(), 1u);
  EXPECT_EQ(all_of<act::ReleaseAgent>(out)[0].host, "c");
  EXPECT_EQ(departed.pending(), 1u) << "e waits while it keeps a replica";
}

TEST(DepartedHosts, AHostListedAgainBeforeItsWorkersEndedKeepsItsAgent) {
  Job job({{"a", 0}, {"b", 0}}, {"a"});
  DepartedHosts departed;
  departed.listed(hosts_named({"a", "b"}), job.listed);
  ASSERT_EQ(departed.pending(), 1u);
  departed.listed(job.listed, hosts_named({"a", "b"}));  // b is back
  EXPECT_EQ(departed.pending(), 0u);
  EXPECT_FALSE(departed.due(job.s.now));
  job.worker(2).alive = false;  // were b still departed, this would release it
  EXPECT_TRUE(departed.tend(job.s, [](const std::string&) { return false; }).empty()) << "b is listed again";
}

// ---- StandbyPolicy ----

DriverOptions standby_options(int standby) {
  DriverOptions o;
  o.standby = standby;
  o.rendezvous_timeout = seconds(60);
  return o;
}

WorkerView standby_on(long key, const SlotKey& slot, WorkerStage stage, TimePoint started) {
  WorkerView w{key, {}, WorkerState::kPending, stage, true, started};
  w.assignment.slot = slot;
  w.assignment.rank = -1;
  return w;
}

TEST(StandbyPolicy, StandbysStartBesideTheMembersFirstThenOnSpareHostsUpToTheWanted) {
  // a:2 runs ranks 0 and 1, b:2 runs rank 2: b[1] is the members' free slot; c is spare.
  Job job({{"a", 0}, {"a", 1}, {"b", 0}}, {"a", "b", "c"});
  StandbyPolicy standbys(standby_options(2));
  StandbyPolicy::Turn turn;
  turn.usable = &job.hosts;
  turn.starts = true;
  Actions out = standbys.tend(job.s, turn);
  auto launched = all_of<act::LaunchStandby>(out);
  ASSERT_EQ(launched.size(), 2u);
  EXPECT_EQ(launched[0].assignment.slot, (SlotKey{"b", 1}));
  EXPECT_FALSE(launched[0].spare);
  EXPECT_EQ(launched[1].assignment.slot, (SlotKey{"c", 0}));
  EXPECT_TRUE(launched[1].spare);
  EXPECT_EQ(launched[0].assignment.rank, -1) << "a standby has no rank until promoted";
  EXPECT_EQ(launched[0].master_host, "a");
  // Restart mode keeps none; a generation not yet complete starts none.
  job.s.in_place = false;
  EXPECT_EQ(standbys.wanted(job.s), 0);
  job.s.in_place = true;
  turn.starts = false;
  StandbyPolicy later(standby_options(-1));
  EXPECT_TRUE(later.tend(job.s, turn).empty());
  EXPECT_EQ(later.wanted(job.s), 1) << "one by default";
}

TEST(StandbyPolicy, AStandbyIsReadyOnceItWaitsIsGivenUpPastTheTimeoutAndItsSlotWaitsDoubling) {
  Job job({{"a", 0}}, {"a"});
  const TimePoint t0 = job.s.now;
  job.s.workers.push_back(standby_on(2, {"a", 1}, WorkerStage::kStandby, t0));
  StandbyPolicy standbys(standby_options(1));
  StandbyPolicy::Turn turn;
  turn.usable = &job.hosts;
  turn.starts = true;
  job.s.now = t0 + seconds(3);
  job.s.waiting = {{"a", 1}};
  Actions out = standbys.tend(job.s, turn);
  ASSERT_EQ(all_of<act::SetStage>(out).size(), 1u);
  EXPECT_EQ(all_of<act::SetStage>(out)[0].stage, WorkerStage::kStandbyReady);
  ASSERT_EQ(events_of<ev::StandbyReady>(out).size(), 1u);
  EXPECT_DOUBLE_EQ(events_of<ev::StandbyReady>(out)[0].seconds, 3.0);
  EXPECT_TRUE(all_of<act::LaunchStandby>(out).empty()) << "one is wanted and one lives";
  // Another that never reaches the rendezvous is killed at --rendezvous-timeout.
  job.s.workers.back() = standby_on(3, {"a", 1}, WorkerStage::kStandby, t0);
  job.s.waiting.clear();
  job.s.now = t0 + seconds(61);
  out = standbys.tend(job.s, turn);
  ASSERT_EQ(all_of<act::Exclude>(out).size(), 1u);
  EXPECT_EQ(all_of<act::Exclude>(out)[0].worker, 3);
  EXPECT_TRUE(all_of<act::LaunchStandby>(out).empty()) << "its slot waits 1 s first";
  job.s.workers.back().alive = false;
  job.s.now += seconds(2);
  EXPECT_EQ(all_of<act::LaunchStandby>(standbys.tend(job.s, turn)).size(), 1u);
  standbys.lost({"a", 1}, job.s.now, "ended with exit code 1");
  job.s.now += seconds(1);
  EXPECT_TRUE(all_of<act::LaunchStandby>(standbys.tend(job.s, turn)).empty()) << "the second wait is 2 s";
  job.s.now += seconds(2);
  EXPECT_EQ(all_of<act::LaunchStandby>(standbys.tend(job.s, turn)).size(), 1u);
}

TEST(StandbyPolicy, StandbysStopWhenTheirHostLeavesOrTheJobFinishes) {
  Job job({{"a", 0}}, {"a"});
  job.s.workers.push_back(standby_on(2, {"a", 1}, WorkerStage::kStandbyReady, job.s.now));
  job.s.workers.push_back(standby_on(3, {"gone", 0}, WorkerStage::kStandby, job.s.now));
  StandbyPolicy standbys(standby_options(2));
  StandbyPolicy::Turn turn;
  turn.usable = &job.hosts;
  Actions out = standbys.tend(job.s, turn);
  ASSERT_EQ(all_of<act::Stop>(out).size(), 1u);
  EXPECT_EQ(all_of<act::Stop>(out)[0].worker, 3);
  turn.finishing = true;
  EXPECT_EQ(all_of<act::Stop>(standbys.tend(job.s, turn)).size(), 2u);
}

// A standby told to stop is on its way out until its exit is seen: it is not
// stopped again each turn, nor counted, nor promoted, and its slot gets no
// other standby until it is gone.
TEST(StandbyPolicy, AStandbyBeingStoppedIsNeitherCountedNorPromoted) {
  Job job({{"a", 0}, {"b", 0}}, {"a", "b"});
  job.worker(2).alive = false;  // rank 1 on b was lost
  job.s.workers.push_back(standby_on(3, {"b", 1}, WorkerStage::kStandbyReady, job.s.now));
  job.s.workers.back().state = WorkerState::kStopping;
  job.s.waiting = {{"b", 1}};
  StandbyPolicy standbys(standby_options(1));
  StandbyPolicy::Turn turn;
  turn.usable = &job.hosts;
  turn.starts = true;
  Actions out = standbys.tend(job.s, turn);
  EXPECT_TRUE(all_of<act::Stop>(out).empty()) << "stopped again";
  EXPECT_TRUE(all_of<act::SetStage>(out).empty());
  auto launched = all_of<act::LaunchStandby>(out);
  ASSERT_EQ(launched.size(), 1u) << "the one wanted is not counted as live";
  EXPECT_NE(launched[0].assignment.slot, (SlotKey{"b", 1})) << "a slot still held by the stopping standby";
  EXPECT_FALSE(standby_ready_at(job.s, {"b", 1}));
  Plan full = plan_over_slots(4, {{"a", 0}, {"b", 0}});
  EXPECT_EQ(standbys.with_standbys(job.s, full).ranks[1].slot, (SlotKey{"b", 0})) << "promoted while stopping";
  EXPECT_TRUE(standbys.overtake(job.s).empty());
}

TEST(StandbyPolicy, ALostMembersSlotGoesToTheNearestReadyStandby) {
  // Racks: a and b in r1, c in r2. Rank 1 (on b) was lost.
  Job job({{"a", 0}, {"b", 0}}, {"a", "b", "c"});
  std::vector<Host> racked = job.hosts.hosts();
  racked[0].rack = racked[1].rack = "r1";
  racked[2].rack = "r2";
  job.hosts = HostSet(racked);
  job.worker(2).alive = false;
  job.s.workers.push_back(standby_on(3, {"c", 0}, WorkerStage::kStandbyReady, job.s.now));
  job.s.workers.push_back(standby_on(4, {"a", 1}, WorkerStage::kStandbyReady, job.s.now));
  job.s.workers.push_back(standby_on(5, {"c", 1}, WorkerStage::kStandby, job.s.now));  // not ready
  StandbyPolicy standbys(standby_options(2));
  Plan next = standbys.with_standbys(job.s, plan_over_slots(4, {{"a", 0}, {"b", 0}}));
  ASSERT_EQ(next.size(), 2);
  EXPECT_EQ(next.ranks[0].slot, (SlotKey{"a", 0})) << "a survivor keeps its slot";
  EXPECT_EQ(next.ranks[1].slot, (SlotKey{"a", 1})) << "the standby in b's rack, not c's";
  EXPECT_TRUE(standby_ready_at(job.s, {"c", 0}));
  EXPECT_FALSE(standby_ready_at(job.s, {"c", 1}));
}

TEST(StandbyPolicy, AReadyStandbyOvertakesAReplacementStillStarting) {
  Job job({{"a", 0}, {"b", 0}}, {"a", "b"});
  WorkerView slow = standby_on(3, {"b", 0}, WorkerStage::kReplacement, job.s.now);
  slow.assignment.rank = 1;
  job.worker(2).alive = false;
  job.s.workers.push_back(slow);
  job.s.workers.push_back(standby_on(4, {"b", 1}, WorkerStage::kStandbyReady, job.s.now));
  StandbyPolicy standbys(standby_options(1));
  EXPECT_TRUE(standbys.overtake(job.s).empty()) << "the standby does not wait in the rendezvous";
  job.s.waiting = {{"b", 1}};
  Actions out = standbys.overtake(job.s);
  ASSERT_EQ(all_of<act::Stop>(out).size(), 1u);
  EXPECT_EQ(all_of<act::Stop>(out)[0].worker, 3);
  auto promoted = all_of<act::Promote>(out);
  ASSERT_EQ(promoted.size(), 1u);
  EXPECT_EQ(promoted[0].worker, 4);
  EXPECT_EQ(promoted[0].rank, 1);
  EXPECT_EQ(promoted[0].stage, WorkerStage::kReplacement);
  EXPECT_EQ(all_of<act::Replan>(out).size(), 1u);
  // A replacement already waiting keeps its place.
  job.s.waiting.insert({"b", 0});
  EXPECT_TRUE(standbys.overtake(job.s).empty());
}

// ---- PeerReports ----

JoinRequest rejoin(const SlotKey& slot, long left, int failed_rank, PeerState state) {
  JoinRequest j;
  j.slot = slot;
  j.left_generation = left;
  j.reason = JoinReason::kPeerLost;
  j.failed_rank = failed_rank;
  j.failed_state = state;
  j.commit_id = 7;
  return j;
}

TEST(PeerReports, ARankReportedExitedIsExcludedOnceAndTheGenerationFails) {
  Job job({{"a", 0}, {"b", 0}, {"c", 0}}, {"a", "b", "c"});
  PeerReports reports;
  reports.published(job.plan);
  Actions out = reports.take(job.s, {rejoin({"a", 0}, 3, 2, PeerState::kDead),
                                     rejoin({"b", 0}, 3, 2, PeerState::kDead)});
  EXPECT_EQ(events_of<ev::Rejoined>(out).size(), 2u);
  EXPECT_EQ(all_of<act::RolledBack>(out).size(), 2u) << "the driver writes it once per generation";
  ASSERT_EQ(all_of<act::Exclude>(out).size(), 1u) << "two reports, one exclusion";
  EXPECT_EQ(all_of<act::Exclude>(out)[0].worker, 3);
  ASSERT_EQ(all_of<act::FailGeneration>(out).size(), 1u);
  EXPECT_EQ(all_of<act::FailGeneration>(out)[0].host, "c");
  EXPECT_EQ(all_of<act::FailGeneration>(out)[0].rank, 2);
  EXPECT_EQ(events_of<ev::WorkerExcluded>(out)[0].state, to_string(PeerState::kDead));
}

TEST(PeerReports, NoOneIsExcludedForReportingItselfOrForARankThatReJoinedItself) {
  Job job({{"a", 0}, {"b", 0}}, {"a", "b"});
  PeerReports reports;
  reports.published(job.plan);
  EXPECT_TRUE(all_of<act::Exclude>(reports.take(job.s, {rejoin({"a", 0}, 3, 0, PeerState::kAlive)})).empty());
  // b re-joins from generation 3 in the same turn as a's report naming it.
  JoinRequest b_back = rejoin({"b", 0}, 3, -1, PeerState::kUnknown);
  EXPECT_TRUE(
      all_of<act::Exclude>(reports.take(job.s, {rejoin({"a", 0}, 3, 1, PeerState::kAlive), b_back})).empty());
  // A report of a generation no longer kept names nobody.
  EXPECT_TRUE(all_of<act::Exclude>(reports.take(job.s, {rejoin({"a", 0}, 1, 1, PeerState::kDead)})).empty());
}

TEST(PeerReports, ASilentRankIsExcludedAloneAtOnceButSeveralOnlyOnceTheGenerationSettles) {
  {
    Job job({{"a", 0}, {"b", 0}, {"c", 0}}, {"a", "b", "c"});
    PeerReports reports;
    reports.published(job.plan);
    Actions out = reports.take(job.s, {rejoin({"a", 0}, 3, 2, PeerState::kSilent)});
    EXPECT_TRUE(all_of<act::Exclude>(out).empty()) << "b neither re-joined nor ended yet";
    out = reports.take(job.s, {rejoin({"b", 0}, 3, -1, PeerState::kUnknown)});
    ASSERT_EQ(all_of<act::Exclude>(out).size(), 1u) << "every other member re-joined: c alone is open";
    EXPECT_EQ(all_of<act::Exclude>(out)[0].worker, 3);
  }
  {
    // Four ranks: a names c silent, b re-joins; c and d stay open together.
    Job job({{"a", 0}, {"b", 0}, {"c", 0}, {"d", 0}}, {"a", "b", "c", "d"});
    PeerReports reports;
    reports.published(job.plan);
    Actions out = reports.take(job.s, {rejoin({"a", 0}, 3, 2, PeerState::kSilent),
                                       rejoin({"b", 0}, 3, -1, PeerState::kUnknown)});
    EXPECT_TRUE(all_of<act::Exclude>(out).empty());
    job.s.now += std::chrono::milliseconds(400);
    EXPECT_TRUE(all_of<act::Exclude>(reports.take(job.s, {})).empty()) << "not settled for 500 ms yet";
    job.s.now += std::chrono::milliseconds(200);
    out = reports.take(job.s, {});
    auto excluded = all_of<act::Exclude>(out);
    ASSERT_EQ(excluded.size(), 2u);
    EXPECT_EQ(excluded[0].worker, 3);
    EXPECT_EQ(excluded[1].worker, 4);
    EXPECT_TRUE(all_of<act::Exclude>(reports.take(job.s, {})).empty()) << "decided once";
  }
}

// ---- RejoinDeadlines and retire_due ----

DriverOptions rejoin_options(WorkerMode mode = WorkerMode::kElastic) {
  DriverOptions o;
  o.rendezvous_timeout = seconds(60);
  o.collective_timeout = seconds(5);
  o.mode = mode;
  return o;
}

MembershipSnapshot joined_slots(const std::vector<SlotKey>& members, const std::vector<SlotKey>& waiting = {}) {
  std::vector<JoinRequest> m, w;
  for (auto& s : members) m.push_back(JoinRequest{s});
  for (auto& s : waiting) w.push_back(JoinRequest{s});
  MembershipSnapshot snap;
  snap.members = std::move(m);
  snap.waiting = std::move(w);
  return snap;
}

TEST(RejoinDeadlines, AfterAFailureASurvivorHasTheCollectiveTimeoutAndANewWorkerTheRendezvousTimeout) {
  Job job({{"a", 0}, {"b", 0}, {"c", 0}}, {"a", "b", "c"});
  for (auto& w : job.s.workers) {
    w.joined = true;
    w.launched_generation = 2;  // survivors of generation 2
  }
  job.worker(3).launched_generation = 3;  // c's worker was launched for this generation
  job.worker(3).joined = false;
  job.s.after_failure = true;
  job.s.published_at = job.s.now;
  const RejoinDeadlines rejoin(rejoin_options());
  const MembershipSnapshot m = joined_slots({{"a", 0}});
  job.s.now += seconds(5);
  EXPECT_FALSE(rejoin.due(job.s.published_at, true, job.s.now)) << "collective timeout + 1 s not over";
  EXPECT_TRUE(rejoin.watch(job.s, m).empty());
  job.s.now += seconds(2);
  ASSERT_TRUE(rejoin.due(job.s.published_at, true, job.s.now));
  Actions out = rejoin.watch(job.s, m);
  // b, a survivor that did not re-join, fails the generation and is left out; a joined; c still has time.
  ASSERT_EQ(all_of<act::Exclude>(out).size(), 1u);
  EXPECT_EQ(all_of<act::Exclude>(out)[0].worker, 2);
  auto failed = all_of<act::FailGeneration>(out);
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].host, "b");
  EXPECT_EQ(failed[0].status.signal, SIGKILL);
  // Not after a failure: survivors get the rendezvous timeout too.
  job.s.after_failure = false;
  EXPECT_FALSE(rejoin.due(job.s.published_at, false, job.s.now));
  EXPECT_TRUE(rejoin.watch(job.s, m).empty());
  job.s.now = job.s.published_at + seconds(61);
  out = rejoin.watch(job.s, m);
  ASSERT_EQ(all_of<act::Exclude>(out).size(), 2u) << "b and c are late now";
  // A complete generation has no deadline; a worker waiting in the rendezvous is never late.
  job.s.complete = true;
  EXPECT_TRUE(rejoin.watch(job.s, m).empty());
  job.s.complete = false;
  EXPECT_EQ(all_of<act::Exclude>(rejoin.watch(job.s, joined_slots({{"a", 0}}, {{"b", 0}, {"c", 0}}))).size(), 0u);
}

TEST(RejoinDeadlines, ARestartModeWorkerThatNeverJoinedIsNotLateAndPendingOrLeftOutOnesAreSkipped) {
  Job job({{"a", 0}, {"b", 0}, {"c", 0}}, {"a", "b", "c"});
  job.s.published_at = job.s.now - seconds(120);
  job.worker(2).state = WorkerState::kPending;
  job.worker(3).state = WorkerState::kRetiring;
  const MembershipSnapshot none;
  EXPECT_TRUE(RejoinDeadlines(rejoin_options(WorkerMode::kAuto)).watch(job.s, none).empty())
      << "never joined, mode auto: a program that does not use erun's rendezvous";
  Actions out = RejoinDeadlines(rejoin_options(WorkerMode::kElastic)).watch(job.s, none);
  ASSERT_EQ(all_of<act::Exclude>(out).size(), 1u);
  EXPECT_EQ(all_of<act::Exclude>(out)[0].worker, 1);
}

TEST(RetireDue, ARetiringWorkerStopsOnceItWaitsInTheRendezvousOrAtItsDeadline) {
  Job job({{"a", 0}, {"b", 0}, {"c", 0}}, {"a", "b", "c"});
  job.worker(2).state = WorkerState::kRetiring;
  job.worker(2).retire_by = job.s.now + seconds(60);
  job.worker(3).state = WorkerState::kRetiring;
  job.worker(3).retire_by = job.s.now + seconds(60);
  EXPECT_TRUE(retire_due(job.s).empty());
  job.s.waiting = {{"b", 0}};
  EXPECT_EQ(keys(all_of<act::Dismiss>(retire_due(job.s))), (std::vector<long>{2}));
  job.s.waiting.clear();
  job.s.now += seconds(60);
  EXPECT_EQ(keys(all_of<act::Dismiss>(retire_due(job.s))), (std::vector<long>{2, 3}));
  job.worker(3).alive = false;  // ended meanwhile: nothing to stop
  EXPECT_EQ(keys(all_of<act::Dismiss>(retire_due(job.s))), (std::vector<long>{2}));
}

}  // namespace
}  // namespace erun
