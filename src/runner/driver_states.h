// The driver's two state machines, as values: the job's phase and each
// worker's state, with the transitions the driver may take. Driver::step()
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
  // Launched beside a running generation (a failed rank's replacement, or a
  // new slot's worker): it waits in the rendezvous until admitted.
  kPending,
  // Holds a rank of the running plan.
  kMember,
  // Its slot left the plan: stopped once it re-joins, or at its deadline.
  kRetiring,
  // Killed and left out for good: reported failed by survivors, missed its
  // re-join deadline, or was never admitted.
  kExcluded,
  // erun stops it (a restart or the job's end): its exit is not a failure.
  kStopping,
};

// Whether the driver may go from `from` to `to`. Staying is always allowed.
bool transition_allowed(JobPhase from, JobPhase to);
bool transition_allowed(WorkerState from, WorkerState to);

const char* to_string(JobPhase phase);
const char* to_string(WorkerState state);

// erun asked this worker to end: its exit is no failure of the generation.
inline bool is_stopping(WorkerState s) {
  return s == WorkerState::kRetiring || s == WorkerState::kExcluded || s == WorkerState::kStopping;
}

}  // namespace erun
