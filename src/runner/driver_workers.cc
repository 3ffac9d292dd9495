#include "runner/driver_workers.h"

#include <algorithm>
#include <set>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/check.h"
#include "common/log.h"
#include "runner/launch/output.h"
#include "runner/observe/event_log.h"
#include "runner/policies/crash_loop.h"
#include "runner/policies/drain.h"
#include "runner/policies/standbys.h"
#include "runner/policies/straggler_watch.h"

namespace erun {

bool DriverWorker::alive() const { return !exit && handle; }
bool DriverWorker::pending() const { return state == WorkerState::kPending; }
bool DriverWorker::standby() const { return is_standby(stage); }
bool DriverWorker::standby_ready() const { return stage == WorkerStage::kStandbyReady; }
bool DriverWorker::replacement() const { return pending() && is_replacing(stage); }
bool DriverWorker::fresh() const { return stage != WorkerStage::kSettled; }
bool DriverWorker::left_out() const { return is_left_out(state); }
WorkerView DriverWorker::view() const {
  return WorkerView{key, assignment, state, stage, alive(), started, launched_generation, joined, retire_by};
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

std::vector<SlotKey> blacklisted_with_survivors(const Workers& workers, const HostManager& hosts) {
  std::vector<SlotKey> keep;
  for (auto& w : workers) {
    if (w.survivor() && w.joined && !w.pending() && hosts.is_blacklisted(w.assignment.slot.host)) {
      keep.push_back(w.assignment.slot);
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

bool members_joined(const Workers& workers) {
  return std::any_of(workers.begin(), workers.end(),
                     [](const DriverWorker& w) { return w.joined && w.state == WorkerState::kMember; });
}

bool draining_members(const Workers& workers, const DrainPolicy& drains, const StragglerWatch& stragglers) {
  // A straggler's slot that rests leaves the same way.
  if (!drains.any() && !stragglers.any_resting()) return false;
  return std::any_of(workers.begin(), workers.end(), [&](const DriverWorker& w) {
    return w.survivor() && !w.pending() &&
           (drains.draining(w.assignment.slot.host) || stragglers.resting(w.assignment.slot));
  });
}

PlannableHosts plannable_hosts(const HostSet& hosts, const HostManager& manager, const Workers& workers) {
  std::vector<SlotKey> only = blacklisted_with_survivors(workers, manager);
  HostSet usable = manager.usable(hosts, only);
  return {std::move(usable), std::move(only)};
}

bool survivors_alone(const Workers& workers, const JobSnapshot& s, int min_np, const Plan& full, Plan& next) {
  std::vector<SlotKey> kept;
  for (auto& r : full.ranks) {
    if (slot_held(workers, r.slot, /*pending_too=*/false) || standby_ready_at(s, r.slot)) kept.push_back(r.slot);
  }
  if (kept.size() == full.ranks.size() || static_cast<int>(kept.size()) < std::max(min_np, 1)) return false;
  next = plan_over_slots(s.generation + 1, kept);
  return true;
}

std::vector<std::string> stderr_tail(const DriverWorker& w, OutputForwarder* output) {
  // The agent's report holds what the worker wrote even when forwarding lost
  // it (dropped, not read in time, a stuck terminal); an agent that was lost
  // sent none, and then what was forwarded is all there is.
  if (w.handle) {
    if (auto reported = w.handle->exit_stderr()) return std::move(*reported);
  }
  return output ? output->tail(w.key) : std::vector<std::string>{};
}

void drop_workers(Workers& workers, OutputForwarder* output, bool ended_only) {
  auto dropped = [ended_only](const DriverWorker& w) { return !ended_only || w.exit.has_value(); };
  for (const DriverWorker& w : workers) {
    if (dropped(w) && output) output->forget(w.key);
  }
  workers.erase(std::remove_if(workers.begin(), workers.end(), dropped), workers.end());
}

void tell_survivors_of_losses(Workers& workers, const Plan& plan, long generation, Membership& membership,
                              EventSink& events) {
  std::vector<int> ranks;
  for (auto& w : workers) {
    if (w.loss_told || w.state == WorkerState::kRetiring || w.state == WorkerState::kDismissed ||
        w.launched_generation > generation) {
      continue;
    }
    if (w.state != WorkerState::kExcluded && !(w.exit && !w.exit->ok())) continue;
    w.loss_told = true;
    // Only a rank of the current plan: a replacement that failed before it
    // was admitted holds a rank of a plan the survivors never formed.
    const RankAssignment* held = plan.find(w.assignment.slot);
    if (held && held->rank == w.assignment.rank) ranks.push_back(w.assignment.rank);
  }
  if (ranks.empty()) return;
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  ERUN_LOG_INFO("{}: telling the survivors that rank{} {} {} gone", who(generation), ranks.size() == 1 ? "" : "s",
                fmt::join(ranks, ","), ranks.size() == 1 ? "is" : "are");
  events.emit(ev::PeersLost{.generation = generation, .ranks = fmt::format("{}", fmt::join(ranks, ","))});
  membership.notify_peers_lost(generation, ranks);
}

void stop_fresh_workers(Workers& workers, long generation) {
  for (auto& w : workers) {
    if (!w.fresh() || !w.alive() || is_stopping(w.state)) continue;
    ERUN_LOG_INFO("{}: training is over for a rank; stopping this worker, which joined after the others' last "
                  "generation",
                  who(generation, w.assignment.slot.host, w.assignment.rank));
    w.handle->terminate();
    w.set_state(WorkerState::kExcluded);
  }
}

bool note_joins(Workers& workers, const MembershipSnapshot& m, const Plan& plan, CrashLoopDetector& crash_loop) {
  std::set<SlotKey> members, waiting;
  for (auto& j : m.members) {
    members.insert(j.slot);
    crash_loop.commit_seen(j.commit_id);
  }
  for (auto& j : m.waiting) {
    waiting.insert(j.slot);
    crash_loop.commit_seen(j.commit_id);
  }
  size_t in_current = 0;
  for (auto& w : workers) {
    if (w.exit) continue;
    bool member = members.count(w.assignment.slot) > 0;
    if (member || waiting.count(w.assignment.slot)) w.joined = true;
    if (member && !w.left_out()) ++in_current;
  }
  if (in_current != static_cast<size_t>(plan.size())) return false;
  for (auto& w : workers) {
    // A pending worker's slot is in no published plan: only members settle.
    if (members.count(w.assignment.slot) && !w.exit && w.stage == WorkerStage::kFresh) {
      w.set_stage(WorkerStage::kSettled);
    }
  }
  return true;
}

}  // namespace erun
