#include "runner/driver_workers.h"

#include <algorithm>
#include <set>
#include <string>

#include "common/check.h"
#include "common/log.h"

namespace erun {

bool DriverWorker::alive() const { return !exit && handle; }
bool DriverWorker::pending() const { return state == WorkerState::kPending; }
bool DriverWorker::standby() const { return is_standby(stage); }
bool DriverWorker::standby_ready() const { return stage == WorkerStage::kStandbyReady; }
bool DriverWorker::replacement() const { return pending() && is_replacing(stage); }
bool DriverWorker::fresh() const { return stage != WorkerStage::kSettled; }
bool DriverWorker::left_out() const { return is_left_out(state); }
WorkerView DriverWorker::view() const {
  return WorkerView{key, assignment, state, stage, alive(), started, launched_generation};
}

void DriverWorker::set_state(WorkerState next) {
  ERUN_CHECK(transition_allowed(state, next));
  if (state == WorkerState::kPending && next == WorkerState::kMember) set_stage(WorkerStage::kFresh);  // admitted
  state = next;
}

void DriverWorker::set_stage(WorkerStage next) {
  ERUN_CHECK(transition_allowed(stage, next));
  stage = next;
}

bool slot_held(const Workers& workers, const SlotKey& slot, bool pending_too) {
  return std::any_of(workers.begin(), workers.end(), [&](const DriverWorker& w) {
    return w.survivor() && (pending_too || !w.pending()) && w.assignment.slot == slot;
  });
}

bool have_survivors(const Workers& workers) {
  // A pending replacement holds no commit.
  return std::any_of(workers.begin(), workers.end(),
                     [&](const DriverWorker& w) { return w.survivor() && w.joined && !w.pending(); });
}

bool all_exited(const Workers& workers) {
  return std::all_of(workers.begin(), workers.end(), [](const DriverWorker& w) { return w.exit.has_value(); });
}

// The hosts of joined survivors that are blacklisted (sorted, once each):
// they stay in the plan (their progress is kept).
std::vector<std::string> blacklisted_with_survivors(const Workers& workers, const HostManager& hosts) {
  std::vector<std::string> keep;
  for (auto& w : workers) {
    if (w.survivor() && w.joined && !w.pending() && hosts.is_blacklisted(w.assignment.slot.host)) {
      keep.push_back(w.assignment.slot.host);
    }
  }
  std::sort(keep.begin(), keep.end());
  keep.erase(std::unique(keep.begin(), keep.end()), keep.end());
  return keep;
}

std::optional<JoinReason> rejoin_requested(const Workers& workers, const MembershipSnapshot& m) {
  for (auto& j : m.waiting) {
    // Joins for the current generation are answered at once; one still
    // waiting asks for a newer generation. A pending replacement waits for
    // admit_replacements().
    if (slot_held(workers, j.slot, /*pending_too=*/false)) return j.reason;
  }
  return std::nullopt;
}

bool in_place_possible(WorkerMode mode, bool rendezvous, const Workers& workers) {
  if (!rendezvous || mode == WorkerMode::kRestart) return false;
  if (mode == WorkerMode::kElastic) return true;
  bool any = false;
  for (auto& w : workers) {
    if (w.exit || w.left_out()) continue;
    if (!w.joined) return false;
    any = true;
  }
  return any;
}

const Plan& plan_with_pending(const Workers& workers, const Plan& plan, Plan& scratch) {
  std::vector<SlotKey> slots;
  for (auto& w : workers) {
    if (w.replacement() && w.survivor() && !plan.contains(w.assignment.slot)) slots.push_back(w.assignment.slot);
  }
  if (slots.empty()) return plan;
  std::vector<SlotKey> all;
  all.reserve(plan.ranks.size() + slots.size());
  for (auto& r : plan.ranks) all.push_back(r.slot);
  all.insert(all.end(), slots.begin(), slots.end());
  scratch = plan_over_slots(plan.generation, all);
  return scratch;
}

bool replacements_cover(const Workers& workers, const Plan& plan, const Plan& next) {
  std::set<SlotKey> running, pending;
  for (auto& r : plan.ranks) running.insert(r.slot);
  for (auto& w : workers) {
    if (w.replacement() && w.survivor()) pending.insert(w.assignment.slot);
  }
  if (pending.empty() || static_cast<size_t>(next.size()) != running.size() + pending.size()) return false;
  return std::all_of(next.ranks.begin(), next.ranks.end(),
                     [&](const RankAssignment& r) { return running.count(r.slot) || pending.count(r.slot); });
}

}  // namespace erun
