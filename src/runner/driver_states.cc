#include "runner/driver_states.h"

namespace erun {

bool transition_allowed(JobPhase from, JobPhase to) {
  using P = JobPhase;
  if (from == to) return true;
  switch (from) {
    case P::kWaitingForHosts:
      return to == P::kRunning || to == P::kStopping || to == P::kDone;
    case P::kWaitingWithSurvivors:
      // kDone: another driver took the job over (the survivors are its now).
      return to == P::kRunning || to == P::kWaitingForHosts || to == P::kStopping || to == P::kDone;
    case P::kRunning:
      return to == P::kWaitingWithSurvivors || to == P::kFinishing || to == P::kStopping || to == P::kDone;
    case P::kFinishing:
      return to == P::kStopping || to == P::kDone;
    case P::kStopping:
      return to == P::kWaitingForHosts || to == P::kDone;
    case P::kDone:
      return false;
  }
  return false;
}

bool transition_allowed(WorkerState from, WorkerState to) {
  using W = WorkerState;
  if (from == to) return true;
  switch (from) {
    case W::kPending:
    case W::kMember:
      return to != W::kPending;
    case W::kRetiring:
    case W::kStopping:
      return to == W::kExcluded;  // survivors reported it as failed before it was gone
    case W::kExcluded:
      return false;
  }
  return false;
}

const char* to_string(JobPhase phase) {
  switch (phase) {
    case JobPhase::kWaitingForHosts: return "waiting for hosts";
    case JobPhase::kWaitingWithSurvivors: return "waiting with survivors";
    case JobPhase::kRunning: return "running";
    case JobPhase::kFinishing: return "finishing";
    case JobPhase::kStopping: return "stopping";
    case JobPhase::kDone: return "done";
  }
  return "?";
}

const char* to_string(WorkerState state) {
  switch (state) {
    case WorkerState::kPending: return "pending";
    case WorkerState::kMember: return "member";
    case WorkerState::kRetiring: return "retiring";
    case WorkerState::kExcluded: return "excluded";
    case WorkerState::kStopping: return "stopping";
  }
  return "?";
}

}  // namespace erun
