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

MembershipSnapshot Driver::take_snapshot() {
  if (!d_.membership) return {};
  MembershipSnapshot m = d_.membership->snapshot();
  stragglers_.note_probe_responders(m);
  return m;
}

HostSet Driver::plannable_hosts() const {
  const std::vector<std::string> keep = blacklisted_with_survivors(workers_, hosts_);
  std::vector<Host> out;
  for (auto& h : discovery_.hosts.hosts()) {
    if (!hosts_.is_blacklisted(h.name) || std::binary_search(keep.begin(), keep.end(), h.name)) out.push_back(h);
  }
  return HostSet(std::move(out));
}

void Driver::update_joined(const MembershipSnapshot& m) {
  if (!d_.membership || gen_.complete) return;
  std::set<SlotKey> members, waiting;
  for (auto& j : m.members) {
    members.insert(j.slot);
    crash_loop_.commit_seen(j.commit_id);
  }
  for (auto& j : m.waiting) {
    waiting.insert(j.slot);
    crash_loop_.commit_seen(j.commit_id);
  }
  size_t in_current = 0;
  for (auto& w : workers_) {
    if (w.exit) continue;
    bool member = members.count(w.assignment.slot) > 0;
    if (member || waiting.count(w.assignment.slot)) w.joined = true;
    if (member && !w.left_out()) ++in_current;
  }
  if (in_current == static_cast<size_t>(plan_.size())) {
    gen_.complete = true;
    for (auto& w : workers_) {
      // A pending worker's slot is in no published plan: only members settle.
      if (members.count(w.assignment.slot) && !w.exit && w.stage == WorkerStage::kFresh) {
        w.set_stage(WorkerStage::kSettled);
      }
    }
    ERUN_LOG_INFO("{}: all {} ranks joined in {:.3f} s", who(rec_.generation), plan_.size(),
                  seconds(clock_.now() - gen_.published_at));
    d_.events->emit(
        ev::GenerationJoined{.generation = rec_.generation, .seconds = seconds(clock_.now() - gen_.published_at)});
    if (gen_.fresh) log_resumed_commit(m);
  }
}

void Driver::log_resumed_commit(const MembershipSnapshot& m) {
  // Every worker of this generation started in it: the newest commit their
  // hosts kept (each reports it in its first join) is where training goes on.
  const JoinRequest* newest = nullptr;
  for (auto& j : m.members) {
    if (j.commit_id > 0 && (!newest || j.commit_id > newest->commit_id)) newest = &j;
  }
  if (!newest) return;
  ERUN_LOG_INFO("{}: no worker of the last generation survived; training resumes at commit {} kept in host "
                "memory on {}",
                who(rec_.generation), newest->commit_id, newest->slot.host);
  d_.events->emit(ev::CommitRestored{
      .generation = rec_.generation, .commit = static_cast<long>(newest->commit_id), .host = newest->slot.host});
}

void Driver::tell_survivors_of_losses() {
  if (!d_.membership) return;
  std::vector<int> ranks;
  for (auto& w : workers_) {
    if (w.loss_told || w.state == WorkerState::kRetiring || w.state == WorkerState::kDismissed ||
        w.launched_generation > rec_.generation) {
      continue;
    }
    if (w.state != WorkerState::kExcluded && !(w.exit && !w.exit->ok())) continue;
    // Only a rank of the current plan: a replacement that failed before it
    // was admitted holds a rank of a plan the survivors never formed.
    const RankAssignment* held = plan_.find(w.assignment.slot);
    if (!held || held->rank != w.assignment.rank) {
      w.loss_told = true;
      continue;
    }
    w.loss_told = true;
    ranks.push_back(w.assignment.rank);
  }
  if (ranks.empty()) return;
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  ERUN_LOG_INFO("{}: telling the survivors that rank{} {} {} gone", who(rec_.generation), ranks.size() == 1 ? "" : "s",
                fmt::join(ranks, ","), ranks.size() == 1 ? "is" : "are");
  d_.events->emit(ev::PeersLost{.generation = rec_.generation, .ranks = fmt::format("{}", fmt::join(ranks, ","))});
  d_.membership->notify_peers_lost(rec_.generation, ranks);
}

// A worker launched for this generation has --rendezvous-timeout to join it.
// So has a survivor, except after a failure: then its collectives broke (a
// peer died or stopped), so a live survivor re-joins within
// --collective-timeout; one that does not is stopped or hung like the peer
// the others could not name (e.g. across hosts, where Gloo cannot tell which
// rank hung) and is left out, instead of holding the generation's barrier
// for the rendezvous timeout. A worker waiting in the rendezvous is never
// killed here: it asks for a newer generation (rejoin_requested()).
void Driver::enforce_rejoin_deadline(const MembershipSnapshot& m) {
  if (!d_.membership || gen_.complete) return;
  const Duration survivor_limit =
      gen_.after_failure ? std::min<Duration>(o_.rendezvous_timeout, o_.collective_timeout + std::chrono::seconds(1))
                      : o_.rendezvous_timeout;
  const Duration waited = clock_.now() - gen_.published_at;
  if (waited < std::min(survivor_limit, o_.rendezvous_timeout)) return;
  std::set<SlotKey> joined;
  for (auto& j : m.members) joined.insert(j.slot);
  for (auto& j : m.waiting) joined.insert(j.slot);
  for (auto& w : workers_) {
    if (!w.alive() || w.left_out() || w.pending() || joined.count(w.assignment.slot)) continue;
    if (!w.joined && o_.mode != WorkerMode::kElastic) continue;  // a restart-mode program never joins
    bool fresh = w.launched_generation == rec_.generation;
    Duration limit = fresh ? o_.rendezvous_timeout : survivor_limit;
    if (waited < limit) continue;
    ERUN_LOG_WARN("{}: did not join generation {} within {:.0f} s ({}); killing it",
                  who(rec_.generation, w.assignment.slot.host, w.assignment.rank), rec_.generation, seconds(limit),
                  limit == o_.rendezvous_timeout ? "--rendezvous-timeout" : "--collective-timeout + 1 s after a failure");
    w.handle->kill();
    fail_generation(Failure{rec_.generation, w.assignment.slot.host, w.assignment.rank, ExitStatus{0, SIGKILL},
                            {"did not re-join within --rendezvous-timeout"}, seconds(clock_.now() - w.started)});
    w.set_state(WorkerState::kExcluded);  // killed: never planned again, even before it is reaped
  }
}

void Driver::retire_workers(const MembershipSnapshot& m) {
  bool any = std::any_of(workers_.begin(), workers_.end(), [](const Worker& w) { return w.state == WorkerState::kRetiring && !w.exit; });
  if (!any) return;
  std::set<SlotKey> waiting;
  for (auto& j : m.waiting) waiting.insert(j.slot);
  for (auto& w : workers_) {
    if (w.state != WorkerState::kRetiring || !w.alive()) continue;  // a dismissed one may take --term-grace
    bool rejoined = waiting.count(w.assignment.slot) > 0;
    if (rejoined || clock_.now() >= w.retire_by) {
      ERUN_LOG_INFO("{}: slot left the job; stopping its worker", who(rec_.generation, w.assignment.slot.host,
                                                                      w.assignment.rank));
      w.handle->terminate();
      w.set_state(WorkerState::kDismissed);
    }
  }
}

void Driver::reconfigure(const char* reason, bool after_failure) {
  // The current generation is over, whatever ends it: its members that are
  // still forming it (waiting for a peer's pair connection that will never
  // come) give it up now instead of at their connect timeout, and the others
  // re-join at their next check (their collectives fail anyway if a peer died).
  d_.membership->notify_hosts_updated(rec_.generation, draining_members());
  HostSet usable = plannable_hosts();
  gen_.failure.reset();
  if (usable.total_slots() < std::max(o_.min_np, 1)) {
    wait_below_min_np(usable);
    return;
  }
  // Survivors keep their processes, excluded ones are kept until reaped.
  drop_workers(/*ended_only=*/true);
  // A slot no member holds goes to a ready standby (driver_standby_workers.cc).
  Plan scratch;
  const Plan full =
      standbys_.with_standbys(snapshot(), stragglers_.without_resting(make_plan(rec_.generation + 1, usable, o_.max_np,
                                                                               &plan_with_pending(workers_, plan_, scratch))));
  Plan next = full;
  const bool alone = after_failure && survivors_alone(full, next);
  ++rec_.generation;
  set_phase(JobPhase::kRunning);
  const int retired = reassign_workers(next, alone ? &full : nullptr, /*stop_retired=*/after_failure);
  set_plan(next);
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

bool Driver::survivors_alone(const Plan& full, Plan& next) {
  const JobSnapshot s = snapshot();
  std::vector<SlotKey> kept;
  for (auto& r : full.ranks) {
    if (slot_held(workers_, r.slot, /*pending_too=*/false) || standby_ready_at(s, r.slot)) kept.push_back(r.slot);
  }
  if (kept.size() == full.ranks.size() || static_cast<int>(kept.size()) < std::max(o_.min_np, 1)) return false;
  next = plan_over_slots(rec_.generation + 1, kept);
  return true;
}

void Driver::wait_below_min_np(const HostSet& usable) {
  if (!have_survivors(workers_)) {
    ERUN_LOG_WARN("{}: {} usable slots are fewer than --min-np {} and no worker holds a commit: waiting for hosts",
                  who(rec_.generation), usable.total_slots(), o_.min_np);
    stop_then_wait();
    return;
  }
  // The survivors hold the last commit: they wait in the rendezvous.
  ERUN_LOG_WARN("{}: {} usable slot{} fewer than --min-np {}: the survivors wait in the rendezvous with their "
                "state for up to --elastic-timeout {:.0f} s",
                who(rec_.generation), usable.total_slots(), usable.total_slots() == 1 ? " is" : "s are", o_.min_np,
                seconds(o_.elastic_timeout));
  d_.events->emit(ev::SurvivorsWaiting{.generation = rec_.generation, .usable_slots = usable.total_slots()});
  set_phase(JobPhase::kWaitingWithSurvivors);
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
  record_host_failure(host, w.handle && w.exit && w.handle->host_unreachable());
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

void Driver::drop_fresh_workers() {
  for (auto& w : workers_) {
    if (!w.fresh() || !w.alive() || is_stopping(w.state)) continue;
    ERUN_LOG_INFO("{}: training is over for a rank; stopping this worker, which joined after the others' last "
                  "generation",
                  who(rec_.generation, w.assignment.slot.host, w.assignment.rank));
    w.handle->terminate();
    w.set_state(WorkerState::kExcluded);
  }
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
  if (grows) count_reset("membership changed");
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
  const MembershipSnapshot m = take_snapshot();
  if (reports_.pending(m.rejoined)) apply(reports_.take(snapshot(), m.rejoined));
  if (drains_.any()) apply(drains_.tend(snapshot(&m)));
  if (gen_.failure) {
    if (!outcome_.first_failure) outcome_.first_failure = gen_.failure;
    gen_.failure.reset();
  }
  HostSet usable = plannable_hosts();
  if (usable.total_slots() >= std::max(o_.min_np, 1)) {
    reconfigure("hosts returned; re-forming", /*after_failure=*/false);
    return;
  }
  if (clock_.now() - waiting_.since > o_.elastic_timeout) {
    ERUN_LOG_ERROR("gave up after --elastic-timeout {:.0f} s: {} usable slot{}, --min-np is {}; stopping the "
                   "survivors; add hosts or lower --min-np",
                   seconds(o_.elastic_timeout), usable.total_slots(), usable.total_slots() == 1 ? "" : "s", o_.min_np);
    stop_then_end(SIGTERM, [this] { return give_up_code(); });
    return;
  }
  log_waiting(usable);
}

}  // namespace erun
