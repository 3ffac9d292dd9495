#include "runner/job_facts.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/log.h"
#include "common/strings.h"
#include "rendezvous/membership.h"
#include "runner/hosts/host_manager.h"
#include "runner/observe/event_log.h"

namespace erun {
namespace {

// The job_finished event: the job's code and its counts, from the record.
void job_finished(int code, const DriverRecord& rec, EventSink& events) {
  events.emit(ev::JobFinished{.exit_code = code, .generation = rec.generation, .resets = rec.resets, .launched = rec.launched});
}

}  // namespace

void GenerationFacts::fail(Failure f) {
  if (!failure) failure = std::move(f);
}

void GenerationFacts::joined(long generation, int size, const MembershipSnapshot& m, TimePoint now,
                             EventSink& events) {
  complete = true;
  ERUN_LOG_INFO("{}: all {} ranks joined in {:.3f} s", who(generation), size, seconds(now - published_at));
  events.emit(ev::GenerationJoined{.generation = generation, .seconds = seconds(now - published_at)});
  if (fresh) log_resumed_commit(m, generation, events);
}

void count_reset(DriverRecord& rec, EventSink& events, const std::string& reason) {
  ++rec.resets;
  events.emit(ev::Reset{.generation = rec.generation, .reason = reason, .resets = rec.resets});
}

void set_running_plan(Plan next, Plan& running, DriverRecord& rec) {
  rec.plan.clear();
  for (auto& a : next.ranks) rec.plan.push_back(a.slot);
  running = std::move(next);
}

void Waiting::log(int usable_slots, const HostManager& hosts, int min_np, Duration elastic_timeout,
                  TimePoint now) {
  if (now - last_log < std::chrono::seconds(5)) return;
  last_log = now;
  auto bl = hosts.blacklisted();
  ERUN_LOG_INFO("waiting for hosts: {} usable slot{} of --min-np {} ({:.0f} s of --elastic-timeout {:.0f} s){}",
                usable_slots, usable_slots == 1 ? "" : "s", min_np, seconds(now - since),
                seconds(elastic_timeout), bl.empty() ? "" : "; blacklisted: " + join(bl, ","));
}

void Finishing::begin(long generation, Duration finish_timeout, TimePoint now) {
  deadline = now + finish_timeout;
  because = fmt::format(
      "{} finished successfully {:.0f} s ago and the others did not finish within --finish-timeout {:.0f} s "
      "(raise --finish-timeout if ranks legitimately finish far apart)",
      first, seconds(finish_timeout), seconds(finish_timeout));
  ERUN_LOG_INFO("{}: {} finished; waiting up to --finish-timeout {:.0f} s for the others", who(generation), first,
                seconds(finish_timeout));
}

void report_failure(const Failure& f) {
  ERUN_LOG_ERROR("root cause: {} exited with {} after {:.1f} s", who(f.generation, f.host, f.rank),
                 f.status.describe(), f.after_s);
  if (!f.stderr_tail.empty()) {
    ERUN_LOG_ERROR("last stderr lines of rank {}:", f.rank);
    for (auto& l : f.stderr_tail) ERUN_LOG_ERROR("  {}", l);
  }
}

int give_up_code(const std::optional<Failure>& first) {
  if (first) report_failure(*first);
  return first ? std::max(1, first->status.shell_code()) : 1;
}

int finished_code(const std::optional<Failure>& last, const std::string& job_id, const DriverRecord& rec,
                  EventSink& events) {
  int code = last ? std::max(1, last->status.shell_code()) : 0;
  if (last) report_failure(*last);
  ERUN_LOG_INFO("job {} finished with exit code {} after {} generation{} and {} reset{}", job_id, code,
                rec.generation, rec.generation == 1 ? "" : "s", rec.resets, rec.resets == 1 ? "" : "s");
  job_finished(code, rec, events);
  return code;
}

int failed_code(const Failure& f, const DriverRecord& rec, EventSink& events) {
  report_failure(f);
  const int code = f.status.shell_code() == 0 ? 1 : f.status.shell_code();
  job_finished(code, rec, events);
  return code;
}

void log_resumed_commit(const MembershipSnapshot& m, long generation, EventSink& events) {
  // Every worker of this generation started in it: the newest commit their
  // hosts kept (each reports it in its first join) is where training goes on.
  const JoinRequest* newest = nullptr;
  for (auto& j : m.members) {
    if (j.commit_id > 0 && (!newest || j.commit_id > newest->commit_id)) newest = &j;
  }
  if (!newest) return;
  ERUN_LOG_INFO("{}: no worker of the last generation survived; training resumes at commit {} kept in host "
                "memory on {}",
                who(generation), newest->commit_id, newest->slot.host);
  events.emit(ev::CommitRestored{
      .generation = generation, .commit = static_cast<long>(newest->commit_id), .host = newest->slot.host});
}

}  // namespace erun
