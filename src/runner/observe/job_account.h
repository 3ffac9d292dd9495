// JobAccount: what a job's wall time went to, read from its events. The
// driver's event log hands it every event as it is written (the live status
// line, /metrics and the summary at the end); `erun report` feeds it a past
// job's event log, each line read back into the same event. One reading of
// the events serves both, so the numbers always agree.
//
// The job is always in one phase: starting up (until the first generation has
// joined), training, recovering (a reset until the next generation has
// joined), waiting (survivors below --min-np), or without a driver (a new
// erun re-attaching). Steps rolled back by a failure were counted as
// training while they ran; the driver's `rolled_back` event moves them to
// lost time. So the parts always add up to the wall time.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <istream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "runner/observe/events.h"

namespace erun {

enum class Spent { kStartup, kTraining, kRecovery, kRolledBack, kWaiting, kDriverGap };
inline constexpr int kSpentKinds = 6;
// "startup", "training", ...: the names of the event log, /metrics and the picture.
const char* to_string(Spent s);
// "start-up", "recoveries", "rolled-back steps", ...: for people.
const char* describe(Spent s);

struct JobSummary {
  std::string job_id;
  bool finished = false;  // a job_finished event was seen
  int exit_code = -1;     // -1: not finished
  int stop_signal = 0;    // erun was stopped by this signal (a `signal` event)
  double wall_s = 0;
  std::array<double, kSpentKinds> spent{};  // seconds, by Spent
  long generations = 0;
  // Generations whose ranks all joined erun's rendezvous. None: a program
  // without erun's library (restart mode) or one that failed first, whose
  // start-up erun cannot tell from its training: no goodput to say.
  long joined = 0;
  std::map<std::string, long> resets;  // by reason
  long hosts_seen = 0;
  long workers_failed = 0;    // exited with an error, or excluded, without erun stopping them
  long workers_launched = 0;  // every worker process erun started
  long commits_restored = 0;  // generations that resumed from a commit kept in host memory
  long drains = 0, stragglers = 0, takeovers = 0, standbys_promoted = 0;
  double slowest_recovery_s = -1;  // reset to the next generation joined; < 0: none
  long slowest_recovery_generation = 0;
  std::string slowest_recovery_reason;

  double training_s() const { return spent[static_cast<int>(Spent::kTraining)]; }
  double lost_s() const { return wall_s - training_s(); }
  double goodput() const { return wall_s > 0 ? training_s() / wall_s : 0; }
  // "93.1 %", or "n/a" with the reason when no generation joined.
  std::string goodput_text() const;
  long resets_total() const;
};

// The summary as erun prints it when a job ends (several lines, no trailing newline).
std::string format_summary(const JobSummary& s);
// The `job_summary` event.
ev::JobSummary summary_event(const JobSummary& s);

class JobAccount {
 public:
  // One event, as the driver's event log stamped it.
  void observe(const Stamp& stamp, const Event& event);
  // One line of an event log file. Lines that are not an event object are
  // ignored (false): a log cut short by a crash ends in nothing worse. An
  // event of a type this erun does not know only moves the clock on.
  bool observe_line(std::string_view line);
  // A job taken over by a new erun: its account so far, read back from the
  // event log this erun goes on appending to, before its own first event.
  // The lines of job `job_id` since it last started there: a log may hold
  // other jobs before it, and this job's earlier runs, each ended by its
  // job_summary.
  void restore(std::istream& log, const std::string& job_id);

  // Live only (the driver): a commit id some rank reported at `at` (seconds
  // since the epoch). The newest id and when it was first seen give the
  // commit's age; their history dates the commit a failure rolls back to.
  void commit_seen(uint64_t id, double at);
  // The seconds of work a failure threw away when its survivors restore
  // `commit`: from that commit (when first seen) to the last reset, or to
  // the failure when no reset followed it yet, or to `now` when the failure
  // itself was not seen yet. `made_at`: when the commit was made, if known
  // (a survivor's JOIN says how long before it the commit was made);
  // otherwise the commits seen date it. Empty when neither dates it.
  std::optional<double> rolled_back_to(uint64_t commit, double now, std::optional<double> made_at = {}) const;

  // Everything up to `now` (seconds since the epoch; after the last event,
  // or the job's end when it ended).
  JobSummary summary(double now) const;
  // The picture's input (python -m erun.report): phases, generations, world
  // size and marked events, times in seconds since the job started.
  std::string timeline_json(double now) const;

  // For the status line and /metrics.
  bool started() const { return start_ >= 0; }
  double start_time() const { return start_; }
  long generation() const { return generation_; }
  long world_size() const { return world_; }
  long hosts() const { return static_cast<long>(current_hosts_.size()); }
  Spent phase() const { return phase_; }
  double last_fault_time() const { return last_fault_; }  // < 0: none yet
  uint64_t last_commit() const { return last_commit_; }
  double last_commit_time() const { return last_commit_at_; }  // < 0: none yet
  long blacklisted() const { return static_cast<long>(blacklisted_.size()); }
  const std::vector<double>& recoveries() const { return recoveries_; }  // seconds each, in order

 private:
  // When `commit` was made, by the reports seen (never after `fault`).
  std::optional<double> seen_at(uint64_t commit, double fault) const;
  struct Phase {
    double start, end;
    Spent kind;
  };
  struct Mark {
    double t;
    std::string kind, label;
    double recovery_s = -1;
  };
  struct Band {
    long generation;
    double start, end;  // end < 0: still running
    long size;
    std::string plan;
  };

  void observe(const LoggedEvent& e);
  // The event's time, the job's clock moved on to it (a new driver's start is a driver gap).
  double advance(const Stamp& stamp);
  // Each event at its time `t`.
  void on(const ev::JobStarted& e, double t);
  void on(const ev::GenerationStarted& e, double t);
  void on(const ev::GenerationJoined& e, double t);
  void on(const ev::Reset& e, double t);
  void on(const ev::SurvivorsWaiting& e, double t);
  void on(const ev::WorkerExited& e, double t);
  void on(const ev::WorkerExcluded& e, double t);
  void on(const ev::HostDraining& e, double t);
  void on(const ev::Straggler& e, double t);
  void on(const ev::PreflightHeldBack& e, double t);
  void on(const ev::CommitRestored& e, double t);
  void on(const ev::HostsChanged& e, double t);
  void on(const ev::StandbyPromoted& e, double t);
  void on(const ev::HostBlacklisted& e, double t);
  void on(const ev::DriverAttached& e, double t);
  void on(const ev::RolledBack& e, double t);
  void on(const ev::Signal& e, double t);
  void on(const ev::JobFinished& e, double t);
  // Events that change nothing in the account but its clock.
  void on(const ev::PeersLost&, double) {}
  void on(const ev::Rejoined&, double) {}
  void on(const ev::CrashLoop&, double) {}
  void on(const ev::HostDrained&, double) {}
  void on(const ev::StandbyReady&, double) {}
  void on(const ev::JobSummary&, double) {}

  void enter(Spent next, double t);
  void mark(double t, std::string kind, std::string label, bool awaits_recovery);
  void set_world(double t, long size);

  double start_ = -1;          // the first driver's start, seconds since the epoch
  double driver_start_ = -1;   // the current driver's start
  double last_event_ = -1;
  double end_ = -1;            // job_finished
  Spent phase_ = Spent::kStartup;
  double phase_since_ = 0;
  std::array<double, kSpentKinds> spent_{};

  JobSummary counts_;
  long generation_ = 0, world_ = 0, pending_size_ = 0;
  std::set<std::string> hosts_seen_, current_hosts_, blacklisted_;
  double last_fault_ = -1, reset_at_ = -1;
  double joined_at_ = -1;  // the last generation_joined
  std::string reset_reason_;
  std::vector<size_t> awaiting_recovery_;  // marks_ indices
  std::vector<double> recoveries_;

  uint64_t last_commit_ = 0;
  double last_commit_at_ = -1;
  std::deque<std::pair<uint64_t, double>> commit_times_;  // (id, first seen), ids rising

  std::vector<Phase> phases_;
  std::vector<Mark> marks_;
  std::vector<Band> bands_;
  std::vector<std::pair<double, long>> world_steps_;
};

}  // namespace erun
