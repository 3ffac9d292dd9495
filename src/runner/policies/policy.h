// What the driver's policies see and what they ask for (docs/design.md,
// "Policies"). Each turn of its loop the driver builds a JobSnapshot, an
// immutable view of the job (the clock, the generation, the running plan,
// the workers, the hosts as discovery lists them); a policy (draining,
// stragglers, host memory, ...) reads it and returns Actions: stop this
// worker, kill that one, count a reset, write this event, look at the
// slots again. The driver applies them in one place (Driver::apply). A
// policy keeps its own state (its drains, its rests) but never touches a
// worker, a launcher or the event log, so a unit test builds a snapshot by
// hand and checks what comes back, with no driver.
#pragma once

#include <functional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "common/clock.h"
#include "common/subprocess.h"
#include "discovery/discovery.h"
#include "rendezvous/membership.h"
#include "runner/driver_states.h"
#include "runner/hosts/host_manager.h"
#include "runner/hosts/planner.h"
#include "runner/observe/events.h"

namespace erun {

// One worker as the driver tracks it, at the snapshot's time.
struct WorkerView {
  long key = 0;  // the driver's name for it (actions name workers by it)
  RankAssignment assignment;
  WorkerState state = WorkerState::kMember;
  WorkerStage stage = WorkerStage::kSettled;
  bool alive = false;  // running: its exit is not seen yet
  TimePoint started{};  // when it was launched
  long launched_generation = 0;  // the generation it was launched in
  bool joined = false;  // it joined the rendezvous at least once (in-place capable)
  TimePoint retire_by{};  // kRetiring: stopped at this deadline unless it re-joins first

  bool pending() const { return state == WorkerState::kPending; }
  // Out of the running plan for good: retiring, dismissed or excluded.
  bool left_out() const { return is_left_out(state); }
  // Pending for a plan: a failed rank's replacement or a growth's worker.
  bool replacement() const { return pending() && is_replacing(stage); }
  // Alive and still part of the job's plan (a pending one included).
  bool survivor() const { return alive && !left_out(); }
};

struct JobSnapshot {
  TimePoint now{};
  long generation = 0;
  TimePoint published_at{};            // when the current generation was published
  bool after_failure = false;          // it re-forms after a failure
  bool complete = false;               // every rank of its plan joined it
  const Plan* plan = nullptr;          // the running plan (never null in a snapshot the driver built)
  std::vector<WorkerView> workers;     // every worker not yet forgotten
  const HostSet* listed = nullptr;     // the hosts as discovery lists them (draining marks included)
  const HostSet* hosts = nullptr;      // `listed` less the draining hosts: what the plans use
  std::set<SlotKey> waiting;           // slots whose worker waits in the rendezvous for a newer generation
  bool in_place = false;               // the job recovers in place (else it restarts every worker)
  int min_np = 1;                      // --min-np
  const HostManager* blacklist = nullptr;  // the driver's: a blacklisted host gets no new member

  const Plan& running() const { return *plan; }
  // Discovery lists `host` (draining or not).
  bool discovered(const std::string& host) const { return listed && listed->find(host) >= 0; }
  // The plans may use `host`: discovery lists it and it does not drain.
  bool usable(const std::string& host) const { return hosts && hosts->find(host) >= 0; }
  // `host` is blacklisted: its live workers stay, but nothing there becomes a member.
  bool sits_out(const std::string& host) const { return blacklist && blacklist->is_blacklisted(host); }
  // The hosts where a worker of the job runs now (its exit not seen yet).
  std::set<std::string> working_hosts() const {
    std::set<std::string> out;
    for (const WorkerView& w : workers) {
      if (w.alive) out.insert(w.assignment.slot.host);
    }
    return out;
  }
};

namespace act {
// SIGTERM to the worker, which is stopped on purpose (WorkerState::kDismissed):
// its end is no failure.
struct Dismiss {
  long worker = 0;
};
// SIGTERM to the worker, which erun stops (WorkerState::kStopping): a
// standby or a replacement given up, its end no failure.
struct Stop {
  long worker = 0;
};
// SIGKILL to the worker: its end is a failure, handled as any.
struct Kill {
  long worker = 0;
};
// SIGKILL to the worker, left out for good (WorkerState::kExcluded): a
// pending worker given up.
struct Exclude {
  long worker = 0;
};
// The worker reached `stage` (WorkerStage's checked table).
struct SetStage {
  long worker = 0;
  WorkerStage stage = WorkerStage::kSettled;
};
// Launch a standby on `assignment`'s slot (its rank -1: none yet), which
// times its link against `master_host`; `spare`: a host beyond the plan's.
struct LaunchStandby {
  RankAssignment assignment;
  std::string master_host;
  int wanted = 1;
  bool spare = false;
};
// The standby takes a place in the job: the rank (-1: the plan's, given
// later) and stage (kReplacement or kGrowth) of that place; `reason` for
// the log and the event.
struct Promote {
  long worker = 0;
  int rank = -1;
  WorkerStage stage = WorkerStage::kReplacement;
  std::string reason;
};
// The next plan must be made again (its slots changed hands).
struct Replan {};
// A survivor of `generation` re-joined at `commit`, which it restored: the
// work since then was thrown away (the account's rolled-back time; written
// once per generation).
struct RolledBack {
  long generation = 0;
  uint64_t commit = 0;
  double commit_age_s = -1;  // how long before its JOIN the survivor made it (-1: unknown)
};
// The current generation failed: rank `rank` on `host` ended with `status`
// after `after_s` (`stderr_tail`: what to show of it). The first failure of
// a generation stands.
struct FailGeneration {
  std::string host;
  int rank = 0;
  ExitStatus status;
  std::vector<std::string> stderr_tail;
  double after_s = 0;
};
// One more reset (--reset-limit counts them).
struct CountReset {
  std::string reason;
};
// A line for the event log.
struct Emit {
  Event event;
};
// The usable slots may have changed (a slot rests, a rest ended): the plans
// look at them again.
struct SlotsChanged {};
// The usable hosts changed (a drain started or ended): the driver derives
// them from discovery's list again.
struct HostsChanged {};
// Start an agent on the host that only holds the job's host memory.
struct KeepMemory {
  std::string host;
};
// The agent started by KeepMemory goes: the host's workers' agent holds the memory now.
struct UnkeepMemory {
  std::string host;
};
// The job needs no agent on the host any more (it left discovery, runs no
// worker of the job and keeps no replica): its agent is told SHUTDOWN.
struct ReleaseAgent {
  std::string host;
};
}  // namespace act

using Action = std::variant<act::Dismiss, act::Stop, act::Kill, act::Exclude, act::SetStage, act::CountReset,
                            act::Emit, act::SlotsChanged, act::HostsChanged, act::KeepMemory, act::UnkeepMemory,
                            act::ReleaseAgent, act::LaunchStandby, act::Promote, act::Replan, act::RolledBack,
                            act::FailGeneration>;
using Actions = std::vector<Action>;

}  // namespace erun
