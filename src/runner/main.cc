// erun's entry point: parse the command line, build the driver's parts, run
// the job, turn the outcome into an exit code. The only place that reads the
// environment and installs signal handlers.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <thread>
#include <variant>

#include <fmt/format.h>

#include "agent/agent.h"
#include "common/log.h"
#include "common/status_line.h"
#include "common/strings.h"
#include "discovery/discovery.h"
#include "runner/cli.h"
#include "runner/driver.h"
#include "runner/observe/event_log.h"
#include "runner/takeover/job_record.h"
#include "runner/observe/job_view.h"
#include "runner/observe/metrics_server.h"
#include "runner/launch/launcher.h"
#include "runner/launch/launcher_srun.h"
#include "runner/launch/launchers.h"
#include "runner/takeover/record_keeper.h"
#include "runner/hosts/host_sources.h"
#include "runner/hosts/slurm_grow.h"
#include "runner/takeover/job_claim.h"
#include "runner/takeover/standby_driver.h"
#include "runner/launch/output.h"
#include "rendezvous/rendezvous.h"

#include <openssl/rand.h>

namespace {

std::string random_hex(size_t bytes) {
  std::vector<unsigned char> buf(bytes);
  if (RAND_bytes(buf.data(), static_cast<int>(buf.size())) != 1) {
    std::fprintf(stderr, "erun: cannot get random bytes for the job secret (OpenSSL RAND_bytes failed)\n");
    std::exit(1);
  }
  std::string out;
  for (auto b : buf) out += fmt::format("{:02x}", b);
  return out;
}

erun::Driver* g_driver = nullptr;
std::atomic<int> g_signals{0};  // lock-free: safe in a signal handler

void on_signal(int sig) {
  // A second signal escalates: stop the workers with SIGKILL, no grace.
  int n = ++g_signals;
  if (g_driver) g_driver->request_stop(n > 1 ? SIGKILL : sig);
}

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

// --launcher mpirun: one discovery, then erun becomes mpirun (a static job).
int exec_mpirun(const erun::DriverOptions& o, erun::HostDiscovery& discovery) {
  auto hosts = discovery.discover();
  if (!hosts) {
    std::fprintf(stderr, "erun: %s: %s\n", discovery.describe().c_str(), hosts.message().c_str());
    return 2;
  }
  std::vector<std::string> argv = erun::mpirun_command(o, *hosts, o.env);
  if (o.dry_run) {
    std::vector<std::string> quoted;
    for (auto& w : argv) quoted.push_back(erun::shell_quote(w));
    std::printf("%s\n", erun::join(quoted, " ").c_str());
    return 0;
  }
  std::vector<char*> cargv;
  for (auto& w : argv) cargv.push_back(w.data());
  cargv.push_back(nullptr);
  std::fflush(nullptr);
  ::execvp(cargv[0], cargv.data());
  std::fprintf(stderr, "erun: --launcher mpirun: cannot run mpirun: %s (install openmpi-bin or fix PATH)\n",
               std::strerror(errno));
  return 127;
}

// `erun --agent [--heartbeat-interval S] [--heartbeat-timeout S] [--driver-grace S] [--drain-timeout S] [--relay]`:
// the per-host agent (src/agent/agent.h), started by a driver; not for users.
// `erun --agent --attach PATH`: a new driver's way to a running agent.
int agent_main(int argc, char** argv) {
  erun::init_logging(erun::log_level_from_env(erun::LogLevel::kInfo));
  erun::agent::AgentOptions o;
  o.host = erun::this_host_name();
  if (const char* tmp = std::getenv("TMPDIR"); tmp && tmp[0] == '/') o.relay_dir = tmp;
  if (argc == 4 && std::string(argv[2]) == "--attach") return erun::agent::run_attach_pump(argv[3]);
  for (int i = 2; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag == "--relay") {
      o.relay = true;
      continue;
    }
    if (flag == "--log-level" && i + 1 < argc && erun::parse_log_level(argv[i + 1])) {
      erun::init_logging(*erun::parse_log_level(argv[++i]));
      continue;
    }
    double v = 0;
    bool known =
        (flag == "--heartbeat-interval" || flag == "--heartbeat-timeout" || flag == "--driver-grace" ||
         flag == "--drain-timeout") && i + 1 < argc;
    if (known) {
      char* end = nullptr;
      v = std::strtod(argv[i + 1], &end);
      known = end && *end == '\0' && v > 0;
    }
    if (!known) {
      std::fprintf(stderr, "erun --agent: unexpected argument '%s' (the agent is started by erun itself)\n",
                   argv[i]);
      return 2;
    }
    auto d = std::chrono::duration_cast<erun::Duration>(std::chrono::duration<double>(v));
    (flag == "--heartbeat-interval"  ? o.heartbeat_interval
     : flag == "--heartbeat-timeout" ? o.heartbeat_timeout
     : flag == "--drain-timeout"     ? o.drain_timeout
                                     : o.driver_grace) = d;
    ++i;
  }
  return erun::agent::run_agent(o);
}

// The command line as DriverOptions, or the exit code when erun stops here
// (--help and --version: 0 after printing; a wrong command line: 2).
std::variant<erun::DriverOptions, int> parse_options(int argc, char** argv) {
  erun::CliContext cli_context;
  cli_context.in_slurm_allocation = !env_or_empty("SLURM_JOB_ID").empty();
  auto parsed = erun::parse_cli(argc, argv, cli_context);
  if (auto* info = std::get_if<erun::CliInfo>(&parsed)) {
    std::fputs(info->text.c_str(), stdout);
    return 0;
  }
  if (auto* err = std::get_if<erun::CliError>(&parsed)) {
    std::fprintf(stderr, "erun: %s\n", err->message.c_str());
    return 2;
  }
  auto& options = std::get<erun::DriverOptions>(parsed);
  for (const auto& note : options.notes) std::fprintf(stderr, "erun: note: %s\n", note.c_str());
  return std::move(options);
}

// -x NAME forwards erun's own value of NAME; false (after saying so) when it has none.
bool resolve_forwarded_env(erun::DriverOptions& options) {
  for (auto& e : options.env) {
    if (e.find('=') != std::string::npos) continue;
    const char* v = std::getenv(e.c_str());
    if (!v) {
      std::fprintf(stderr, "erun: -x %s: the variable is not set in erun's environment; set it or use -x %s=VALUE\n",
                   e.c_str(), e.c_str());
      return false;
    }
    e += "=" + std::string(v);
  }
  return true;
}

// --dry-run: the plan and the commands, nothing launched.
int dry_run(erun::Driver& driver) {
  if (auto s = driver.start(); !s) {
    ERUN_LOG_ERROR("{}", s.message());
    return 1;
  }
  return driver.dry_run(stdout);
}

// SIGHUP with --driver-grace: the terminal or session that ran erun is gone.
// That is erun's loss, not a stop order: erun ends at once without a word to
// the agents, which keep the workers for the grace (their channels close as
// this process ends).
void on_hangup(int) { ::_exit(128 + SIGHUP); }

// Runs the job; SIGINT, SIGTERM and SIGHUP stop it (a second signal:
// SIGKILL), but SIGHUP with --driver-grace leaves it to a new driver.
int run_with_signals(erun::Driver& driver, bool hangup_leaves) {
  g_driver = &driver;
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaction(s, &sa, nullptr);
  if (hangup_leaves) {
    sa.sa_handler = on_hangup;
    sigaction(SIGHUP, &sa, nullptr);
  }
  int code = driver.run();
  g_driver = nullptr;
  return code;
}

std::string current_directory() {
  char cwd[4096];
  return ::getcwd(cwd, sizeof cwd) ? std::string(cwd) : std::string();
}

// The status line and /metrics, from the job's account, refreshed after the
// driver's steps (a few times a second at most); the summary at the end.
class JobView {
 public:
  JobView(const erun::DriverOptions& o, const erun::JobAccount& account) : o_(o), account_(account) {}

  bool start() {
    status_ = !o_.no_status && erun::StatusLine::get().enable();
    if (o_.metrics_port < 0) return true;
    if (auto s = metrics_.start(o_.metrics_addr, o_.metrics_port); !s) {
      std::fprintf(stderr, "erun: %s\n", s.message().c_str());
      return false;
    }
    metrics_.publish(erun::prometheus_text(account_, erun::realtime_seconds()));
    say(fmt::format("erun: metrics at {}\n", metrics_.url()));
    return true;
  }

  void tick() {
    const auto now = std::chrono::steady_clock::now();
    if (status_ && now >= next_status_) {
      erun::StatusLine::get().show(erun::status_text(account_, erun::realtime_seconds()));
      next_status_ = now + std::chrono::milliseconds(250);
    }
    if (o_.metrics_port >= 0 && now >= next_metrics_) {
      metrics_.publish(erun::prometheus_text(account_, erun::realtime_seconds()));
      next_metrics_ = now + std::chrono::seconds(1);
    }
  }

  // The summary (none when another erun took the job over: it is not over).
  void finish(const std::optional<erun::JobSummary>& summary) {
    if (o_.metrics_port >= 0) metrics_.publish(erun::prometheus_text(account_, erun::realtime_seconds()));
    erun::StatusLine::get().close();
    if (summary) say("erun: " + erun::format_summary(*summary) + "\n");
  }

 private:
  static void say(const std::string& text) { (void)erun::StatusLine::get().write_above(2, text); }

  const erun::DriverOptions& o_;
  const erun::JobAccount& account_;
  bool status_ = false;
  erun::MetricsServer metrics_;
  std::chrono::steady_clock::time_point next_status_{}, next_metrics_{};
};

// The rendezvous server, started (not in a dry run); on the port of the job
// taken over where it is free. Null (and logged) when it cannot listen.
std::unique_ptr<erun::RendezvousServer> start_rendezvous(const erun::DriverOptions& options,
                                                         erun::ServerOptions& server_options, bool taking_over) {
  auto rendezvous = std::make_unique<erun::RendezvousServer>(server_options);
  // The rendezvous runs in restart mode too: a program using the worker
  // library still needs it to form each generation's world.
  if (options.dry_run) return rendezvous;
  erun::Status s = rendezvous->start();
  if (!s && taking_over) {
    ERUN_LOG_WARN("cannot listen on the job's rendezvous port {} again ({}): taking another, which the agents "
                  "tell their workers",
                  server_options.port, s.message());
    server_options.port = 0;
    rendezvous = std::make_unique<erun::RendezvousServer>(server_options);
    s = rendezvous->start();
  }
  if (!s) {
    ERUN_LOG_ERROR("cannot start the rendezvous server: {}; nothing was launched (check the address erun binds, "
                   "and the open-file limit `ulimit -n`)",
                   s.message());
    return nullptr;
  }
  return rendezvous;
}

// Who the job is: its one name (in every line, the summary, the event log and
// the workers' ERUN_JOB_ID: --job-name, or the same for the same command in
// the same directory, what `erun --attach NAME` and a takeover find it by),
// the rendezvous's id, secret and address, and its host-memory directory.
struct JobIdentity {
  std::string cwd, name, commit_dir;
  erun::ServerOptions server;
};
JobIdentity job_identity(const erun::DriverOptions& options, erun::HostDiscovery& discovery,
                         const std::vector<std::string>& args) {
  JobIdentity id;
  id.cwd = current_directory();
  id.name = options.job_name.empty() ? erun::default_job_name(id.cwd, args) : options.job_name;
  id.server.job_id = erun::valid_job_name(id.name) ? id.name : "erun-" + random_hex(6);
  id.server.secret = random_hex(32);
  id.commit_dir = options.host_commits ? "/dev/shm/erun-commits-" + random_hex(12) : "-";
  // Only this machine's workers will connect: nothing else needs to reach the port.
  if (erun::loopback_only(options, discovery)) id.server.bind_address = "127.0.0.1";
  return id;
}

// A job taken over keeps its id, secret, port, generation and host memory.
void keep_identity(JobIdentity& id, const erun::JobRecord& previous) {
  id.server.job_id = previous.job_id;
  id.server.secret = previous.secret;
  id.server.port = previous.rendezvous_port;  // the workers' relays reconnect to it
  id.server.resume_generation = previous.generation;
  id.commit_dir = previous.commit_dir.empty() ? "-" : previous.commit_dir;
}

// A job with a record: how it outlives this erun.
void say_how_to_take_over(const erun::DriverOptions& options, const std::string& name) {
  ERUN_LOG_INFO("job {}: should this erun die, its workers wait {:.0f} s (--driver-grace) for the same command "
                "again, or erun --attach {}",
                name, std::chrono::duration<double>(options.driver_grace).count(), name);
}

// What the record keeper starts from: this driver's part of the job record.
erun::JobRecord record_base(const erun::DriverOptions& options, const JobIdentity& id,
                            const std::optional<erun::JobRecord>& previous, int rdzv_port,
                            const std::vector<std::string>& args) {
  erun::JobRecord base;
  base.name = id.name;
  base.term = previous ? previous->term + 1 : 1;
  base.driver_pid = ::getpid();
  base.driver_host = erun::this_host_name();
  base.job_id = id.server.job_id;
  base.secret = id.server.secret;
  base.rendezvous_port = rdzv_port;
  base.commit_dir = id.commit_dir == "-" ? "" : id.commit_dir;
  base.cwd = previous ? previous->cwd : id.cwd;
  base.args = previous && options.job_name.empty() ? previous->args : args;
  return base;
}

// Where the job's events go besides --event-log: without one, a job that
// can be taken over (it has a record) keeps them in its directory, so that
// a taking-over erun reads its account back from them too; the file goes
// with the record when the job ends. Returns the log to read a taken-over
// job's account from ("" when there is none).
std::string account_log(const erun::DriverOptions& options, erun::JobStore* store, bool taken_over,
                        erun::EventLog& events) {
  if (!options.event_log.empty() || !store) return options.event_log;
  const std::string path = store->events_path();
  if (!taken_over) ::unlink(path.c_str());  // a crashed job's, whose record is gone
  if (auto s = events.open(path); !s) {
    ERUN_LOG_WARN("job events for a takeover's account: {}; a driver that takes this job over accounts only "
                  "for its own time",
                  s.message());
    return "";
  }
  return path;
}

// The job's account: a job taken over (`taken_over`) has its account from
// its start read back from its events (account_log()).
void restore_account(const erun::DriverOptions& options, erun::JobStore* store, bool taken_over,
                     const std::string& job_id, erun::EventLog& events, erun::JobAccount& account) {
  const std::string log = account_log(options, store, taken_over, events);
  if (!taken_over || log.empty()) return;
  std::ifstream in(log);
  account.restore(in, job_id);
}

// Runs the job to its end under the status line and /metrics, then says its
// summary: the job's exit code.
int run_job(const erun::DriverOptions& options, erun::DriverDeps& deps, erun::EventLog& events,
            const erun::JobAccount& account, erun::JobStore* store) {
  JobView view(options, account);
  if (!view.start()) return 2;
  deps.after_step = [&view, keep = std::move(deps.after_step)](const erun::Driver& d) {
    if (keep) keep(d);
    view.tick();
  };
  erun::Driver driver(options, deps);
  int code = run_with_signals(driver, options.driver_grace > erun::Duration::zero());
  if (driver.superseded_by() == 0) {
    erun::JobSummary summary = account.summary(erun::realtime_seconds());
    events.emit(erun::summary_event(summary));
    view.finish(summary);
  } else {
    view.finish(std::nullopt);
  }
  // The job is over (or another driver holds it): a later run starts anew.
  if (store && driver.superseded_by() == 0) store->remove();
  return code;
}

// The driver's parts that main made (the job's own, as `id` names them).
erun::DriverDeps driver_parts(erun::Launchers& launchers, erun::HostDiscovery& discovery, erun::Clock& clock,
                              erun::OutputForwarder& output, erun::EventLog& events, const JobIdentity& id) {
  erun::DriverDeps deps;
  deps.discovery = &discovery;
  deps.local_launcher = launchers.local.get();
  deps.remote_launcher = launchers.remote.get();
  deps.clock = &clock;
  deps.output = &output;
  deps.events = &events;
  deps.job_id = id.server.job_id;
  deps.secret = id.server.secret;
  deps.commit_dir = id.commit_dir;
  return deps;
}

// The driver and its parts (launchers, event log, output, rendezvous), then
// the job or its dry run. `args`: erun's arguments, for the job's name and
// record; `standby_store`: the job a standby driver takes over (stand_by()).
int run_driver(const erun::DriverOptions& options, erun::HostDiscovery& discovery,
               const std::vector<std::string>& args, const std::shared_ptr<erun::SlurmGrow>& slurm_grow,
               std::unique_ptr<erun::JobStore> standby_store) {
  auto launchers = erun::make_launchers(options, slurm_grow);
  if (!launchers) {
    std::fprintf(stderr, "erun: %s\n", launchers.message().c_str());
    return 2;
  }
  erun::EventLog events;
  if (auto s = options.event_log.empty() ? erun::Status::ok() : events.open(options.event_log); !s) {
    std::fprintf(stderr, "erun: %s\n", s.message().c_str());
    return 2;
  }
  erun::OutputForwarder output(erun::OutputOptions{options.tag_output, 1, 20});
  erun::SystemClock clock;
  JobIdentity id = job_identity(options, discovery, args);
  // With --driver-grace the job has a record that a new erun takes it over
  // from, and a lock: one driver at a time.
  auto claimed = erun::claim_job(options, id.name, std::move(standby_store));
  if (auto* code = std::get_if<int>(&claimed)) return *code;
  auto& [store, previous] = std::get<erun::JobClaim>(claimed);
  if (previous) keep_identity(id, *previous);
  auto rendezvous = start_rendezvous(options, id.server, previous.has_value());
  if (!rendezvous) return 1;
  erun::DriverDeps deps = driver_parts(*launchers, discovery, clock, output, events, id);
  erun::DriverDeps::Takeover takeover;
  if (previous) {
    if (!erun::claim_takeover(options, *launchers, *store, *previous, id.name, rendezvous->port(), takeover)) return 3;
    deps.takeover = &takeover;
  }
  if (!options.dry_run) {
    deps.membership = rendezvous.get();
    deps.rendezvous_port = rendezvous->port();
  }
  // What the job's time went to: the status line, /metrics and the summary at the end.
  erun::JobAccount account;
  if (!options.dry_run) restore_account(options, store.get(), previous.has_value(), id.server.job_id, events, account);
  events.set_observer([&account](const erun::Stamp& at, const erun::Event& e) { account.observe(at, e); });
  deps.account = &account;
  std::optional<erun::RecordKeeper> keeper;
  if (store) {
    keeper.emplace(*store, record_base(options, id, previous, rendezvous->port(), args), launchers->all());
    if (!previous) say_how_to_take_over(options, id.name);
    deps.after_step = [&keeper](const erun::Driver& d) { (*keeper)(d); };
    deps.record_superseded = [&keeper] { return keeper->superseded(); };
  }
  if (options.dry_run) {
    erun::Driver driver(options, deps);
    return dry_run(driver);
  }
  return run_job(options, deps, events, account, store.get());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "--agent") return agent_main(argc, argv);
  // `erun report EVENTS.jsonl [-o FILE]` (a program named report: erun ./report)
  if (argc >= 2 && std::string(argv[1]) == "report") return erun::report_main(argc - 1, argv + 1);
  std::vector<std::string> args(argv + 1, argv + argc);
  erun::Attach attach;
  if (auto code = erun::resolve_takeover(args, attach)) return *code;
  std::vector<char*> cargs = {argv[0]};
  for (auto& a : args) cargs.push_back(a.data());
  auto parsed = parse_options(static_cast<int>(cargs.size()), cargs.data());
  if (auto* code = std::get_if<int>(&parsed)) return *code;
  auto& options = std::get<erun::DriverOptions>(parsed);
  if (!attach.name.empty()) options.job_name = attach.name;
  if (!attach.address.empty()) options.driver_address = attach.address;
  // Warnings and errors by default; erun's agents and workers say the same
  // (local agents and mpirun's ranks inherit the variable, the driver gives
  // it to every worker, a remote agent gets --log-level).
  erun::init_logging(options.log_level);
  ::setenv("ERUN_LOG_LEVEL", erun::log_level_name(options.log_level), 1);
  if (!resolve_forwarded_env(options)) return 2;

  auto discovery = erun::make_discovery(options);
  if (!discovery) {
    std::fprintf(stderr, "erun: %s\n", discovery.message().c_str());
    return 2;
  }
  if (options.launcher == erun::LauncherKind::kMpirun) return exec_mpirun(options, **discovery);
  std::shared_ptr<erun::SlurmGrow> slurm_grow;
  if (!options.slurm_grow.empty() && !options.dry_run) {  // a dry run submits nothing
    const int slots = options.slots_per_host > 0 ? options.slots_per_host : 1;
    slurm_grow = std::make_shared<erun::SlurmGrow>(
        erun::SlurmGrow::Options{options.slurm_grow, env_or_empty("SLURM_JOB_ID"), slots}, erun::run_slurm_command);
    *discovery = std::make_unique<erun::SlurmGrowDiscovery>(std::move(*discovery), slurm_grow, options.max_np, slots);
  }
  ::signal(SIGPIPE, SIG_IGN);
  std::unique_ptr<erun::JobStore> standby_store;
  if (attach.standby) {
    auto watched = erun::stand_by(erun::jobs_directory(), attach.name, options.heartbeat_timeout);
    if (auto* code = std::get_if<int>(&watched)) return *code;
    standby_store = std::move(std::get<std::unique_ptr<erun::JobStore>>(watched));
  }
  return run_driver(options, **discovery, args, slurm_grow, std::move(standby_store));
}
