// The workers the driver launched or adopted: each one's handle, its
// lifecycle (two checked tables, driver_states.h) and the facts the driver
// keeps about it; and the questions asked of all of them at once.
#pragma once

#include <memory>
#include <string>
#include <optional>
#include <vector>

#include "common/clock.h"
#include "common/subprocess.h"
#include "rendezvous/membership.h"
#include "runner/driver_states.h"
#include "runner/hosts/host_manager.h"
#include "runner/hosts/planner.h"
#include "runner/options.h"
#include "runner/launch/launcher.h"
#include "runner/policies/policy.h"

namespace erun {

struct DriverWorker {
  long key = 0;
  RankAssignment assignment;
  std::unique_ptr<WorkerHandle> handle;
  // Its lifecycle: two checked tables (driver_states.h), changed only
  // through set_state() and set_stage().
  WorkerState state = WorkerState::kMember;
  WorkerStage stage = WorkerStage::kSettled;
  // Facts, not stages: where it runs, what it did, what was sent about it.
  bool local = false;
  bool joined = false;     // it joined the rendezvous at least once (in-place capable)
  bool loss_told = false;  // its loss went to the survivors, or it is no member of the current generation
  long launched_generation = 0;
  TimePoint retire_by{};  // kRetiring: stopped at this deadline unless it re-joins first
  std::optional<ExitStatus> exit;
  TimePoint started{};
  // Checked against transition_allowed(); a pending worker admitted as a
  // member leaves its pending stage for kFresh.
  void set_state(WorkerState next);
  void set_stage(WorkerStage next);
  bool alive() const;
  bool pending() const;
  // A standby not promoted (also once stopped: its end is no failure).
  bool standby() const;
  bool standby_ready() const;
  // Pending for a plan: a failed rank's replacement or a growth's worker (not a standby).
  bool replacement() const;
  // Launched into a running job and not yet a member of a complete generation.
  bool fresh() const;
  // Out of the running plan for good: retiring, dismissed or excluded.
  bool left_out() const;
  // Alive and still part of the job's plan (a pending one included).
  bool survivor() const { return alive() && !left_out(); }
  // What the policies see of it.
  WorkerView view() const;
};

using Workers = std::vector<DriverWorker>;

// A survivor holds `slot` (a pending one counts with `pending_too`).
bool slot_held(const Workers& workers, const SlotKey& slot, bool pending_too);
// A survivor holds a commit: it joined a generation and is no pending one.
bool have_survivors(const Workers& workers);
// Every worker's exit is known.
bool all_exited(const Workers& workers);
// The blacklisted hosts where joined survivors run (sorted, once each):
// they stay in the plan, their progress is kept.
std::vector<std::string> blacklisted_with_survivors(const Workers& workers, const HostManager& hosts);
// A live member of the current generation is blocked in a join: it asks
// for a newer generation. The reason it gave, or nullopt.
std::optional<JoinReason> rejoin_requested(const Workers& workers, const MembershipSnapshot& m);
// The job recovers in place: it has a rendezvous, and --mode elastic, or
// --mode auto and every live worker joined it (it uses erun's library).
bool in_place_possible(WorkerMode mode, bool rendezvous, const Workers& workers);
// `plan` plus the slots of live pending replacements after it: the
// previous plan the next one keeps first (make_plan()), so a worker
// starting on a slot is not passed over for another free one when it
// joins. `scratch` holds the copy when there are pending ones.
const Plan& plan_with_pending(const Workers& workers, const Plan& plan, Plan& scratch);
// `next` differs from `plan` only by the slots of live pending
// replacements: no membership change until they joined.
bool replacements_cover(const Workers& workers, const Plan& plan, const Plan& next);

}  // namespace erun
