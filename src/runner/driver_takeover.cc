// The driver taking a running job over from one that is gone, and leaving
// it to a newer one (docs/design.md, "A driver that can be replaced").
#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "common/log.h"
#include "common/strings.h"
#include "runner/driver.h"

namespace erun {

namespace {

// What adopt_workers() made of a taken-over job's workers.
struct Adopted {
  int kept = 0;    // of the running plan: they go on with their process and rank
  int strays = 0;  // outside it (a replacement never admitted): stopped
  std::set<std::string> hosts;  // where the kept ones run
};

// The taken-over job's workers (`t`), as this driver's: those on a slot of
// `plan` keep their process and rank (joined: `in_place`, as the record
// says), the others are killed; each gets a key from `next_key` and its
// output goes to `output`. `holds(host)`: the host holds the job's memory.
Adopted adopt_workers(DriverDeps::Takeover& t, const Plan& plan, bool in_place, TimePoint now,
                      const WorkerSpecs& specs, const std::function<void(const std::string&)>& holds,
                      OutputForwarder* output, long& next_key, Workers& workers) {
  Adopted out;
  for (auto& a : t.workers) {
    DriverWorker w;
    w.key = next_key++;
    w.handle = std::move(a.handle);
    w.launched_generation = a.generation;
    w.started = now;
    specs.launcher_for(a.host, &w.local);
    holds(a.host);
    const RankAssignment* r = plan.find(SlotKey{a.host, a.slot});
    if (!r) {
      // Not of the running plan (a replacement that was never admitted): it
      // holds nothing the job needs.
      w.assignment.slot = SlotKey{a.host, a.slot};
      w.assignment.rank = a.rank;
      w.state = WorkerState::kExcluded;
      w.handle->kill();
      ++out.strays;
    } else {
      w.assignment = *r;
      w.state = WorkerState::kMember;
      w.joined = in_place;  // it ran in place under the driver before
      ++out.kept;
      out.hosts.insert(a.host);
      w.handle->poll();  // an end while no driver was there is reaped at the next turn
    }
    if (output) output->add(w.key, w.assignment.rank, w.handle->take_stdout(), w.handle->take_stderr());
    workers.push_back(std::move(w));
  }
  return out;
}

}  // namespace

void Driver::take_over(DriverDeps::Takeover& t) {
  // rec_ is the record already (the constructor took it): the hosts'
  // histories and the keepers go on from it.
  if (auto bl = hosts_.blacklisted(); !bl.empty()) {
    ERUN_LOG_WARN("job {}: still blacklisted, as the job record says: {}", d_.job_id, join(bl, ","));
  }
  auto in_plan = [&](const AdoptedWorker& a) {
    return std::find(rec_.plan.begin(), rec_.plan.end(), SlotKey{a.host, a.slot}) != rec_.plan.end();
  };
  if (!std::any_of(t.workers.begin(), t.workers.end(), in_plan)) {
    for (auto& a : t.workers) a.handle->kill();  // none holds a rank of the plan
    // Nothing left to adopt: the job starts anew, its generations going on
    // after the record's (the rendezvous resumed there), with no plan running.
    set_running_plan(Plan{}, plan_, rec_);
    rec_.in_place = false;
    return;
  }
  const bool in_place = rec_.in_place;  // as its last driver left it
  set_running_plan(plan_over_slots(rec_.generation, rec_.plan), plan_, rec_);
  reports_.published(plan_);
  const Adopted adopted = adopt_workers(
      t, plan_, in_place, clock_.now(), specs_,
      [this](const std::string& host) { if (!d_.commit_dir.empty()) memory_.holds(host); }, d_.output, next_key_,
      workers_);
  crash_loop_.generation_started(rec_.generation, plan_.hosts());
  // Workers the record does not know to have joined (its driver died before
  // they did) are marked joined when they come to the rendezvous
  // (note_joins()), and then re-form in place.
  gen_.complete = in_place;
  gen_.published_at = clock_.now();
  set_phase(JobPhase::kRunning);
  ERUN_LOG_WARN("job {}: driver term {} took the job over at generation {}: {} worker(s) on {} host(s) go on in place "
                "(their processes and ranks kept; they re-join at their next commit){}",
                d_.job_id, t.term, rec_.generation, adopted.kept, adopted.hosts.size(),
                adopted.strays > 0 ? fmt::format("; {} worker(s) outside the plan stopped", adopted.strays) : "");
  d_.events->emit(ev::DriverAttached{.term = static_cast<long>(t.term),
                                     .generation = rec_.generation,
                                     .workers = adopted.kept,
                                     .hosts = static_cast<long>(adopted.hosts.size())});
}

bool Driver::check_superseded() {
  uint64_t term = d_.local_launcher->superseded();
  if (d_.remote_launcher) term = std::max(term, d_.remote_launcher->superseded());
  if (d_.record_superseded) term = std::max(term, d_.record_superseded());
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
