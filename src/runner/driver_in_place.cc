// The driver's in-place decisions, over the Membership interface: one
// snapshot per tick, read by small functions that step() calls in turn.
// In place means in place: survivors holding the last commit are never
// stopped by the driver; a rank they report as failed is killed and left out
// of the next generation; below --min-np they wait inside the rendezvous.
#include <signal.h>

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/log.h"
#include "common/strings.h"
#include "runner/driver.h"

namespace erun {

void Driver::reconfigure(const char* reason, bool after_failure) {
  // The current generation is over, whatever ends it: its members that are
  // still forming it (waiting for a peer's pair connection that will never
  // come) give it up now instead of at their connect timeout, and the others
  // re-join at their next check (their collectives fail anyway if a peer died).
  d_.membership->notify_hosts_updated(rec_.generation, draining_members(workers_, drains_, stragglers_));
  const PlannableHosts usable = plannable_hosts(discovery_.hosts, hosts_, workers_);
  const int slots = usable.slots();
  gen_.failure.reset();
  if (slots < std::max(o_.min_np, 1)) {
    if (!have_survivors(workers_)) {
      ERUN_LOG_WARN("{}: {} usable slots are fewer than --min-np {} and no worker holds a commit: waiting for hosts",
                    who(rec_.generation), slots, o_.min_np);
      stop(JobPhase::kWaitingForHosts);
      return;
    }
    // The survivors hold the last commit: they wait in the rendezvous.
    ERUN_LOG_WARN("{}: {} usable slot{} fewer than --min-np {}: the survivors wait in the rendezvous with their "
                  "state for up to --elastic-timeout {:.0f} s",
                  who(rec_.generation), slots, slots == 1 ? " is" : "s are", o_.min_np, seconds(o_.elastic_timeout));
    d_.events->emit(ev::SurvivorsWaiting{.generation = rec_.generation, .usable_slots = slots});
    set_phase(JobPhase::kWaitingWithSurvivors);
    return;
  }
  // Survivors keep their processes, excluded ones are kept until reaped.
  drop_workers(workers_, d_.output, /*ended_only=*/true);
  // A slot no member holds goes to a ready standby (driver_standby_workers.cc).
  Plan scratch;
  const Plan full =
      standbys_.with_standbys(snapshot(), stragglers_.without_resting(make_plan(rec_.generation + 1, usable.hosts, o_.max_np,
                                                                               &plan_with_pending(workers_, plan_, scratch),
                                                                               usable.only)));
  Plan next = full;
  const bool alone = after_failure && survivors_alone(workers_, snapshot(), o_.min_np, full, next);
  ++rec_.generation;
  set_phase(JobPhase::kRunning);
  const int retired = reassign_workers(next, alone ? &full : nullptr, /*stop_retired=*/after_failure);
  set_running_plan(next, plan_, rec_);
  crash_loop_.generation_started(rec_.generation, plan_.hosts());
  publish(/*fresh=*/false, after_failure);
  int launched = 0, pending = 0;
  for (auto& a : full.ranks) {
    if (slot_held(workers_, a.slot, /*pending_too=*/true)) {
      if (alone && !plan_.contains(a.slot)) ++pending;
      continue;
    }
    launch_worker(a, next.ranks.front().slot.host, 0, alone ? WorkerStage::kReplacement : WorkerStage::kFresh);
    ++launched;
    if (alone) ++pending;
  }
  const int survivors = plan_.size() - (alone ? 0 : launched);
  ERUN_LOG_INFO("{}: {} in place: {} ({} survivor{}, {} new, {} leaving){}", who(rec_.generation), reason,
                plan_.to_string(), survivors, survivors == 1 ? "" : "s", launched, retired,
                alone ? fmt::format("; the survivors go on alone, {} replacement{} join{} them once started", pending,
                                    pending == 1 ? "" : "s", pending == 1 ? "s" : "")
                      : "");
}

int Driver::reassign_workers(const Plan& next, const Plan* full, bool stop_retired) {
  // After a failure a retiring worker's generation is broken, and the next
  // one restores the last commit without it: it stops now instead of
  // training on until its next re-join.
  auto stop_now = [&](Worker& w) {
    if (!stop_retired || w.state != WorkerState::kRetiring || !w.alive()) return;
    ERUN_LOG_INFO("{}: slot left the job; stopping its worker now (its generation failed)",
                  who(rec_.generation, w.assignment.slot.host, w.assignment.rank));
    w.handle->terminate();
    w.set_state(WorkerState::kDismissed);
  };
  int retired = 0;
  for (auto& w : workers_) {
    if (w.left_out()) {
      w.loss_told = true;  // no member of the next generation: nothing to tell about it
      stop_now(w);
      continue;
    }
    if (w.state == WorkerState::kStopping) continue;  // erun stops it (a standby or replacement given up)
    if (const RankAssignment* a = next.find(w.assignment.slot)) {
      if (w.standby()) apply({act::Promote{w.key, -1, WorkerStage::kReplacement, "a member was lost"}});
      w.assignment = *a;
      w.set_state(WorkerState::kMember);
    } else if (w.standby()) {
      continue;  // still a standby (StandbyPolicy::tend() stops it if its host left)
    } else if (const RankAssignment* f = full && w.pending() ? full->find(w.assignment.slot) : nullptr) {
      w.assignment = *f;  // still pending: it joins with the next growth
    } else {
      w.set_state(WorkerState::kRetiring);
      w.retire_by = clock_.now() + o_.rendezvous_timeout;
      ++retired;
      stop_now(w);
    }
  }
  return retired;
}

void Driver::replacement_failed(Worker& w, const std::string& why) {
  const std::string& host = w.assignment.slot.host;
  ERUN_LOG_WARN("{}: replacement {} before it joined; the job goes on with {} rank{}",
                who(rec_.generation, host, w.assignment.rank), why, plan_.size(), plan_.size() == 1 ? "" : "s");
  if (w.exit) crash_loop_.worker_failed(host, *w.exit);
  hosts_.count_failure(host, w.handle && w.exit && w.handle->host_unreachable(), *d_.events);
  w.set_state(WorkerState::kExcluded);
}

void Driver::grow_pending(const Plan& next) {
  std::vector<std::string> names;
  for (auto& w : workers_) {
    // A standby on a slot the job grows into is the new worker, already waiting.
    if (w.standby() && w.survivor() && next.contains(w.assignment.slot)) {
      apply({act::Promote{w.key, -1, WorkerStage::kGrowth, "the job grows"}});
    }
  }
  for (auto& a : next.ranks) {
    if (slot_held(workers_, a.slot, /*pending_too=*/true)) continue;
    launch_worker(a, next.ranks.front().slot.host, 0, WorkerStage::kGrowth);
    names.push_back(fmt::format("{}[{}]", a.slot.host, a.slot.local_index));
  }
  ERUN_LOG_INFO("{}: membership grows ({} -> {}): launched {} new worker{} ({}); the {} running ones go on until "
                "the new ones wait in the rendezvous",
                who(rec_.generation), plan_.to_string(), next.to_string(), names.size(), names.size() == 1 ? "" : "s",
                join(names, " "), plan_.size());
}

bool Driver::admit_replacements(const MembershipSnapshot& m) {
  std::map<SlotKey, const JoinRequest*> waiting;
  for (auto& j : m.waiting) waiting[j.slot] = &j;
  int ready = 0, starting = 0;
  std::optional<JobSnapshot> now;  // for the pre-flight checks, made once
  for (auto& w : workers_) {
    if (!w.replacement() || !w.survivor()) continue;
    if (auto it = waiting.find(w.assignment.slot); it != waiting.end()) {
      if (!now) now = snapshot();
      // Held back (its slot rests, it is stopped), or ready to be admitted.
      Actions held = stragglers_.preflight(*now, w.view(), *it->second, m);
      if (held.empty()) ++ready;
      apply(held);
      continue;
    }
    if (clock_.now() - w.started < o_.rendezvous_timeout) {
      ++starting;
      continue;
    }
    w.handle->kill();
    w.set_state(WorkerState::kExcluded);
    replacement_failed(w, fmt::format("did not join within --rendezvous-timeout {:.0f} s; killed",
                                      seconds(o_.rendezvous_timeout)));
  }
  // Every replacement waits, and every survivor is in its generation (so each
  // one hears the announcement).
  if (ready == 0 || starting > 0 || !gen_.complete) return false;
  const bool grows = std::any_of(workers_.begin(), workers_.end(), [&](const Worker& w) {
    return w.replacement() && w.stage == WorkerStage::kGrowth && w.survivor();
  });
  // New slots: a membership change, counted as one (a failure's replacement was counted with it).
  if (grows) count_reset(rec_, *d_.events, "membership changed");
  ERUN_LOG_INFO("{}: {} replacement{} joined the rendezvous; announcing a membership change: the survivors grow "
                "at their next commit",
                who(rec_.generation), ready, ready == 1 ? "" : "s");
  reconfigure("replacements joined; growing", /*after_failure=*/false);  // announces it
  return true;
}

void Driver::wait_with_survivors() {
  if (!have_survivors(workers_)) {  // they ended while waiting: nobody holds a commit any more
    set_phase(JobPhase::kWaitingForHosts);
    wait_for_hosts();
    return;
  }
  const MembershipSnapshot m = stragglers_.look(d_.membership);
  if (reports_.pending(m.rejoined)) apply(reports_.take(snapshot(), m.rejoined));
  if (drains_.any()) apply(drains_.tend(snapshot(&m)));
  if (gen_.failure) {
    if (!outcome_.first_failure) outcome_.first_failure = gen_.failure;
    gen_.failure.reset();
  }
  const PlannableHosts usable = plannable_hosts(discovery_.hosts, hosts_, workers_);
  if (usable.slots() >= std::max(o_.min_np, 1)) {
    reconfigure("hosts returned; re-forming", /*after_failure=*/false);
    return;
  }
  if (clock_.now() - waiting_.since > o_.elastic_timeout) {
    ERUN_LOG_ERROR("gave up after --elastic-timeout {:.0f} s: {} usable slot{}, --min-np is {}; stopping the "
                   "survivors; add hosts or lower --min-np",
                   seconds(o_.elastic_timeout), usable.slots(), usable.slots() == 1 ? "" : "s", o_.min_np);
    stop(JobPhase::kDone, SIGTERM, [this] { return give_up_code(outcome_.first_failure); });
    return;
  }
  waiting_.log(usable.slots(), hosts_, o_.min_np, o_.elastic_timeout, clock_.now());
}

}  // namespace erun
