#include "runner/driver_states.h"

#include <algorithm>
#include <iterator>
#include <utility>

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
      return to == W::kDismissed || to == W::kExcluded;
    case W::kDismissed:
    case W::kStopping:
      return to == W::kExcluded;  // survivors reported it as failed before it was gone
    case W::kExcluded:
      return false;
  }
  return false;
}

bool transition_allowed(WorkerStage from, WorkerStage to) {
  using S = WorkerStage;
  static constexpr std::pair<S, S> kAllowed[] = {
      {S::kStandby, S::kStandbyReady},                                   // it waits in the rendezvous
      {S::kStandby, S::kReplacement},      {S::kStandby, S::kGrowth},      // promoted
      {S::kStandbyReady, S::kReplacement}, {S::kStandbyReady, S::kGrowth},  // promoted
      {S::kReplacement, S::kFresh},        {S::kGrowth, S::kFresh},        // admitted: a member
      {S::kFresh, S::kSettled},                                          // a member of a complete generation
  };
  const auto* end = std::end(kAllowed);
  return from == to || std::find(std::begin(kAllowed), end, std::make_pair(from, to)) != end;
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
    case WorkerState::kDismissed: return "dismissed";
    case WorkerState::kExcluded: return "excluded";
    case WorkerState::kStopping: return "stopping";
  }
  return "?";
}

const char* to_string(WorkerStage stage) {
  switch (stage) {
    case WorkerStage::kStandby: return "standby";
    case WorkerStage::kStandbyReady: return "standby ready";
    case WorkerStage::kReplacement: return "replacement";
    case WorkerStage::kGrowth: return "growth";
    case WorkerStage::kFresh: return "fresh";
    case WorkerStage::kSettled: return "settled";
  }
  return "?";
}

}  // namespace erun
