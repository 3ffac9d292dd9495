// What the driver knows of the job beside its workers and its record: the
// current generation's facts, the waiting for hosts, the finishing once a
// rank finished, the failures, and how the job ends (its exit code and the
// root-cause report). Values with the rules that read and write them; the
// driver (driver.h) keeps one of each and decides when they change.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/subprocess.h"
#include "discovery/discovery.h"
#include "runner/driver_record.h"
#include "runner/hosts/planner.h"

namespace erun {

class EventSink;
class HostManager;
struct MembershipSnapshot;

// A rank that ended a generation: who, how and after how long, and what it
// last wrote to stderr.
struct Failure {
  long generation = 0;
  std::string host;
  int rank = 0;
  ExitStatus status;
  std::vector<std::string> stderr_tail;
  double after_s = 0;
  bool unreachable = false;  // its host could not be reached at all (WorkerHandle::host_unreachable())
};

// The current generation, as the driver learns of it; Driver::publish()
// starts it anew (a takeover: Driver::take_over()).
struct GenerationFacts {
  TimePoint published_at{};
  bool after_failure = false;      // published after a failure: its re-join deadline is the collective timeout's
  bool fresh = false;              // every worker of it was launched for it
  bool complete = false;           // every rank of the plan joined it
  bool burst_losses = false;       // it lost workers to the last failure's burst
  std::optional<Failure> failure;  // its first failure

  // The generation failed: the first failure noted stands (its report and
  // exit code); later ones of the same generation add nothing.
  void fail(Failure f);
  // Every rank of generation `generation` (`size` of them) joined it (`m`):
  // it is complete. Logged and written as generation_joined, with the
  // commit it resumes from when every worker of it started in it.
  void joined(long generation, int size, const MembershipSnapshot& m, TimePoint now, EventSink& events);
};

// Waiting for hosts: the phases that do (kWaitingForHosts,
// kWaitingWithSurvivors), and a running job below --min-np.
struct Waiting {
  TimePoint since{};              // the --elastic-timeout clock (Driver::set_phase())
  TimePoint last_log{};           // its last "waiting" line
  bool below_min_logged = false;  // said once that the job is below --min-np (Driver::follow_membership())

  // The "waiting for hosts" line, at most every 5 s.
  void log(int usable_slots, const HostManager& hosts, int min_np, Duration elastic_timeout, TimePoint now);
};

// JobPhase::kFinishing: a rank finished.
struct Finishing {
  std::string first;       // who() of the first worker that finished successfully
  TimePoint first_at{};
  std::string because;     // why the job ends, for its log line
  bool failed = false;     // a failure came while finishing: the job ends now
  TimePoint deadline{};    // --finish-timeout after the first finished

  // The first rank finished: the others have --finish-timeout to follow.
  void begin(long generation, Duration finish_timeout, TimePoint now);
};

// How the job is doing, for its exit code.
struct Outcome {
  int exit_code = 0;                     // in JobPhase::kDone
  std::optional<Failure> first_failure;  // the job's first failure
  bool any_success = false;              // a worker finished successfully
};

// The root cause's log lines: who failed, how, after how long, and its last
// stderr lines.
void report_failure(const Failure& f);
// The exit code of a job that gave up waiting for hosts (--elastic-timeout):
// its first failure's (reported), else 1.
int give_up_code(const std::optional<Failure>& first);
// The exit code of a job whose last generation ended (earlier failures were
// recovered from): its failure's (reported), else 0. Logs the end and
// writes job_finished.
int finished_code(const std::optional<Failure>& last, const std::string& job_id, const DriverRecord& rec,
                  EventSink& events);
// The exit code of a job that `f` ends (no retry): its code, at least 1;
// reports it and writes job_finished.
int failed_code(const Failure& f, const DriverRecord& rec, EventSink& events);
// One more reset (--reset-limit counts them), in the record, and its event.
void count_reset(DriverRecord& rec, EventSink& events, const std::string& reason);
// The running plan is `next`: its slots go in the record (a takeover plans
// from them), the plan itself, with its ranks, in `running`.
void set_running_plan(Plan next, Plan& running, DriverRecord& rec);
// A generation of workers that all started in it joined: logs the commit
// its members' hosts kept, where training resumes (the event log's
// commit_restored).
void log_resumed_commit(const MembershipSnapshot& m, long generation, EventSink& events);

}  // namespace erun
