#include "runner/observe/job_view.h"

#include <glob.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <string_view>

#include <fmt/format.h>

#include "common/subprocess.h"

namespace erun {
namespace {

std::string age_text(double s) {
  if (s < 0) s = 0;
  if (s < 10) return fmt::format("{:.1f} s", s);
  if (s < 60) return fmt::format("{:.0f} s", s);
  if (s < 3600) return fmt::format("{}m{:02}s", static_cast<long>(s) / 60, static_cast<long>(s) % 60);
  return fmt::format("{}h{:02}m", static_cast<long>(s) / 3600, static_cast<long>(s) / 60 % 60);
}

// A label value: backslash, double quote and newline escaped.
std::string label(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

// The recovery histogram's upper bounds, seconds: in place recovers in
// hundredths, a restart in seconds, a wait for hosts in minutes.
constexpr double kRecoveryBuckets[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300};

// Runs erun/report.py as __main__: the file erun found beside itself, else
// the one of this python's erun package, found without importing it (its
// __init__ loads the compiled extension).
constexpr const char* kBootstrap = R"PY(
import importlib.util, os, runpy, sys
path = os.environ.get("ERUN_REPORT_FILE") or None
if path is None:
    spec = importlib.util.find_spec("erun")
    if spec and spec.submodule_search_locations:
        p = os.path.join(list(spec.submodule_search_locations)[0], "report.py")
        path = p if os.path.isfile(p) else None
last = os.environ.get("ERUN_REPORT_LAST") == "1"
if path is None or importlib.util.find_spec("matplotlib") is None:
    if not last:
        sys.exit(4)  # erun tries the next python
    sys.stdin.read()
    if path is None:
        print("erun report: cannot find erun's Python package (erun/report.py) for this python (%s): install it "
              "(pip install . or cmake --install), or set ERUN_PYTHON to a python that has it" % sys.executable,
              file=sys.stderr)
    else:
        print("erun report: drawing needs matplotlib, which no python tried has (the last: %s): apt-get install "
              "python3-matplotlib, or pip install matplotlib; erun report EVENTS.jsonl without -o prints the summary "
              "without it" % sys.executable, file=sys.stderr)
    sys.exit(3)
sys.argv = [path] + sys.argv[1:]
runpy.run_path(path, run_name="__main__")
)PY";

// The pythons to try, in order: ERUN_PYTHON alone when set; else a venv's
// (next to its erun), the PATH's, and Debian's (python3-matplotlib).
std::vector<std::string> pythons(const std::string& dir) {
  if (const char* p = std::getenv("ERUN_PYTHON"); p && *p) return {p};
  std::vector<std::string> out;
  if (::access((dir + "/python3").c_str(), X_OK) == 0) out.push_back(dir + "/python3");
  out.push_back("python3");
  if (::access("/usr/bin/python3", X_OK) == 0) out.push_back("/usr/bin/python3");
  return out;
}

// erun/report.py where it lies beside this erun: the build tree
// (build/src/runner/erun, build/python), a `cmake --install` prefix
// (bin/erun, lib/python3/dist-packages) or a venv (bin/erun,
// lib/python3.X/site-packages). Then any python with matplotlib draws, its
// own erun package or none. "" when not found.
std::string report_file(const std::string& dir) {
  for (const std::string& pattern : {dir + "/../../python/erun/report.py", dir + "/../lib/python3/dist-packages/erun/report.py",
                                     dir + "/../lib/python3*/site-packages/erun/report.py",
                                     dir + "/../lib/python3*/dist-packages/erun/report.py"}) {
    glob_t g{};
    if (::glob(pattern.c_str(), 0, nullptr, &g) == 0 && g.gl_pathc > 0) {
      std::string found = g.gl_pathv[0];
      ::globfree(&g);
      return found;
    }
    ::globfree(&g);
  }
  return {};
}

int draw(const JobAccount& account, double now, const std::string& output, const std::string& format) {
  const std::string self = own_executable();
  const std::string dir = self.empty() ? "." : self.substr(0, self.rfind('/'));
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    if (std::strncmp(*e, "ERUN_REPORT_", 12) != 0) env.emplace_back(*e);
  }
  if (std::string file = report_file(dir); !file.empty()) env.push_back("ERUN_REPORT_FILE=" + file);
  const std::string doc = account.timeline_json(now);
  const auto candidates = pythons(dir);
  for (size_t i = 0; i < candidates.size(); ++i) {
    SpawnOptions o;
    o.argv = {candidates[i], "-c", kBootstrap, "-o", output};
    if (!format.empty()) o.argv.insert(o.argv.end(), {"--format", format});
    o.env = env;
    if (i + 1 == candidates.size()) o.env->push_back("ERUN_REPORT_LAST=1");
    o.pipe_stdin = true;
    o.pipe_stdout = o.pipe_stderr = false;
    o.new_process_group = false;
    auto child = Subprocess::spawn(o);
    if (!child) {
      if (i + 1 < candidates.size()) continue;
      std::fprintf(stderr, "erun report: cannot run %s: %s (set ERUN_PYTHON to a python 3 with matplotlib)\n",
                   candidates[i].c_str(), child.message().c_str());
      return 3;
    }
    (void)write_all(child->stdin_fd(), doc);  // false: it exited early, and its status says why
    child->close_stdin();
    auto status = child->wait_for(std::chrono::hours(1));
    if (!status) return 1;
    if (status->shell_code() == 4 && i + 1 < candidates.size()) continue;  // no matplotlib or no erun there
    if (status->shell_code() == 0) std::fprintf(stderr, "erun report: wrote %s\n", output.c_str());
    return status->shell_code();
  }
  return 3;
}

constexpr const char* kReportUsage =
    "usage: erun report EVENTS.jsonl [-o FILE.svg|FILE.html] [--format svg|html] [--json]\n"
    "  Reads a job's event log (erun --event-log). Without -o, prints the job's summary: wall time,\n"
    "  training, the time lost by cause, goodput, generations, resets, failures and the slowest\n"
    "  recovery. With -o, draws the job's timeline into one self-contained SVG or HTML file\n"
    "  (needs python3 with matplotlib: apt-get install python3-matplotlib). --json prints the\n"
    "  summary and timeline as one JSON document (what the picture is drawn from).\n";

}  // namespace

std::string status_text(const JobAccount& a, double now) {
  JobSummary s = a.summary(now);
  std::string out = fmt::format("erun: gen {} | ", a.generation());
  switch (a.phase()) {
    case Spent::kTraining:
      out += fmt::format("{} rank{} on {} host{}", a.world_size(), a.world_size() == 1 ? "" : "s", a.hosts(),
                         a.hosts() == 1 ? "" : "s");
      break;
    case Spent::kStartup: out += "starting"; break;
    case Spent::kRecovery: out += "recovering"; break;
    case Spent::kWaiting: out += "waiting for --min-np"; break;
    default: out += to_string(a.phase()); break;
  }
  out += a.last_fault_time() >= 0 ? fmt::format(" | last fault {} ago", age_text(now - a.last_fault_time()))
                                  : std::string(" | no fault");
  if (a.last_commit_time() >= 0) {
    out += fmt::format(" | commit {}, {} ago", a.last_commit(), age_text(now - a.last_commit_time()));
  }
  out += s.joined ? fmt::format(" | goodput {:.1f} %", 100 * s.goodput()) : std::string(" | goodput n/a");
  return out;
}

std::string prometheus_text(const JobAccount& a, double now) {
  JobSummary s = a.summary(now);
  std::string o;
  auto metric = [&](const char* name, const char* type, const char* help) {
    o += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  metric("erun_job_info", "gauge", "The job erun runs (always 1).");
  o += fmt::format("erun_job_info{{job_id=\"{}\"}} 1\n", label(s.job_id));
  metric("erun_world_size", "gauge", "Ranks of the generation that is training (0 while recovering).");
  o += fmt::format("erun_world_size {}\n", a.world_size());
  metric("erun_generation", "gauge", "The job's generation.");
  o += fmt::format("erun_generation {}\n", a.generation());
  metric("erun_hosts", "gauge", "Hosts discovery lists now.");
  o += fmt::format("erun_hosts {}\n", a.hosts());
  metric("erun_resets_total", "counter", "Resets (a generation given up for another), by reason.");
  for (auto& [reason, count] : s.resets) o += fmt::format("erun_resets_total{{reason=\"{}\"}} {}\n", label(reason), count);
  metric("erun_recovery_seconds", "histogram", "From a reset until the next generation joined.");
  double sum = 0;
  for (double b : kRecoveryBuckets) {
    long n = 0;
    for (double r : a.recoveries()) n += r <= b ? 1 : 0;
    o += fmt::format("erun_recovery_seconds_bucket{{le=\"{}\"}} {}\n", b, n);
  }
  for (double r : a.recoveries()) sum += r;
  o += fmt::format("erun_recovery_seconds_bucket{{le=\"+Inf\"}} {}\n", a.recoveries().size());
  o += fmt::format("erun_recovery_seconds_sum {}\nerun_recovery_seconds_count {}\n", sum, a.recoveries().size());
  metric("erun_goodput_ratio", "gauge", "Share of the job's wall time spent training (0 to 1).");
  o += fmt::format("erun_goodput_ratio {:.6f}\n", s.goodput());
  metric("erun_time_seconds_total", "counter", "The job's wall time by what it was spent on.");
  for (int k = 0; k < kSpentKinds; ++k) {
    o += fmt::format("erun_time_seconds_total{{phase=\"{}\"}} {:.3f}\n", to_string(static_cast<Spent>(k)), s.spent[k]);
  }
  metric("erun_hosts_blacklisted_total", "counter", "Hosts blacklisted after failures.");
  o += fmt::format("erun_hosts_blacklisted_total {}\n", a.blacklisted());
  metric("erun_workers_failed_total", "counter", "Workers that failed (exited with an error or were excluded).");
  o += fmt::format("erun_workers_failed_total {}\n", s.workers_failed);
  if (a.last_commit_time() >= 0) {
    metric("erun_last_commit_id", "gauge", "The newest commit any rank reported.");
    o += fmt::format("erun_last_commit_id {}\n", a.last_commit());
    metric("erun_last_commit_age_seconds", "gauge", "Seconds since the newest commit was first reported.");
    o += fmt::format("erun_last_commit_age_seconds {:.3f}\n", std::max(0.0, now - a.last_commit_time()));
  }
  return o;
}

namespace {

// What `erun report` was asked: the event log ("-": stdin) and how to show it.
struct ReportArgs {
  std::string events, output, format;
  bool json = false;
};

// Reads `erun report`'s command line; an exit status when it ends there
// (--help: 0, a mistake: 2, said on stderr).
std::optional<int> parse_report_args(int argc, char** argv, ReportArgs& r) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if ((a == "-o" || a == "--output" || a == "--format") && i + 1 < argc) {
      (a == "--format" ? r.format : r.output) = argv[++i];
    } else if (a == "--json") {
      r.json = true;
    } else if (a == "-h" || a == "--help") {
      std::fputs(kReportUsage, stdout);
      return 0;
    } else if (r.events.empty() && (a.empty() || a[0] != '-' || a == "-")) {
      r.events = a;
    } else {
      std::fprintf(stderr, "erun report: unexpected argument '%s'\n%s", a.c_str(), kReportUsage);
      return 2;
    }
  }
  if (r.events.empty()) {
    std::fprintf(stderr, "erun report: which event log? (erun --event-log FILE writes one)\n%s", kReportUsage);
    return 2;
  }
  if (!r.format.empty() && r.format != "svg" && r.format != "html") {
    std::fprintf(stderr, "erun report: --format %s: use svg or html\n", r.format.c_str());
    return 2;
  }
  return std::nullopt;
}

// Feeds the event log's lines to the account; false (said on stderr) when it
// cannot be read or holds no event.
bool read_event_log(const std::string& events, JobAccount& account) {
  std::ifstream in(events == "-" ? "/dev/stdin" : events);
  if (!in) {
    std::fprintf(stderr, "erun report: cannot read %s: %s\n", events.c_str(), std::strerror(errno));
    return false;
  }
  std::string line;
  long lines = 0, read = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    ++lines;
    read += account.observe_line(line) ? 1 : 0;
  }
  if (read == 0) {
    std::fprintf(stderr, "erun report: %s holds no erun events (%ld line%s): is it an erun --event-log file?\n",
                 events.c_str(), lines, lines == 1 ? "" : "s");
    return false;
  }
  if (lines > read) {
    std::fprintf(stderr, "erun report: %s: skipped %ld line%s that are not events\n", events.c_str(), lines - read,
                 lines - read == 1 ? "" : "s");
  }
  return true;
}

}  // namespace

int report_main(int argc, char** argv) {
  ::signal(SIGPIPE, SIG_IGN);  // a python that exits early is a status, not a death
  ReportArgs args;
  if (std::optional<int> done = parse_report_args(argc, argv, args)) return *done;
  JobAccount account;
  if (!read_event_log(args.events, account)) return 2;
  // A job still running (or whose erun was killed) is counted up to its last event.
  const double now = 0;
  if (args.json) {
    std::printf("%s\n", account.timeline_json(now).c_str());
    return 0;
  }
  if (args.output.empty()) {
    std::printf("%s\n", format_summary(account.summary(now)).c_str());
    return 0;
  }
  return draw(account, now, args.output, args.format);
}

}  // namespace erun
