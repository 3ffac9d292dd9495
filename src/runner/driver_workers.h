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

class CrashLoopDetector;
class DrainPolicy;
class EventSink;
class Membership;
class OutputForwarder;
class StragglerWatch;

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
// The slots of blacklisted hosts that joined survivors hold (sorted): they
// stay in the plan, their progress is kept, but their hosts get no new
// worker while they sit out (make_plan's `only`).
std::vector<SlotKey> blacklisted_with_survivors(const Workers& workers, const HostManager& hosts);
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
// Some live member of the running plan has joined the rendezvous (the
// job's workers use erun's library: a takeover keeps them in place).
bool members_joined(const Workers& workers);
// A live member of the running plan is on a draining host, or on a slot
// that rests (a straggler's): it leaves at the next commit.
bool draining_members(const Workers& workers, const DrainPolicy& drains, const StragglerWatch& stragglers);
// Discovered hosts that may carry the next plan: the usable ones, and
// blacklisted ones where survivors still run, for those survivors' slots
// alone (their progress is kept; the host gets no new worker).
struct PlannableHosts {
  HostSet hosts;
  std::vector<SlotKey> only;  // make_plan's `only`
  int slots() const { return plannable_slots(hosts, only); }
};
PlannableHosts plannable_hosts(const HostSet& hosts, const HostManager& manager, const Workers& workers);
// After a failure, survivors that alone meet `min_np` go on at once in a
// generation of their own: true, with `next` their plan (over their slots
// and ready standbys' of `full`). False when they hold every slot of
// `full` or are too few.
bool survivors_alone(const Workers& workers, const JobSnapshot& s, int min_np, const Plan& full, Plan& next);
// A failed worker's last stderr lines: its agent's exit report, else (no
// report: a lost agent) the lines forwarded through `output` (may be null).
std::vector<std::string> stderr_tail(const DriverWorker& w, OutputForwarder* output);
// Forgets the workers (`ended_only`: those whose exit is known), their
// output's pipes and stderr lines with them (bench/long_run.py found them
// held for the job's life otherwise).
void drop_workers(Workers& workers, OutputForwarder* output, bool ended_only);
// Members of generation `generation` that ended or were left out, not yet
// reported: the survivors hear of them at once (Membership::notify_peers_lost()).
void tell_survivors_of_losses(Workers& workers, const Plan& plan, long generation, Membership& membership,
                              EventSink& events);
// The rendezvous's members and waiting joins this turn (`m`): the workers
// on their slots have joined at least once (`crash_loop` sees each join's
// commit). When every rank of `plan` is a live member, its fresh members
// settle and the generation is complete: true.
bool note_joins(Workers& workers, const MembershipSnapshot& m, const Plan& plan, CrashLoopDetector& crash_loop);
// Training is over for a rank: stops the workers launched into the running
// job that were never a member of a complete generation (pending ones, and
// ones assigned to a generation the finished ranks never joined): they hold
// nothing to finish, and would wait for their peers forever.
void stop_fresh_workers(Workers& workers, long generation);

}  // namespace erun
