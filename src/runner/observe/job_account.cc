#include "runner/observe/job_account.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace erun {
namespace {

using json = nlohmann::json;

// The host names of a host list as the event log writes it ("a:2,b:2").
std::set<std::string> host_names(const std::string& list) {
  std::set<std::string> out;
  size_t at = 0;
  while (at < list.size()) {
    size_t comma = list.find(',', at);
    std::string item = list.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    size_t colon = item.rfind(':');
    // "host:slots"; an IPv6 literal in brackets keeps its colons
    if (colon != std::string::npos && item.find(']') == std::string::npos) item.resize(colon);
    if (!item.empty()) out.insert(item);
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

// Marks the picture can still label: a job of days with a fault a minute
// keeps its first ones and the counts.
constexpr size_t kMaxMarks = 5000;
constexpr size_t kMaxCommitHistory = 256;

std::string seconds_text(double s) {
  if (s <= 0) return "0 s";
  if (s < 0.0995) return fmt::format("{:.3f} s", s);
  if (s < 60) return fmt::format("{:.2f} s", s);
  if (s < 3600) return fmt::format("{:.0f} min {:02.0f} s", std::floor(s / 60), std::fmod(s, 60));
  return fmt::format("{:.0f} h {:02.0f} min", std::floor(s / 3600), std::floor(std::fmod(s, 3600) / 60));
}

}  // namespace

const char* to_string(Spent s) {
  switch (s) {
    case Spent::kStartup: return "startup";
    case Spent::kTraining: return "training";
    case Spent::kRecovery: return "recovery";
    case Spent::kRolledBack: return "rolled_back";
    case Spent::kWaiting: return "waiting";
    case Spent::kDriverGap: return "driver_gap";
  }
  return "?";
}

const char* describe(Spent s) {
  switch (s) {
    case Spent::kStartup: return "start-up";
    case Spent::kTraining: return "training";
    case Spent::kRecovery: return "recoveries";
    case Spent::kRolledBack: return "rolled-back steps";
    case Spent::kWaiting: return "waiting for --min-np";
    case Spent::kDriverGap: return "driver gap";
  }
  return "?";
}

long JobSummary::resets_total() const {
  long n = 0;
  for (auto& [reason, count] : resets) n += count;
  return n;
}

std::string JobSummary::goodput_text() const {
  if (joined == 0) {
    return "n/a (no generation joined erun's rendezvous: erun cannot tell the program's start-up from its training)";
  }
  return fmt::format("{:.1f} %", 100 * goodput());
}

std::string format_summary(const JobSummary& s) {
  std::string out = fmt::format("job {} {} in {}: goodput {}", s.job_id.empty() ? "?" : s.job_id,
                                s.finished      ? fmt::format("finished with exit code {}", s.exit_code)
                                : s.stop_signal ? fmt::format("was stopped by signal {}", s.stop_signal)
                                                : std::string("ran (no end recorded)"),
                                seconds_text(s.wall_s), s.goodput_text());
  out += fmt::format("\n  training {}; lost {}:", seconds_text(s.training_s()), seconds_text(s.lost_s()));
  const char* sep = " ";
  for (int k = 0; k < kSpentKinds; ++k) {
    if (k == static_cast<int>(Spent::kTraining)) continue;
    out += fmt::format("{}{} {}", sep, describe(static_cast<Spent>(k)), seconds_text(s.spent[k]));
    sep = ", ";
  }
  std::string reasons;
  for (auto& [reason, count] : s.resets) reasons += fmt::format("{}{} {}", reasons.empty() ? "" : ", ", count, reason);
  out += fmt::format("\n  {} generation{}, {} reset{}{}; {} host{} seen; {} worker{} failed, {} launched; {} "
                     "commit{} restored from host memory",
                     s.generations, s.generations == 1 ? "" : "s", s.resets_total(), s.resets_total() == 1 ? "" : "s",
                     reasons.empty() ? "" : " (" + reasons + ")", s.hosts_seen, s.hosts_seen == 1 ? "" : "s",
                     s.workers_failed, s.workers_failed == 1 ? "" : "s", s.workers_launched, s.commits_restored,
                     s.commits_restored == 1 ? "" : "s");
  if (s.drains || s.stragglers || s.takeovers || s.standbys_promoted) {
    out += fmt::format("; {} drain{}, {} straggler{}, {} driver takeover{}, {} standby promotion{}", s.drains,
                       s.drains == 1 ? "" : "s", s.stragglers, s.stragglers == 1 ? "" : "s", s.takeovers,
                       s.takeovers == 1 ? "" : "s", s.standbys_promoted, s.standbys_promoted == 1 ? "" : "s");
  }
  if (s.slowest_recovery_s >= 0) {
    out += fmt::format("\n  slowest recovery: {} (generation {}, {})", seconds_text(s.slowest_recovery_s),
                       s.slowest_recovery_generation, s.slowest_recovery_reason);
  }
  return out;
}

ev::JobSummary summary_event(const JobSummary& s) {
  ev::JobSummary e;
  e.wall_s = s.wall_s;
  double* spent[kSpentKinds] = {&e.startup_s, &e.training_s, &e.recovery_s,
                                &e.rolled_back_s, &e.waiting_s, &e.driver_gap_s};
  for (int k = 0; k < kSpentKinds; ++k) *spent[k] = s.spent[k];
  e.goodput = s.goodput();
  e.generations = s.generations;
  e.resets = s.resets;
  e.hosts_seen = s.hosts_seen;
  e.workers_failed = s.workers_failed;
  e.workers_launched = s.workers_launched;
  e.commits_restored = s.commits_restored;
  e.drains = s.drains;
  e.stragglers = s.stragglers;
  e.takeovers = s.takeovers;
  e.standbys_promoted = s.standbys_promoted;
  e.slowest_recovery_s = s.slowest_recovery_s;
  return e;
}

void JobAccount::enter(Spent next, double t) {
  t = std::max(t, phase_since_);
  spent_[static_cast<int>(phase_)] += t - phase_since_;
  if (t > phase_since_) {
    if (!phases_.empty() && phases_.back().kind == phase_ && phases_.back().end == phase_since_) {
      phases_.back().end = t;
    } else {
      phases_.push_back(Phase{phase_since_, t, phase_});
    }
  }
  phase_ = next;
  phase_since_ = t;
}

void JobAccount::mark(double t, std::string kind, std::string label, bool awaits_recovery) {
  if (marks_.size() >= kMaxMarks) return;
  if (awaits_recovery) awaiting_recovery_.push_back(marks_.size());
  marks_.push_back(Mark{t, std::move(kind), std::move(label)});
}

void JobAccount::set_world(double t, long size) {
  world_ = size;
  if (!world_steps_.empty() && world_steps_.back().first == t) {
    world_steps_.back().second = size;
  } else if (world_steps_.empty() || world_steps_.back().second != size) {
    world_steps_.emplace_back(t, size);
  }
}

bool JobAccount::observe_line(std::string_view line) {
  std::optional<LoggedEvent> e = parse_event_line(line);
  if (!e) return false;
  observe(*e);
  return true;
}

void JobAccount::observe(const LoggedEvent& e) {
  if (e.event) return observe(e.stamp, *e.event);
  advance(e.stamp);  // a newer erun's event: the job's clock goes on
}

void JobAccount::restore(std::istream& log, const std::string& job_id) {
  bool ours = false;  // the lines are this job's, since it last started
  std::string line;
  while (std::getline(log, line)) {
    std::optional<LoggedEvent> e = parse_event_line(line);
    if (!e) continue;
    if (auto* started = e->event ? std::get_if<ev::JobStarted>(&*e->event) : nullptr) {
      if (started->job_id != job_id) {
        ours = false;
        continue;
      }
      if (!ours) *this = JobAccount();  // this job starts (again): what came before was another run
      ours = true;
    } else if (e->event && std::holds_alternative<ev::JobSummary>(*e->event)) {
      ours = false;  // that run ended
      continue;
    }
    if (ours) observe(*e);
  }
}

void JobAccount::observe(const Stamp& stamp, const Event& event) {
  const double t = advance(stamp);
  std::visit([this, t](const auto& e) { on(e, t); }, event);
  counts_.hosts_seen = static_cast<long>(hosts_seen_.size());
}

double JobAccount::advance(const Stamp& stamp) {
  double t = stamp.time;
  const double driver_start = t - stamp.t;
  if (start_ < 0) {
    start_ = driver_start_ = std::min(driver_start, t);
    phase_since_ = start_;
    last_event_ = start_;
  } else if (driver_start > driver_start_ + 1.0 && driver_start >= last_event_ - 0.5) {
    // A new erun took the job over: its own clock starts again. The workers
    // trained on without a driver; whatever was not training stays what it was.
    driver_start_ = driver_start;
    enter(Spent::kDriverGap, phase_ == Spent::kTraining ? driver_start : last_event_);
  }
  t = std::max(t, last_event_);  // a clock step back never makes time negative
  last_event_ = t;
  return t;
}

void JobAccount::on(const ev::JobStarted& e, double) {
  counts_.job_id = e.job_id;
  current_hosts_ = host_names(e.hosts);
  hosts_seen_.insert(current_hosts_.begin(), current_hosts_.end());
}

void JobAccount::on(const ev::GenerationStarted& e, double t) {
  generation_ = e.generation;
  pending_size_ = e.size;
  counts_.generations = std::max(counts_.generations, generation_);
  if (phase_ == Spent::kWaiting) enter(Spent::kRecovery, t);  // enough slots again: forming
  if (!bands_.empty() && bands_.back().end < 0) bands_.back().end = t - start_;
  bands_.push_back(Band{generation_, t - start_, -1, pending_size_, e.plan});
}

void JobAccount::on(const ev::GenerationJoined& e, double t) {
  ++counts_.joined;
  enter(Spent::kTraining, t);
  joined_at_ = t;
  set_world(t, pending_size_);
  if (reset_at_ >= 0) {
    const double took = t - reset_at_;
    recoveries_.push_back(took);
    if (took > counts_.slowest_recovery_s) {
      counts_.slowest_recovery_s = took;
      counts_.slowest_recovery_generation = e.generation;
      counts_.slowest_recovery_reason = reset_reason_;
    }
    for (size_t i : awaiting_recovery_) marks_[i].recovery_s = t - marks_[i].t - start_;
    reset_at_ = -1;
  }
  awaiting_recovery_.clear();
}

void JobAccount::on(const ev::Reset& e, double t) {
  reset_reason_ = e.reason;
  ++counts_.resets[reset_reason_];
  if (reset_at_ < 0) reset_at_ = t;  // a second reset before the job is back is the same recovery
  if (reset_reason_ != "membership changed") last_fault_ = t;
  enter(Spent::kRecovery, t);
  set_world(t, 0);
}

void JobAccount::on(const ev::SurvivorsWaiting&, double t) {
  enter(Spent::kWaiting, t);
  set_world(t, 0);
}

void JobAccount::on(const ev::WorkerExited& e, double t) {
  if (e.exit_code == 0 || e.standby || e.stopped_by_erun) return;
  ++counts_.workers_failed;
  last_fault_ = t;
  mark(t - start_, "failure", fmt::format("{} rank {} exited {}", e.host, e.rank, e.exit_code), true);
}

void JobAccount::on(const ev::WorkerExcluded& e, double t) {
  ++counts_.workers_failed;
  last_fault_ = t;
  mark(t - start_, "failure", fmt::format("{} rank {} {}", e.host, e.rank, e.state), true);
}

void JobAccount::on(const ev::HostDraining& e, double t) {
  ++counts_.drains;
  mark(t - start_, "drain", fmt::format("drain {} ({})", e.host, e.reason), true);
}

void JobAccount::on(const ev::Straggler& e, double t) {
  ++counts_.stragglers;
  mark(t - start_, "straggler",
       fmt::format("straggler {} rank {} {:.1f}x ({})", e.host, e.rank, e.factor, e.action), e.action == "evict");
}

void JobAccount::on(const ev::PreflightHeldBack& e, double t) {
  // check "" in logs from before the link probe: the compute check
  mark(t - start_, "preflight",
       fmt::format("{} held back: slow {}", e.host, e.check == "link" ? "link" : "compute check"), false);
}

void JobAccount::on(const ev::CommitRestored& e, double t) {
  ++counts_.commits_restored;
  mark(t - start_, "restore", fmt::format("commit {} restored from {}", e.commit, e.host), false);
}

void JobAccount::on(const ev::HostsChanged& e, double t) {
  std::set<std::string> now = host_names(e.hosts);
  std::string diff;
  for (auto& h : now) {
    if (!current_hosts_.count(h)) diff += (diff.empty() ? "+" : " +") + h;
  }
  for (auto& h : current_hosts_) {
    if (!now.count(h)) diff += (diff.empty() ? "-" : " -") + h;
  }
  hosts_seen_.insert(now.begin(), now.end());
  current_hosts_ = std::move(now);
  if (!diff.empty()) mark(t - start_, "membership", diff, false);
}

void JobAccount::on(const ev::StandbyPromoted& e, double t) {
  ++counts_.standbys_promoted;
  mark(t - start_, "standby", fmt::format("standby {}[{}] promoted", e.host, e.slot), false);
}

void JobAccount::on(const ev::HostBlacklisted& e, double t) {
  blacklisted_.insert(e.host);
  mark(t - start_, "blacklist", "blacklisted " + e.host, false);
}

void JobAccount::on(const ev::DriverAttached& e, double t) {
  ++counts_.takeovers;
  ++counts_.joined;  // it adopted a running generation: training goes on
  mark(t - start_, "takeover", fmt::format("driver term {} took over", e.term), false);
  enter(Spent::kTraining, t);
}

void JobAccount::on(const ev::RolledBack& e, double t) {
  // The survivors may re-join before the driver has reset the generation:
  // the training they threw away is then still the phase in progress,
  // counted up to now first.
  if (phase_ == Spent::kTraining) enter(Spent::kTraining, t);
  const double lost = std::min(std::max(0.0, e.seconds), spent_[static_cast<int>(Spent::kTraining)]);
  spent_[static_cast<int>(Spent::kTraining)] -= lost;
  spent_[static_cast<int>(Spent::kRolledBack)] += lost;
}

void JobAccount::on(const ev::Signal& e, double) { counts_.stop_signal = static_cast<int>(e.signal); }

void JobAccount::on(const ev::JobFinished& e, double t) {
  counts_.finished = true;
  counts_.exit_code = static_cast<int>(e.exit_code);
  if (e.launched >= 0) counts_.workers_launched = e.launched;
  enter(phase_, t);
  set_world(t, 0);
  if (!bands_.empty() && bands_.back().end < 0) bands_.back().end = t - start_;
  end_ = t;
}

void JobAccount::commit_seen(uint64_t id, double at) {
  if (id == 0 || id <= last_commit_) return;
  last_commit_ = id;
  last_commit_at_ = at;
  commit_times_.emplace_back(id, at);
  if (commit_times_.size() > kMaxCommitHistory) commit_times_.pop_front();
}

std::optional<double> JobAccount::rolled_back_to(uint64_t commit, double now, std::optional<double> made_at) const {
  // The failure is dated by its reset; before that, by this generation's
  // fault; before the driver has seen that (the survivors can report it
  // first), by now.
  double fault = now;
  if (reset_at_ >= 0) {
    fault = reset_at_;
  } else if (last_fault_ >= 0 && last_fault_ >= joined_at_) {
    fault = last_fault_;
  }
  // The survivor's own word dates the commit best: the driver sees a report
  // only after it was sent and read.
  const std::optional<double> at = made_at ? made_at : seen_at(commit, fault);
  if (!at) return std::nullopt;
  return std::max(0.0, fault - *at);
}

std::optional<double> JobAccount::seen_at(uint64_t commit, double fault) const {
  // Ranks report at most every 100 ms, so an id may never have been seen:
  // it is dated between the ids seen around it, or after the last one at
  // the pace of the recent commits.
  const std::pair<uint64_t, double>* below = nullptr;
  const std::pair<uint64_t, double>* above = nullptr;
  for (auto& c : commit_times_) {
    if (c.first <= commit) below = &c;
    if (c.first >= commit) {
      above = &c;
      break;
    }
  }
  if (below && below->first == commit) return below->second;
  if (below && above) {
    return below->second + (above->second - below->second) * static_cast<double>(commit - below->first) /
                               static_cast<double>(above->first - below->first);
  }
  if (below && commit_times_.size() >= 2 && commit_times_.back().first > commit_times_.front().first) {
    const double per_id = (commit_times_.back().second - commit_times_.front().second) /
                          static_cast<double>(commit_times_.back().first - commit_times_.front().first);
    return std::min(fault, below->second + per_id * static_cast<double>(commit - below->first));
  }
  return std::nullopt;
}

JobSummary JobAccount::summary(double now) const {
  JobSummary s = counts_;
  if (start_ < 0) return s;
  const double end = end_ >= 0 ? end_ : std::max(now, last_event_);
  s.spent = spent_;
  s.spent[static_cast<int>(phase_)] += std::max(0.0, end - phase_since_);
  s.wall_s = end - start_;
  return s;
}

std::string JobAccount::timeline_json(double now) const {
  JobSummary s = summary(now);
  const double end = start_ + s.wall_s;
  json j;
  j["job_id"] = s.job_id;
  j["wall_s"] = s.wall_s;
  j["goodput"] = s.goodput();
  j["summary_text"] = format_summary(s);
  json world = json::array();
  if (world_steps_.empty() || world_steps_.front().first > start_) world.push_back({0.0, 0});
  for (auto& [t, size] : world_steps_) world.push_back({t - start_, size});
  j["world"] = std::move(world);
  json gens = json::array();
  for (auto& b : bands_) {
    gens.push_back({{"generation", b.generation},
                    {"start", b.start},
                    {"end", b.end >= 0 ? b.end : s.wall_s},
                    {"size", b.size},
                    {"plan", b.plan}});
  }
  j["generations"] = std::move(gens);
  json phases = json::array();
  auto add_phase = [&](double a, double b, Spent k) {
    if (b > a) phases.push_back({{"start", a - start_}, {"end", b - start_}, {"kind", to_string(k)}});
  };
  for (auto& p : phases_) add_phase(p.start, p.end, p.kind);
  add_phase(phase_since_, end, phase_);
  j["phases"] = std::move(phases);
  json marks = json::array();
  for (auto& m : marks_) {
    json o = {{"t", m.t}, {"kind", m.kind}, {"label", m.label}};
    if (m.recovery_s >= 0) o["recovery_s"] = m.recovery_s;
    marks.push_back(std::move(o));
  }
  j["events"] = std::move(marks);
  j["spent"] = json::object();
  for (int k = 0; k < kSpentKinds; ++k) j["spent"][to_string(static_cast<Spent>(k))] = s.spent[k];
  return j.dump();
}

}  // namespace erun
