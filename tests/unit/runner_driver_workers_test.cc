// The questions the driver asks of all its workers at once
// (runner/driver_workers.h), on worker lists built by hand.
#include <gtest/gtest.h>

#include "runner/driver_workers.h"
#include "runner/policies/crash_loop.h"

namespace erun {
namespace {

DriverWorker worker(const SlotKey& slot, WorkerState state, WorkerStage stage, bool alive, bool joined = true) {
  DriverWorker w;
  w.assignment.slot = slot;
  w.state = state;
  w.stage = stage;
  w.joined = joined;
  if (!alive) w.exit = ExitStatus{0, 0};
  return w;
}

// alive() needs a handle: a fake one that does nothing.
class NoHandle : public WorkerHandle {
 public:
  std::optional<ExitStatus> poll() override { return std::nullopt; }
  void terminate() override {}
  void kill() override {}
  void signal(int) override {}
  int take_stdout() override { return -1; }
  int take_stderr() override { return -1; }
  long pid() const override { return 1; }
};

Workers with_handles(Workers ws) {
  for (auto& w : ws) w.handle = std::make_unique<NoHandle>();
  return ws;
}

TEST(DriverWorkers, ASlotIsHeldBySurvivorsOnlyAndAPendingOneOnlyWhenAsked) {
  Workers ws;
  ws.push_back(worker({"a", 0}, WorkerState::kMember, WorkerStage::kSettled, true));
  ws.push_back(worker({"a", 1}, WorkerState::kPending, WorkerStage::kReplacement, true));
  ws.push_back(worker({"b", 0}, WorkerState::kExcluded, WorkerStage::kSettled, true));
  ws.push_back(worker({"b", 1}, WorkerState::kMember, WorkerStage::kSettled, false));
  ws = with_handles(std::move(ws));
  EXPECT_TRUE(slot_held(ws, {"a", 0}, false));
  EXPECT_FALSE(slot_held(ws, {"a", 1}, false));
  EXPECT_TRUE(slot_held(ws, {"a", 1}, true));
  EXPECT_FALSE(slot_held(ws, {"b", 0}, true)) << "left out";
  EXPECT_FALSE(slot_held(ws, {"b", 1}, true)) << "ended";
  EXPECT_TRUE(have_survivors(ws));
  EXPECT_FALSE(all_exited(ws));
  Workers pending_only;
  pending_only.push_back(worker({"a", 1}, WorkerState::kPending, WorkerStage::kReplacement, true));
  pending_only = with_handles(std::move(pending_only));
  EXPECT_FALSE(have_survivors(pending_only)) << "a pending replacement holds no commit";
}

TEST(DriverWorkers, InPlaceNeedsARendezvousAndInAutoModeEveryLiveWorkerJoined) {
  Workers ws;
  ws.push_back(worker({"a", 0}, WorkerState::kMember, WorkerStage::kSettled, true, /*joined=*/true));
  ws.push_back(worker({"a", 1}, WorkerState::kMember, WorkerStage::kSettled, true, /*joined=*/false));
  ws = with_handles(std::move(ws));
  EXPECT_FALSE(in_place_possible(WorkerMode::kElastic, /*rendezvous=*/false, ws));
  EXPECT_FALSE(in_place_possible(WorkerMode::kRestart, true, ws));
  EXPECT_TRUE(in_place_possible(WorkerMode::kElastic, true, ws));
  EXPECT_FALSE(in_place_possible(WorkerMode::kAuto, true, ws)) << "a live worker never joined";
  ws[1].joined = true;
  EXPECT_TRUE(in_place_possible(WorkerMode::kAuto, true, ws));
  EXPECT_FALSE(in_place_possible(WorkerMode::kAuto, true, Workers{})) << "no live worker";
}

TEST(DriverWorkers, PendingReplacementsExtendThePlanAndCoverAPlanThatOnlyAddsTheirSlots) {
  const Plan plan = plan_over_slots(5, {{"a", 0}, {"b", 0}});
  Workers ws;
  ws.push_back(worker({"a", 0}, WorkerState::kMember, WorkerStage::kSettled, true));
  ws.push_back(worker({"b", 0}, WorkerState::kMember, WorkerStage::kSettled, true));
  ws.push_back(worker({"c", 0}, WorkerState::kPending, WorkerStage::kGrowth, true));
  ws.push_back(worker({"d", 0}, WorkerState::kPending, WorkerStage::kStandby, true));  // a standby is no replacement
  ws = with_handles(std::move(ws));
  Plan scratch;
  const Plan& with = plan_with_pending(ws, plan, scratch);
  ASSERT_EQ(with.size(), 3);
  EXPECT_EQ(with.ranks[2].slot, (SlotKey{"c", 0}));
  EXPECT_TRUE(replacements_cover(ws, plan, plan_over_slots(6, {{"a", 0}, {"b", 0}, {"c", 0}})));
  EXPECT_FALSE(replacements_cover(ws, plan, plan_over_slots(6, {{"a", 0}, {"b", 0}, {"e", 0}})));
  EXPECT_FALSE(replacements_cover(ws, plan, plan_over_slots(6, {{"a", 0}, {"b", 0}})));
  Workers none;
  EXPECT_EQ(&plan_with_pending(none, plan, scratch), &plan) << "no copy without pending workers";
}

TEST(DriverWorkers, JoinsMarkTheirWorkersAndAGenerationOfLiveMembersIsCompleteAndSettles) {
  const Plan plan = plan_over_slots(4, {{"a", 0}, {"b", 0}});
  Workers ws;
  ws.push_back(worker({"a", 0}, WorkerState::kMember, WorkerStage::kFresh, true, /*joined=*/false));
  ws.push_back(worker({"b", 0}, WorkerState::kMember, WorkerStage::kFresh, true, /*joined=*/false));
  ws.push_back(worker({"c", 0}, WorkerState::kPending, WorkerStage::kReplacement, true, /*joined=*/false));
  ws = with_handles(std::move(ws));
  CrashLoopDetector crash_loop(3, Duration::zero());
  MembershipSnapshot m;
  m.members = std::vector<JoinRequest>{JoinRequest{{"a", 0}, 7}};
  m.waiting = std::vector<JoinRequest>{JoinRequest{{"c", 0}}};
  EXPECT_FALSE(note_joins(ws, m, plan, crash_loop)) << "b has not joined";
  EXPECT_TRUE(ws[0].joined);
  EXPECT_FALSE(ws[1].joined);
  EXPECT_TRUE(ws[2].joined) << "waiting in the rendezvous counts as joined";
  EXPECT_EQ(ws[0].stage, WorkerStage::kFresh) << "nothing settles before the generation is complete";
  m.members = std::vector<JoinRequest>{JoinRequest{{"a", 0}, 7}, JoinRequest{{"b", 0}, 7}};
  EXPECT_TRUE(note_joins(ws, m, plan, crash_loop));
  EXPECT_EQ(ws[0].stage, WorkerStage::kSettled);
  EXPECT_EQ(ws[1].stage, WorkerStage::kSettled);
  EXPECT_EQ(ws[2].stage, WorkerStage::kReplacement) << "a pending worker is in no published plan";
  // A member left out (or ended) does not count toward the plan.
  ws[1].set_state(WorkerState::kExcluded);
  EXPECT_FALSE(note_joins(ws, m, plan, crash_loop));
}

}  // namespace
}  // namespace erun
