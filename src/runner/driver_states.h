// The driver's state machines, as values: the job's phase, each worker's
// state and its stage, with the transitions the driver may take. Driver::step()
// dispatches on the phase; a transition outside these tables is a bug in erun
// (ERUN_CHECK). docs/design.md draws both machines.
#pragma once

namespace erun {

enum class JobPhase {
  // No worker holds a commit: wait for --min-np usable slots, then start a
  // generation (every worker launched fresh).
  kWaitingForHosts,
  // In place, below --min-np: the survivors wait inside the rendezvous with
  // their state until hosts return or --elastic-timeout passes.
  kWaitingWithSurvivors,
  // A generation runs: failures, re-joins, replacements and membership
  // changes are handled here.
  kRunning,
  // A rank finished: the others have --finish-timeout to finish too.
  kFinishing,
  // Every live worker was told to stop (SIGTERM, SIGKILL after --term-grace):
  // once all are gone the job goes on waiting for hosts, or ends.
  kStopping,
  // The exit code is decided.
  kDone,
};

enum class WorkerState {
  // Launched beside a running generation and not admitted yet: a failed
  // rank's replacement, a new slot's worker, or a standby (its WorkerStage
  // says which); it waits in the rendezvous until admitted.
  kPending,
  // Holds a rank of the running plan.
  kMember,
  // Its slot left the plan: stopped once it re-joins, or at its deadline
  // (Worker::retire_by).
  kRetiring,
  // Told to stop on purpose and on its way out: its host drains, its slot
  // rests (a straggler, pre-flight held it back), or it retired (it
  // re-joined, its deadline passed, its generation failed).
  kDismissed,
  // Killed and left out for good: reported failed by survivors, missed its
  // re-join deadline, or was never admitted.
  kExcluded,
  // erun stops it (a restart or the job's end): its exit is not a failure.
  kStopping,
};

// How far a worker launched into a running job came; a second checked table
// beside WorkerState (docs/design.md, "A worker's states"). The pending
// stages say what a kPending worker waits for; a stage outlives the state it
// was reached in (a standby stopped is still a standby when it is reaped).
enum class WorkerStage {
  // A pending worker on a free slot, for no plan: it runs the program up to
  // its first join (ERUN_STANDBY=1) and waits there to be promoted.
  kStandby,
  // A standby that waits in the rendezvous (standby_ready logged).
  kStandbyReady,
  // Pending for a plan: a failed rank's replacement (or a standby promoted
  // into a lost member's place).
  kReplacement,
  // Pending for a plan's new slot: its admission is a reset (a membership change).
  kGrowth,
  // Holds a rank, but was launched into a running job and was not yet a
  // member of a complete generation: stopped when training ends.
  kFresh,
  // Launched with its generation (or adopted), or a member of a complete one.
  kSettled,
};

// Whether the driver may go from `from` to `to`. Staying is always allowed.
bool transition_allowed(JobPhase from, JobPhase to);
bool transition_allowed(WorkerState from, WorkerState to);
bool transition_allowed(WorkerStage from, WorkerStage to);

const char* to_string(JobPhase phase);
const char* to_string(WorkerState state);
const char* to_string(WorkerStage stage);

// Out of the running plan for good: retiring, dismissed or excluded.
inline bool is_left_out(WorkerState s) {
  return s == WorkerState::kRetiring || s == WorkerState::kDismissed || s == WorkerState::kExcluded;
}

// erun asked this worker to end: its exit is no failure of the generation.
inline bool is_stopping(WorkerState s) { return is_left_out(s) || s == WorkerState::kStopping; }

// A standby not promoted (whatever its state now).
inline bool is_standby(WorkerStage s) { return s == WorkerStage::kStandby || s == WorkerStage::kStandbyReady; }

// A pending worker in one of these stages is for a plan: a failed rank's
// replacement or a growth's worker (not a standby).
inline bool is_replacing(WorkerStage s) { return s == WorkerStage::kReplacement || s == WorkerStage::kGrowth; }

// The stages a worker launched as kPending has until it is admitted.
inline bool is_pending_stage(WorkerStage s) { return is_standby(s) || is_replacing(s); }

}  // namespace erun
