#include "runner/observe/job_account.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace erun {
namespace {

using json = nlohmann::json;

// "2026-11-28T14:38:24.994Z" (EventLog's "time") as seconds since the epoch.
std::optional<double> parse_time(const std::string& s) {
  int y, mo, d, h, mi, sec, ms = 0;
  if (std::sscanf(s.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d.%3dZ", &y, &mo, &d, &h, &mi, &sec, &ms) < 6) {
    return std::nullopt;
  }
  tm t{};
  t.tm_year = y - 1900;
  t.tm_mon = mo - 1;
  t.tm_mday = d;
  t.tm_hour = h;
  t.tm_min = mi;
  t.tm_sec = sec;
  return static_cast<double>(timegm(&t)) + ms / 1000.0;
}

std::string text(const json& e, const char* key) {
  auto it = e.find(key);
  return it != e.end() && it->is_string() ? it->get<std::string>() : std::string();
}

double number(const json& e, const char* key, double otherwise = 0) {
  auto it = e.find(key);
  return it != e.end() && it->is_number() ? it->get<double>() : otherwise;
}

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

std::vector<EventLog::Field> summary_fields(const JobSummary& s) {
  std::vector<EventLog::Field> f = {{"wall_s", json_number(s.wall_s)}};
  for (int k = 0; k < kSpentKinds; ++k) {
    f.emplace_back(fmt::format("{}_s", to_string(static_cast<Spent>(k))), json_number(s.spent[k]));
  }
  json resets = json::object();
  for (auto& [reason, count] : s.resets) resets[reason] = count;
  f.insert(f.end(), {{"goodput", json_number(s.goodput())},
                     {"generations", json_number(s.generations)},
                     {"resets", resets.dump()},
                     {"hosts_seen", json_number(s.hosts_seen)},
                     {"workers_failed", json_number(s.workers_failed)},
                     {"workers_launched", json_number(s.workers_launched)},
                     {"commits_restored", json_number(s.commits_restored)},
                     {"drains", json_number(s.drains)},
                     {"stragglers", json_number(s.stragglers)},
                     {"takeovers", json_number(s.takeovers)},
                     {"standbys_promoted", json_number(s.standbys_promoted)},
                     {"slowest_recovery_s", json_number(s.slowest_recovery_s)}});
  return f;
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
  json e = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!e.is_object()) return false;
  const std::string event = text(e, "event");
  std::optional<double> when = parse_time(text(e, "time"));
  if (event.empty() || !when) return false;
  double t = *when;
  const double driver_start = t - number(e, "t", 0);
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

  if (event == "job_started") {
    counts_.job_id = text(e, "job_id");
    current_hosts_ = host_names(text(e, "hosts"));
    hosts_seen_.insert(current_hosts_.begin(), current_hosts_.end());
  } else if (event == "generation_started") {
    generation_ = static_cast<long>(number(e, "generation"));
    pending_size_ = static_cast<long>(number(e, "size"));
    counts_.generations = std::max(counts_.generations, generation_);
    if (phase_ == Spent::kWaiting) enter(Spent::kRecovery, t);  // enough slots again: forming
    if (!bands_.empty() && bands_.back().end < 0) bands_.back().end = t - start_;
    bands_.push_back(Band{generation_, t - start_, -1, pending_size_, text(e, "plan")});
  } else if (event == "generation_joined") {
    ++counts_.joined;
    enter(Spent::kTraining, t);
    joined_at_ = t;
    set_world(t, pending_size_);
    if (reset_at_ >= 0) {
      const double took = t - reset_at_;
      recoveries_.push_back(took);
      if (took > counts_.slowest_recovery_s) {
        counts_.slowest_recovery_s = took;
        counts_.slowest_recovery_generation = static_cast<long>(number(e, "generation"));
        counts_.slowest_recovery_reason = reset_reason_;
      }
      for (size_t i : awaiting_recovery_) marks_[i].recovery_s = t - marks_[i].t - start_;
      reset_at_ = -1;
    }
    awaiting_recovery_.clear();
  } else if (event == "reset") {
    reset_reason_ = text(e, "reason");
    ++counts_.resets[reset_reason_];
    if (reset_at_ < 0) reset_at_ = t;  // a second reset before the job is back is the same recovery
    if (reset_reason_ != "membership changed") last_fault_ = t;
    enter(Spent::kRecovery, t);
    set_world(t, 0);
  } else if (event == "survivors_waiting") {
    enter(Spent::kWaiting, t);
    set_world(t, 0);
  } else if (event == "worker_exited") {
    auto stopped = e.find("stopped_by_erun");
    const long code = static_cast<long>(number(e, "exit_code"));
    auto standby = e.find("standby");
    const bool was_standby = standby != e.end() && standby->is_boolean() && standby->get<bool>();
    if (code != 0 && !was_standby && !(stopped != e.end() && stopped->is_boolean() && stopped->get<bool>())) {
      ++counts_.workers_failed;
      last_fault_ = t;
      mark(t - start_, "failure",
           fmt::format("{} rank {} exited {}", text(e, "host"), static_cast<long>(number(e, "rank")), code), true);
    }
  } else if (event == "worker_excluded") {
    ++counts_.workers_failed;
    last_fault_ = t;
    mark(t - start_, "failure",
         fmt::format("{} rank {} {}", text(e, "host"), static_cast<long>(number(e, "rank")), text(e, "state")), true);
  } else if (event == "host_draining") {
    ++counts_.drains;
    mark(t - start_, "drain", fmt::format("drain {} ({})", text(e, "host"), text(e, "reason")), true);
  } else if (event == "straggler") {
    ++counts_.stragglers;
    mark(t - start_, "straggler",
         fmt::format("straggler {} rank {} {:.1f}x ({})", text(e, "host"), static_cast<long>(number(e, "rank")),
                     number(e, "factor"), text(e, "action")),
         text(e, "action") == "evict");
  } else if (event == "preflight_held_back") {
    const std::string check = text(e, "check");  // "" in logs from before the link probe: the compute check
    mark(t - start_, "preflight",
         fmt::format("{} held back: slow {}", text(e, "host"), check == "link" ? "link" : "compute check"), false);
  } else if (event == "commit_restored") {
    ++counts_.commits_restored;
    mark(t - start_, "restore",
         fmt::format("commit {} restored from {}", static_cast<long>(number(e, "commit")), text(e, "host")), false);
  } else if (event == "hosts_changed") {
    std::set<std::string> now = host_names(text(e, "hosts"));
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
  } else if (event == "standby_promoted") {
    ++counts_.standbys_promoted;
    mark(t - start_, "standby",
         fmt::format("standby {}[{}] promoted", text(e, "host"), static_cast<long>(number(e, "slot"))), false);
  } else if (event == "host_blacklisted") {
    blacklisted_.insert(text(e, "host"));
    mark(t - start_, "blacklist", "blacklisted " + text(e, "host"), false);
  } else if (event == "driver_attached") {
    ++counts_.takeovers;
    ++counts_.joined;  // it adopted a running generation: training goes on
    mark(t - start_, "takeover", fmt::format("driver term {} took over", static_cast<long>(number(e, "term"))),
         false);
    enter(Spent::kTraining, t);
  } else if (event == "rolled_back") {
    // The survivors may re-join before the driver has reset the generation:
    // the training they threw away is then still the phase in progress,
    // counted up to now first.
    if (phase_ == Spent::kTraining) enter(Spent::kTraining, t);
    const double lost = std::min(std::max(0.0, number(e, "seconds")), spent_[static_cast<int>(Spent::kTraining)]);
    spent_[static_cast<int>(Spent::kTraining)] -= lost;
    spent_[static_cast<int>(Spent::kRolledBack)] += lost;
  } else if (event == "signal") {
    counts_.stop_signal = static_cast<int>(number(e, "signal"));
  } else if (event == "job_finished") {
    counts_.finished = true;
    counts_.exit_code = static_cast<int>(number(e, "exit_code", -1));
    counts_.workers_launched = static_cast<long>(number(e, "launched", static_cast<double>(counts_.workers_launched)));
    enter(phase_, t);
    set_world(t, 0);
    if (!bands_.empty() && bands_.back().end < 0) bands_.back().end = t - start_;
    end_ = t;
  }
  counts_.hosts_seen = static_cast<long>(hosts_seen_.size());
  return true;
}

void JobAccount::commit_seen(uint64_t id, double at) {
  if (id == 0 || id <= last_commit_) return;
  last_commit_ = id;
  last_commit_at_ = at;
  commit_times_.emplace_back(id, at);
  if (commit_times_.size() > kMaxCommitHistory) commit_times_.pop_front();
}

std::optional<double> JobAccount::rolled_back_to(uint64_t commit, double now) const {
  // The failure is dated by its reset; before that, by this generation's
  // fault; before the driver has seen that (the survivors can report it
  // first), by now.
  double fault = now;
  if (reset_at_ >= 0) {
    fault = reset_at_;
  } else if (last_fault_ >= 0 && last_fault_ >= joined_at_) {
    fault = last_fault_;
  }
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
  double at;
  if (below && below->first == commit) {
    at = below->second;
  } else if (below && above) {
    at = below->second + (above->second - below->second) * static_cast<double>(commit - below->first) /
                             static_cast<double>(above->first - below->first);
  } else if (below && commit_times_.size() >= 2 && commit_times_.back().first > commit_times_.front().first) {
    const double per_id = (commit_times_.back().second - commit_times_.front().second) /
                          static_cast<double>(commit_times_.back().first - commit_times_.front().first);
    at = std::min(fault, below->second + per_id * static_cast<double>(commit - below->first));
  } else {
    return std::nullopt;
  }
  return std::max(0.0, fault - at);
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
