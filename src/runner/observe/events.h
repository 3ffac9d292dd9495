// The job's events (docs/event_log.md): one struct per event type, the
// driver's word for what happened. Each names its event (kName) and lists its
// fields once, in the log's order, with their names (fields()): the writer
// (event_line) and the reader (parse_event_line) both walk that list, so a
// new event is one struct and one entry in Event, and a renamed field is a
// compile error for every reader in the process. The driver hands them to an
// EventSink (event_log.h); the job's account (job_account.h) reads them as
// they are, and reads a log file back through parse_event_line.
//
// Field types and how the log writes them: std::string a JSON string, long an
// integer, double a number of 6 significant digits, bool true/false,
// std::map<std::string, long> an object.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <variant>

namespace erun {
namespace ev {

// A field of an event: its name in the log and the member that holds it.
template <class T>
struct Field {
  const char* name;
  T& value;
};
template <class T>
Field<T> field(const char* name, T& value) {
  return Field<T>{name, value};
}

struct JobStarted {
  static constexpr const char* kName = "job_started";
  std::string job_id;
  std::string hosts;  // the first discovery's hosts, "host:slots,..."
  long min_np = 0, max_np = 0;
  auto fields() {
    return std::tuple(field("job_id", job_id), field("hosts", hosts), field("min_np", min_np), field("max_np", max_np));
  }
};
struct DriverAttached {
  static constexpr const char* kName = "driver_attached";
  long term = 0, generation = 0, workers = 0;
  long hosts = 0;  // how many
  auto fields() {
    return std::tuple(field("term", term), field("generation", generation), field("workers", workers),
                      field("hosts", hosts));
  }
};
struct HostsChanged {
  static constexpr const char* kName = "hosts_changed";
  std::string hosts;
  auto fields() { return std::tuple(field("hosts", hosts)); }
};
struct GenerationStarted {
  static constexpr const char* kName = "generation_started";
  long generation = 0, size = 0;
  std::string plan;
  auto fields() { return std::tuple(field("generation", generation), field("size", size), field("plan", plan)); }
};
struct GenerationJoined {
  static constexpr const char* kName = "generation_joined";
  long generation = 0;
  double seconds = 0;
  auto fields() { return std::tuple(field("generation", generation), field("seconds", seconds)); }
};
struct CommitRestored {
  static constexpr const char* kName = "commit_restored";
  long generation = 0, commit = 0;
  std::string host;
  auto fields() { return std::tuple(field("generation", generation), field("commit", commit), field("host", host)); }
};
struct WorkerExited {
  static constexpr const char* kName = "worker_exited";
  long generation = 0;
  std::string host;
  long rank = 0, exit_code = 0;
  bool oom_killed = false, stopped_by_erun = false, standby = false;
  auto fields() {
    return std::tuple(field("generation", generation), field("host", host), field("rank", rank),
                      field("exit_code", exit_code), field("oom_killed", oom_killed),
                      field("stopped_by_erun", stopped_by_erun), field("standby", standby));
  }
};
struct Reset {
  static constexpr const char* kName = "reset";
  long generation = 0;
  std::string reason;  // "worker failed", "membership changed"
  long resets = 0;
  auto fields() {
    return std::tuple(field("generation", generation), field("reason", reason), field("resets", resets));
  }
};
struct PeersLost {
  static constexpr const char* kName = "peers_lost";
  long generation = 0;
  std::string ranks;  // "1,3"
  auto fields() { return std::tuple(field("generation", generation), field("ranks", ranks)); }
};
struct Rejoined {
  static constexpr const char* kName = "rejoined";
  long generation = -1;
  std::string host;
  long slot = 0;
  std::string reason;
  long failed_rank = -1;
  std::string failed_state;
  long commit = 0;
  auto fields() {
    return std::tuple(field("generation", generation), field("host", host), field("slot", slot),
                      field("reason", reason), field("failed_rank", failed_rank), field("failed_state", failed_state),
                      field("commit", commit));
  }
};
struct WorkerExcluded {
  static constexpr const char* kName = "worker_excluded";
  long generation = 0;
  std::string host;
  long rank = 0;
  std::string state;
  auto fields() {
    return std::tuple(field("generation", generation), field("host", host), field("rank", rank), field("state", state));
  }
};
struct SurvivorsWaiting {
  static constexpr const char* kName = "survivors_waiting";
  long generation = 0, usable_slots = 0;
  auto fields() { return std::tuple(field("generation", generation), field("usable_slots", usable_slots)); }
};
struct CrashLoop {
  static constexpr const char* kName = "crash_loop";
  long generations = 0;
  auto fields() { return std::tuple(field("generations", generations)); }
};
struct HostDraining {
  static constexpr const char* kName = "host_draining";
  long generation = 0;
  std::string host, reason;
  long workers = 0;
  auto fields() {
    return std::tuple(field("generation", generation), field("host", host), field("reason", reason),
                      field("workers", workers));
  }
};
struct HostDrained {
  static constexpr const char* kName = "host_drained";
  long generation = 0;
  std::string host;
  double seconds = 0;
  auto fields() { return std::tuple(field("generation", generation), field("host", host), field("seconds", seconds)); }
};
struct Straggler {
  static constexpr const char* kName = "straggler";
  long generation = 0;
  std::string host;
  long slot = 0, rank = 0;
  double factor = 0, interval = 0, without = 0;
  std::string action;  // "evict", "report"
  double cooldown = 0;
  auto fields() {
    return std::tuple(field("generation", generation), field("host", host), field("slot", slot), field("rank", rank),
                      field("factor", factor), field("interval", interval), field("without", without),
                      field("action", action), field("cooldown", cooldown));
  }
};
struct PreflightHeldBack {
  static constexpr const char* kName = "preflight_held_back";
  long generation = 0;
  std::string host;
  long slot = 0;
  std::string check;  // "compute", "link"; "" in logs from before the link probe: compute
  double probe_ms = 0, median_ms = 0, cooldown = 0;
  auto fields() {
    return std::tuple(field("generation", generation), field("host", host), field("slot", slot), field("check", check),
                      field("probe_ms", probe_ms), field("median_ms", median_ms), field("cooldown", cooldown));
  }
};
struct HostBlacklisted {
  static constexpr const char* kName = "host_blacklisted";
  std::string host;
  auto fields() { return std::tuple(field("host", host)); }
};
struct Signal {
  static constexpr const char* kName = "signal";
  long signal = 0;
  auto fields() { return std::tuple(field("signal", signal)); }
};
struct StandbyReady {
  static constexpr const char* kName = "standby_ready";
  std::string host;
  long slot = 0;
  double seconds = 0;
  auto fields() { return std::tuple(field("host", host), field("slot", slot), field("seconds", seconds)); }
};
struct StandbyPromoted {
  static constexpr const char* kName = "standby_promoted";
  long generation = 0;
  std::string host;
  long slot = 0;
  std::string reason;
  auto fields() {
    return std::tuple(field("generation", generation), field("host", host), field("slot", slot),
                      field("reason", reason));
  }
};
struct RolledBack {
  static constexpr const char* kName = "rolled_back";
  long generation = 0, commit = 0;
  double seconds = 0;
  auto fields() {
    return std::tuple(field("generation", generation), field("commit", commit), field("seconds", seconds));
  }
};
struct JobFinished {
  static constexpr const char* kName = "job_finished";
  long exit_code = -1, generation = 0, resets = 0;
  long launched = -1;  // < 0: not in the log (older logs)
  auto fields() {
    return std::tuple(field("exit_code", exit_code), field("generation", generation), field("resets", resets),
                      field("launched", launched));
  }
};
// The job's account at its end (job_account.h's JobSummary, summary_event()).
struct JobSummary {
  static constexpr const char* kName = "job_summary";
  double wall_s = 0;
  // By Spent, in its order; they add up to wall_s.
  double startup_s = 0, training_s = 0, recovery_s = 0, rolled_back_s = 0, waiting_s = 0, driver_gap_s = 0;
  double goodput = 0;
  long generations = 0;
  std::map<std::string, long> resets;  // by reason
  long hosts_seen = 0, workers_failed = 0, workers_launched = 0, commits_restored = 0;
  long drains = 0, stragglers = 0, takeovers = 0, standbys_promoted = 0;
  double slowest_recovery_s = -1;
  auto fields() {
    return std::tuple(field("wall_s", wall_s), field("startup_s", startup_s), field("training_s", training_s),
                      field("recovery_s", recovery_s), field("rolled_back_s", rolled_back_s),
                      field("waiting_s", waiting_s), field("driver_gap_s", driver_gap_s), field("goodput", goodput),
                      field("generations", generations), field("resets", resets), field("hosts_seen", hosts_seen),
                      field("workers_failed", workers_failed), field("workers_launched", workers_launched),
                      field("commits_restored", commits_restored), field("drains", drains),
                      field("stragglers", stragglers), field("takeovers", takeovers),
                      field("standbys_promoted", standbys_promoted), field("slowest_recovery_s", slowest_recovery_s));
  }
};

}  // namespace ev

using Event = std::variant<ev::JobStarted, ev::DriverAttached, ev::HostsChanged, ev::GenerationStarted,
                           ev::GenerationJoined, ev::CommitRestored, ev::WorkerExited, ev::Reset, ev::PeersLost,
                           ev::Rejoined, ev::WorkerExcluded, ev::SurvivorsWaiting, ev::CrashLoop, ev::HostDraining,
                           ev::HostDrained, ev::Straggler, ev::PreflightHeldBack, ev::HostBlacklisted, ev::Signal,
                           ev::StandbyReady, ev::StandbyPromoted, ev::RolledBack, ev::JobFinished, ev::JobSummary>;

// When an event happened, as its log line says it: `time` its wall clock
// (seconds since the epoch, to the millisecond), `t` seconds since its erun
// started (to the millisecond).
struct Stamp {
  double time = 0;
  double t = 0;
};

// "job_started", "reset", ...
const char* event_name(const Event& event);
// The event's log line, without its newline:
// {"time":"2026-11-22T23:04:19.534Z","t":0.018,"event":"job_started",...}.
std::string event_line(const Stamp& stamp, const Event& event);

// A line of an event log read back: its stamp and its event; no event when
// its type is not one this erun knows (a newer erun's).
struct LoggedEvent {
  Stamp stamp;
  std::optional<Event> event;
};
// Empty when the line is no event object with an event name and a time (a
// line cut short by a crash, another program's line). A field that is
// missing or of another type keeps its struct's default.
std::optional<LoggedEvent> parse_event_line(std::string_view line);

// A JSON string with `"`, `\` and control characters escaped.
std::string json_string(const std::string& s);

}  // namespace erun
