// The driver taking a running job over from one that is gone, and leaving
// it to a newer one (docs/design.md, "A driver that can be replaced").
#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "common/log.h"
#include "common/strings.h"
#include "runner/driver.h"

namespace erun {

void Driver::take_over(DriverDeps::Takeover& t) {
  // rec_ is the record already (the constructor took it): the hosts'
  // histories and the keepers go on from it.
  if (auto bl = hosts_.blacklisted(); !bl.empty()) {
    ERUN_LOG_WARN("job {}: still blacklisted, as the job record says: {}", d_.job_id, join(bl, ","));
  }
  auto in_plan = [&](const AdoptedWorker& a) {
    return std::find(rec_.plan.begin(), rec_.plan.end(), SlotKey{a.host, a.slot}) != rec_.plan.end();
  };
  if (std::any_of(t.workers.begin(), t.workers.end(), in_plan)) {
    adopt(t);
    return;
  }
  for (auto& a : t.workers) a.handle->kill();  // none holds a rank of the plan
  // Nothing left to adopt: the job starts anew, its generations going on
  // after the record's (the rendezvous resumed there), with no plan running.
  set_plan(Plan{});
  rec_.in_place = false;
}

void Driver::adopt(DriverDeps::Takeover& t) {
  const bool in_place = rec_.in_place;  // as its last driver left it
  set_plan(plan_over_slots(rec_.generation, rec_.plan));
  reports_.published(plan_);
  int kept = 0, ended = 0, strays = 0;
  std::set<std::string> hosts;
  for (auto& a : t.workers) {
    Worker w;
    w.key = next_key_++;
    w.handle = std::move(a.handle);
    w.launched_generation = a.generation;
    w.started = clock_.now();
    specs_.launcher_for(a.host, &w.local);
    if (!d_.commit_dir.empty()) memory_.holds(a.host);
    const RankAssignment* r = plan_.find(SlotKey{a.host, a.slot});
    if (!r) {
      // Not of the running plan (a replacement that was never admitted): it
      // holds nothing the job needs.
      w.assignment.slot = SlotKey{a.host, a.slot};
      w.assignment.rank = a.rank;
      w.state = WorkerState::kExcluded;
      w.handle->kill();
      ++strays;
    } else {
      w.assignment = *r;
      w.state = WorkerState::kMember;
      w.joined = in_place;  // it ran in place under the driver before
      ++kept;
      hosts.insert(a.host);
      if (w.handle->poll()) ++ended;
    }
    if (d_.output) d_.output->add(w.key, w.assignment.rank, w.handle->take_stdout(), w.handle->take_stderr());
    workers_.push_back(std::move(w));
  }
  crash_loop_.generation_started(rec_.generation, plan_.hosts());
  // Workers the record does not know to have joined (its driver died before
  // they did) are marked joined when they come to the rendezvous
  // (update_joined()), and then re-form in place.
  gen_.complete = in_place;
  gen_.published_at = clock_.now();
  set_phase(JobPhase::kRunning);
  ERUN_LOG_WARN("job {}: driver term {} took the job over at generation {}: {} worker(s) on {} host(s) go on in place "
                "(their processes and ranks kept; they re-join at their next commit){}",
                d_.job_id, t.term, rec_.generation, kept, hosts.size(),
                strays > 0 ? fmt::format("; {} worker(s) outside the plan stopped", strays) : "");
  d_.events->emit(ev::DriverAttached{.term = static_cast<long>(t.term),
                                     .generation = rec_.generation,
                                     .workers = kept,
                                     .hosts = static_cast<long>(hosts.size())});
  (void)ended;
}

bool Driver::check_superseded() {
  uint64_t term = d_.local_launcher->superseded();
  if (d_.remote_launcher) term = std::max(term, d_.remote_launcher->superseded());
  if (term == 0) return false;
  superseded_by_ = term;
  ERUN_LOG_ERROR("job {}: driver term {} took the job over: this erun leaves it to that one and exits without "
                 "touching the workers",
                 d_.job_id, term);
  d_.local_launcher->abandon();
  if (d_.remote_launcher) d_.remote_launcher->abandon();
  for (auto& w : workers_) {
    if (!w.exit) w.exit = ExitStatus{255, 0};
  }
  done(3);
  return true;
}


}  // namespace erun
