#include "runner/cli.h"
#include "runner/takeover/job_record.h"

#include <boost/program_options.hpp>
#include <fmt/format.h>

#include <map>
#include <optional>
#include <sstream>

#include "common/strings.h"

namespace po = boost::program_options;

namespace erun {
namespace {

// How many values each option takes, to find where the user's command starts
// (everything from the first word that is neither an option nor its value).
const std::map<std::string, int>& option_arity() {
  static const std::map<std::string, int> arity = {
      {"-np", 1}, {"--np", 1}, {"-n", 1}, {"--num-proc", 1}, {"--min-np", 1}, {"--max-np", 1},
      {"--host-discovery-script", 1}, {"--discovery-interval", 1}, {"--discovery-timeout", 1},
      {"-H", 1}, {"--hosts", 1}, {"--hostfile", 1}, {"--slots-per-host", 1}, {"--slots", 1}, {"--slurm-grow", 1},
      {"--elastic-timeout", 1}, {"--reset-limit", 1}, {"--blacklist-cooldown-range", 2},
      {"--blacklist-after", 1}, {"--crash-loop-limit", 1}, {"--ssh-port", 1}, {"-p", 1}, {"--ssh-identity-file", 1},
      {"-i", 1}, {"--ssh-connect-timeout", 1}, {"-x", 1}, {"--env", 1},
      {"--output-filename", 1}, {"--event-log", 1}, {"--launcher", 1}, {"--mode", 1},
      {"--term-grace", 1}, {"--finish-timeout", 1}, {"--rendezvous-timeout", 1},
      {"--collective-timeout", 1}, {"--driver-address", 1}, {"--checkpoint-dir", 1}, {"--persist-interval", 1},
      {"--commit-replicas", 1}, {"--ssh-option", 1}, {"--agent-path", 1}, {"--heartbeat-timeout", 1},
      {"--driver-grace", 1}, {"--job-name", 1}, {"--drain-timeout", 1}, {"--stragglers", 1},
      {"--straggler-factor", 1}, {"--straggler-window", 1}, {"--preflight", 1},
      {"--metrics-port", 1}, {"--metrics-addr", 1}, {"--standby", 1}, {"--log-level", 1},
      // horovodrun's flags that take a value (add_horovodrun_flags)
      {"--min-num-proc", 1}, {"--max-num-proc", 1}, {"--start-timeout", 1}, {"--gloo-timeout-seconds", 1},
      {"--network-interface", 1}, {"--network-interfaces", 1}, {"--fusion-threshold-mb", 1},
      {"--cycle-time-ms", 1}, {"--cache-capacity", 1}, {"--autotune-log-file", 1}, {"--timeline-filename", 1},
      {"--stall-check-warning-time-seconds", 1}, {"--stall-check-shutdown-time-seconds", 1},
      {"--num-nccl-streams", 1}, {"--thread-affinity", 1}, {"--config-file", 1}, {"--mpi-args", 1},
      {"--binding-args", 1},
  };
  return arity;
}

std::string usage_text(const po::options_description& desc) {
  std::ostringstream out;
  out << "Usage: erun [options] COMMAND [ARGS...]\n\n"
         "Runs COMMAND as an elastic data-parallel job: -np workers over the hosts given by\n"
         "-H, --hostfile, --host-discovery-script or a Slurm allocation (default: this machine).\n\n"
         "Examples:\n"
         "  erun -np 4 ./train\n"
         "  erun -np 8 -H a:4,b:4 ./train\n"
         "  erun -np 8 --min-np 4 --max-np 16 --host-discovery-script ./discover_hosts.sh ./train\n"
         "  erun --slurm -np 16 --min-np 8 ./train      (inside salloc/sbatch; automatic when\n"
         "                                               SLURM_JOB_ID is set and no hosts are given)\n"
         "  erun --launcher mpirun -np 8 -H a:4,b:4 ./train   (static: erun hands the job to mpirun)\n\n"
         "A running job whose erun is gone (see --driver-grace):\n"
         "  erun --attach NAME                          take it over (or run the same command again)\n"
         "  erun --watch --attach NAME                watch it; take it over when its erun is gone\n"
         "  erun --watch --job-record DIR/NAME/record    the same, the record on shared storage\n\n"
      << desc;
  return out.str();
}

// The command line split into erun's own words (mpirun's -np spelled --np
// for program_options) and the user's command.
struct Words {
  std::vector<std::string> own;
  std::vector<std::string> command;
};

Words split_words(int argc, const char* const argv[]) {
  Words w;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      for (int j = i + 1; j < argc; ++j) w.command.emplace_back(argv[j]);
      break;
    }
    if (a.size() > 1 && a[0] == '-') {
      w.own.push_back(a);
      if (a.find('=') != std::string::npos) continue;
      auto it = option_arity().find(a);
      int n = it == option_arity().end() ? 0 : it->second;
      for (int k = 0; k < n && i + 1 < argc; ++k) w.own.emplace_back(argv[++i]);
      continue;
    }
    for (int j = i; j < argc; ++j) w.command.emplace_back(argv[j]);
    break;
  }
  // mpirun's -np and horovodrun's spellings of erun's flags.
  static const std::map<std::string, std::string> aliases = {
      {"-np", "--np"}, {"--num-proc", "--np"}, {"--min-num-proc", "--min-np"}, {"--max-num-proc", "--max-np"},
      {"-cb", "--check-build"}};
  for (auto& word : w.own) {
    auto eq = word.find('=');
    auto alias = aliases.find(word.substr(0, eq));
    if (alias != aliases.end()) word = alias->second + (eq == std::string::npos ? "" : word.substr(eq));
  }
  return w;
}

// What the flags hold before they become DriverOptions: durations in
// seconds, names of enums, and switches that DriverOptions keeps inverted.
struct RawFlags {
  double discovery_interval = 1, discovery_timeout = 30, elastic_timeout = 600;
  double term_grace = 5, finish_timeout = 60, rendezvous_timeout = 60, collective_timeout = 30;
  double ssh_connect_timeout = 10, heartbeat_timeout = 5, persist_interval = 5, driver_grace = 60,
         drain_timeout = 20;
  bool no_agent_relay = false;
  bool no_host_commits = false;
  std::vector<double> cooldown;
  std::string launcher = "auto", mode = "auto", stragglers = "evict", preflight = "on";
  bool tag = false, no_tag = false;
  std::string log_level;  // "": ERUN_LOG_LEVEL, else warn
  // horovodrun's flags (add_horovodrun_flags)
  double start_timeout = 0, gloo_timeout = 0;
  bool mpi = false;
};

// Every duration flag: its seconds and the option it sets. All must be
// positive but --term-grace, which may be 0; checked in this order.
struct DurationFlag {
  const char* name;
  double RawFlags::*seconds;
  Duration DriverOptions::*option;
};
constexpr DurationFlag kPositiveDurations[] = {
    {"--discovery-interval", &RawFlags::discovery_interval, &DriverOptions::discovery_interval},
    {"--discovery-timeout", &RawFlags::discovery_timeout, &DriverOptions::discovery_timeout},
    {"--elastic-timeout", &RawFlags::elastic_timeout, &DriverOptions::elastic_timeout},
    {"--finish-timeout", &RawFlags::finish_timeout, &DriverOptions::finish_timeout},
    {"--rendezvous-timeout", &RawFlags::rendezvous_timeout, &DriverOptions::rendezvous_timeout},
    {"--collective-timeout", &RawFlags::collective_timeout, &DriverOptions::collective_timeout},
    {"--ssh-connect-timeout", &RawFlags::ssh_connect_timeout, &DriverOptions::ssh_connect_timeout},
    {"--heartbeat-timeout", &RawFlags::heartbeat_timeout, &DriverOptions::heartbeat_timeout},
};

// The flags, in the order --help lists them, one group per function.
// clang-format off
void add_host_flags(po::options_description& desc, DriverOptions& o, RawFlags& r) {
  desc.add_options()
    ("np,n", po::value<int>(&o.np), "number of workers to start (-np N as with mpirun/horovodrun)")
    ("min-np", po::value<int>(&o.min_np), "smallest number of workers the job runs with (elastic)")
    ("max-np", po::value<int>(&o.max_np), "largest number of workers the job grows to (elastic)")
    ("host-discovery-script", po::value<std::string>(&o.discovery_script), "script printing one host[:slots] per line; run every --discovery-interval")
    ("discovery-interval", po::value<double>(&r.discovery_interval), "seconds between discoveries (default 1)")
    ("discovery-timeout", po::value<double>(&r.discovery_timeout), "seconds a discovery script may run (default 30)")
    ("hosts,H", po::value<std::string>(&o.hosts), "hosts and slots, e.g. a:4,b:4")
    ("hostfile", po::value<std::string>(&o.hostfile), "file with one 'host:slots' or 'host slots=N' per line")
    ("slots-per-host", po::value<int>(&o.slots_per_host), "slots of a host given without a count (with --slurm: of every node)")
    ("slurm", po::bool_switch(&o.slurm), "hosts and slots from the Slurm allocation (SLURM_JOB_NODELIST, SLURM_TASKS_PER_NODE); default when SLURM_JOB_ID is set and no hosts are given; with --host-discovery-script the script's output is used (e.g. to drop drained nodes)")
    ("slurm-grow", po::value<std::string>(&o.slurm_grow), "PARTITION: with --slurm, keep placeholder jobs (one node each) pending in PARTITION, as many as --max-np leaves room for; a node Slurm starts one on joins the job, and one Slurm preempts (a job of a higher priority tier) drains in place; cancelled when erun ends");
}

void add_elasticity_flags(po::options_description& desc, DriverOptions& o, RawFlags& r) {
  desc.add_options()
    ("elastic-timeout", po::value<double>(&r.elastic_timeout), "seconds to wait for --min-np slots (default 600)")
    ("reset-limit", po::value<int>(&o.reset_limit), "resets (restarts or resizes) allowed before the job fails (default: unlimited when elastic, 0 otherwise)")
    ("blacklist-cooldown-range", po::value<std::vector<double>>(&r.cooldown)->multitoken(), "MIN MAX seconds a failing host stays blacklisted, doubling per blacklisting (default 10 300)")
    ("blacklist-after", po::value<int>(&o.blacklist_after), "consecutive failures before a host is blacklisted (default 2)")
    ("stragglers", po::value<std::string>(&r.stragglers), "evict (default): a rank that computes --straggler-factor times longer than the others' median for --straggler-window commit intervals in a row leaves the job at the next commit, when the job stays at --min-np or above and would run at least 20 % faster, and its slot sits out a cooldown (--blacklist-cooldown-range, doubling); report: only log it and write the event; off: neither. Restart mode reports only")
    ("straggler-factor", po::value<double>(&o.straggler_factor), "how many times the others' median compute time makes a straggler (default 1.5)")
    ("straggler-window", po::value<int>(&o.straggler_window), "commit intervals in a row a straggler must be slow (default 3)")
    ("standby", po::value<int>(&o.standby), "standby workers (not the standby driver, erun --watch) kept on free slots (discovered beyond the plan): each runs the program up to its first join and waits there; a lost member's place goes to one at once, without the program's start-up (default 1 when a slot is free; 0: none; in place only)")
    ("preflight", po::value<std::string>(&r.preflight), "on (default): every worker times a fixed compute check (50-75 ms on a 2-core machine) before it first joins, and one on a host new to the job a round trip of 1 MiB each way with a worker on another host (at most 1 s); a new host whose check took more than 3 times the job's workers' median, or whose link probe took more than 3 times theirs or did not finish, is held back; its slot sits out a cooldown (--blacklist-cooldown-range) and is tried again; off: no check")
    ("crash-loop-limit", po::value<int>(&o.crash_loop_limit), "end the job when this many generations in a row fail with the same exit status on every host, each within 60 s and before any commit or finished worker (default 3; 0: never)");
}

void add_launcher_flags(po::options_description& desc, DriverOptions& o, RawFlags& r) {
  desc.add_options()
    ("launcher", po::value<std::string>(&r.launcher), "auto (local for this machine; srun under --slurm, ssh otherwise), local, ssh, srun (a Slurm job step per node), mpirun (static: erun execs mpirun with the hosts and -x variables; no driver, not elastic)")
    ("mode", po::value<std::string>(&r.mode), "auto, elastic (workers use the erun library) or restart (any program, torchrun-style)")
    ("ssh-port,p", po::value<int>(&o.ssh_port), "SSH port of the hosts")
    ("ssh-identity-file,i", po::value<std::string>(&o.ssh_identity_file), "SSH private key")
    ("ssh-connect-timeout", po::value<double>(&r.ssh_connect_timeout), "seconds for an SSH connection (default 10)")
    ("ssh-option", po::value<std::vector<std::string>>(&o.ssh_options), "more ssh options, repeatable: Key=Value (as -o Key=Value) or a raw flag; e.g. --ssh-option StrictHostKeyChecking=no --ssh-option UserKnownHostsFile=/dev/null turns host-key checking off (throwaway clusters only)")
    ("agent-path", po::value<std::string>(&o.agent_path), "the erun binary that runs the per-host agent on every host (default: this erun's own path)")
    ("heartbeat-timeout", po::value<double>(&r.heartbeat_timeout), "seconds a host's agent (or the driver, seen from the agent) may be silent before it is declared lost (default 5; heartbeats every 1 s)")
    ("drain-timeout", po::value<double>(&r.drain_timeout), "seconds a host that leaves on notice (SIGTERM to its agent or its workers, as Slurm and Kubernetes deliver a preemption; a `host:slots draining` discovery line) has for its workers to leave the job at their next commit, with nothing rolled back and no failure counted; workers still there after it are stopped as a failure (default 20; 0: a SIGTERM stops a host's workers at once, as a failure)")
    ("job-name", po::value<std::string>(&o.job_name), "the job's name for a takeover (with --driver-grace): the same command run again from the same directory finds the job without it; two jobs of the same command beside each other need different names")
    ("driver-grace", po::value<double>(&r.driver_grace), "seconds each host's agent keeps its workers training once erun is gone without a stop order (SIGKILL, a dropped connection, SIGHUP) and holds their output, waiting for a new erun to take the job over: the same command again, or erun --attach NAME; erun --watch --attach NAME (or --watch --job-record DIR/NAME/record) watches the job and takes it over by itself when its erun is gone or silent for --heartbeat-timeout (default 60; 0: they stop with erun)");
}

void add_output_flags(po::options_description& desc, DriverOptions& o, RawFlags& r) {
  desc.add_options()
    ("env,x", po::value<std::vector<std::string>>(&o.env), "NAME or NAME=VALUE to set for the workers (repeatable)")
    ("output-filename", po::value<std::string>(&o.output_dir), "directory for per-rank stdout/stderr files (DIR/rank.N/)")
    ("tag-output", po::bool_switch(&r.tag), "prefix worker lines with [rank]<stdout>: (default)")
    ("no-tag-output", po::bool_switch(&r.no_tag), "forward worker lines without prefixes")
    ("event-log", po::value<std::string>(&o.event_log), "append the job's events as JSON lines to this file (erun report FILE: the job's summary and picture)")
    ("no-status", po::bool_switch(&o.no_status), "no status line at the bottom of the terminal (there is none when stderr is not a terminal)")
    ("metrics-port", po::value<int>(&o.metrics_port), "serve the job's Prometheus metrics at http://ADDR:PORT/metrics (world size, generation, resets, recoveries, goodput, commit age...; 0: any free port, logged)")
    ("metrics-addr", po::value<std::string>(&o.metrics_addr), "the address --metrics-port listens on (default 127.0.0.1: this machine only; 0.0.0.0: every interface)");
}

void add_worker_flags(po::options_description& desc, DriverOptions& o, RawFlags& r) {
  desc.add_options()
    ("term-grace", po::value<double>(&r.term_grace), "seconds between SIGTERM and SIGKILL when stopping workers (default 5)")
    ("finish-timeout", po::value<double>(&r.finish_timeout), "seconds the others may take to finish after one worker succeeded (default 60)")
    ("rendezvous-timeout", po::value<double>(&r.rendezvous_timeout), "seconds a worker may take to (re-)join a generation (default 60)")
    ("collective-timeout", po::value<double>(&r.collective_timeout), "seconds a collective may block before it fails (default 30)")
    ("driver-address", po::value<std::string>(&o.driver_address), "address workers use to reach this driver (default: detected)")
    ("checkpoint-dir", po::value<std::string>(&o.checkpoint_dir), "directory for durable commits of elastic state (written in the background by each host's agent from host memory)")
    ("persist-interval", po::value<double>(&r.persist_interval), "seconds between background writes of the newest commit to --checkpoint-dir (default 5; 0: each commit as soon as the last write ended)")
    ("commit-replicas", po::value<int>(&o.commit_replicas), "hosts besides its maker's that keep each commit in memory: when the job's hosts are fewer, spare hosts (discovered, running no worker) keep replicas that the others push to them; a sharded State's pieces each go to one other host, a buddy (default 1; 0: none, no buddy copies either)")
    ("no-host-commits", po::bool_switch(&r.no_host_commits), "keep commits in worker memory only, not also in each host's /dev/shm (then a failure that kills every worker loses them)")
    ("no-agent-relay", po::bool_switch(&r.no_agent_relay), "workers connect to the driver's rendezvous themselves, one TCP connection each, instead of through their host's agent (one connection per host)");
}

void add_general_flags(po::options_description& desc, DriverOptions& o, RawFlags& r) {
  desc.add_options()
    ("dry-run", po::bool_switch(&o.dry_run), "print the plan, each host's agent command and each rank's program, environment and directory; launch nothing")
    ("log-level", po::value<std::string>(&r.log_level), "what erun, its agents and its workers' library say on stderr: error, warn, info or debug (default: $ERUN_LOG_LEVEL, else warn: warnings, errors and the job's summary; info: every step of the job)")
    ("verbose,v", po::bool_switch(&o.verbose), "--log-level debug: every info line and the debug lines")
    ("version", "print the version")
    ("help,h", "print this help");
}
// clang-format on

using Check = std::optional<CliError>;

Check fail(std::string message) { return CliError{std::move(message)}; }

// horovodrun's flags with no meaning under erun: accepted, each with a one-line
// note that says why (never dropped silently).
struct IgnoredFlag {
  const char* name;
  bool takes_value;
  const char* why;
};
constexpr const char* kNoFusion = "erun reduces gradients in buckets of its own (erun.torch's bucket_bytes)";
constexpr const char* kNoHierarchy =
    "erun reduces through shared memory within a host and TCP between hosts by itself";
constexpr const char* kNoTimeline = "erun writes no Horovod timeline: --event-log FILE and `erun report FILE` show the job";
constexpr const char* kNoStallCheck = "a blocked collective fails after --collective-timeout (default 30 s)";
constexpr const char* kNoInterface =
    "workers reach each other at each host's address as -H, --hostfile or the discovery script names it: "
    "name the hosts by their address on the network to use";
constexpr IgnoredFlag kIgnoredHorovodFlags[] = {
    {"fusion-threshold-mb", true, kNoFusion},
    {"cycle-time-ms", true, "erun has no background cycle: a collective runs when it is called"},
    {"cache-capacity", true, "erun keeps no response cache"},
    {"disable-cache", false, "erun keeps no response cache"},
    {"hierarchical-allreduce", false, kNoHierarchy},
    {"no-hierarchical-allreduce", false, kNoHierarchy},
    {"hierarchical-allgather", false, kNoHierarchy},
    {"no-hierarchical-allgather", false, kNoHierarchy},
    {"autotune", false, "erun has no autotuner"},
    {"autotune-log-file", true, "erun has no autotuner"},
    {"timeline-filename", true, kNoTimeline},
    {"timeline-mark-cycles", false, kNoTimeline},
    {"no-stall-check", false, kNoStallCheck},
    {"stall-check-warning-time-seconds", true, kNoStallCheck},
    {"stall-check-shutdown-time-seconds", true, kNoStallCheck},
    {"mpi-threads-disable", false, "erun starts MPI with MPI_THREAD_SERIALIZED"},
    {"num-nccl-streams", true, "erun runs NCCL on the stream of the caller's tensor"},
    {"thread-affinity", true, "erun does not pin its threads"},
    {"tcp", false, "erun picks its transports itself (shared memory within a host, TCP between hosts)"},
    {"gloo", false, "erun's driver and transports are its controller, in the role of Horovod's Gloo"},
    {"network-interface", true, kNoInterface},
    {"network-interfaces", true, kNoInterface},
    {"prefix-output-with-timestamp", false, "erun prefixes worker lines with their rank only"},
};

// horovodrun's flags: those erun maps onto its own, those it ignores (with a
// note) and those it refuses (with the reason). -np, -H, --hostfile, -p, -x,
// --min-np, --max-np, --slots-per-host, --host-discovery-script, --reset-limit,
// --blacklist-cooldown-range, --elastic-timeout, --output-filename,
// --verbose and --log-level are erun's own flags already.
void add_horovodrun_flags(po::options_description& desc, po::options_description& ignored, RawFlags& r) {
  desc.add_options()
    ("start-timeout", po::value<double>(&r.start_timeout), "horovodrun's: as --rendezvous-timeout")
    ("gloo-timeout-seconds", po::value<double>(&r.gloo_timeout), "horovodrun's: as --collective-timeout")
    ("mpi", po::bool_switch(&r.mpi), "horovodrun's: as --launcher mpirun (a static job)")
    ("check-build", "horovodrun's -cb: print what this erun runs, and exit")
    ("config-file", po::value<std::string>(), "horovodrun's: refused (erun does not read Horovod's YAML)")
    ("mpi-args", po::value<std::string>(), "horovodrun's: refused (erun passes nothing to mpirun this way)")
    ("binding-args", po::value<std::string>(), "horovodrun's: refused (as --mpi-args)");
  for (const auto& f : kIgnoredHorovodFlags) {
    const po::value_semantic* v = f.takes_value ? static_cast<const po::value_semantic*>(po::value<std::string>())
                                                : po::bool_switch();
    ignored.add_options()(f.name, v, "");
  }
}

// --help's line about the ignored flags (they are left out of the table).
std::string ignored_flags_text() {
  std::string text = "\nAlso accepted from horovodrun command lines, each with a one-line note that it has no\n"
                     "effect here (docs/horovod.md):\n ";
  size_t line = 1;
  for (const auto& f : kIgnoredHorovodFlags) {
    std::string word = fmt::format(" --{}", f.name);
    if (line + word.size() > 78) {
      text += "\n ";
      line = 1;
    }
    text += word;
    line += word.size();
  }
  return text + "\n";
}

std::string check_build_text() {
  return fmt::format(
      "erun {} (horovodrun --check-build)\n\n"
      "Available Frameworks:\n"
      "    [X] PyTorch      import erun.horovod.torch as hvd\n"
      "    [ ] TensorFlow\n"
      "    [ ] MXNet\n\n"
      "Available Controllers:\n"
      "    [X] erun         elastic: discovery, in-place recovery (Horovod's Gloo role)\n"
      "    [?] MPI          --mpi / --launcher mpirun (static), when erun was built with MPI\n\n"
      "Available Tensor Operations:\n"
      "    [X] erun         shared memory within a host, TCP between hosts (CPU)\n"
      "    [?] NCCL         when erun was built with CUDA (python -c 'import erun.horovod.torch as hvd; "
      "print(hvd.nccl_built())')\n",
      ERUN_VERSION);
}

// What horovodrun's flags become: erun's own settings, notes for the ignored
// ones, an error for the refused ones.
Check resolve_horovodrun_flags(DriverOptions& o, RawFlags& r, const po::variables_map& vm) {
  if (vm.count("config-file")) {
    return fail("--config-file " + vm["config-file"].as<std::string>() +
                ": erun does not read Horovod's YAML config; give its settings as flags (erun --help)");
  }
  for (const char* f : {"mpi-args", "binding-args"}) {
    if (vm.count(f)) {
      return fail(fmt::format("--{}: erun passes no arguments to mpirun this way; run mpirun yourself "
                              "(erun.horovod programs run under it) or drop the flag", f));
    }
  }
  if (vm.count("start-timeout") && !vm.count("rendezvous-timeout")) r.rendezvous_timeout = r.start_timeout;
  if (vm.count("gloo-timeout-seconds") && !vm.count("collective-timeout")) r.collective_timeout = r.gloo_timeout;
  if (r.mpi) {
    if (vm.count("launcher") && r.launcher != "mpirun") {
      return fail("--mpi and --launcher " + r.launcher + " contradict each other: give one");
    }
    r.launcher = "mpirun";
  }
  for (const auto& f : kIgnoredHorovodFlags) {
    const auto& v = vm[f.name];
    bool given = f.takes_value ? !v.empty() : (!v.empty() && v.as<bool>());
    if (given) o.notes.push_back(fmt::format("--{} is ignored: {}", f.name, f.why));
  }
  return std::nullopt;
}

// The timeouts: each positive (--term-grace: 0 or more), the heartbeat at least 2 s.
Check apply_durations(DriverOptions& o, const RawFlags& r) {
  for (const auto& d : kPositiveDurations) {
    if (!(r.*d.seconds > 0)) {
      return fail(fmt::format("{} {}: must be a positive number of seconds", d.name, r.*d.seconds));
    }
  }
  if (r.term_grace < 0) return fail("--term-grace must be 0 or more seconds");
  if (!(r.driver_grace >= 0)) return fail(fmt::format("--driver-grace {}: must be 0 or more seconds", r.driver_grace));
  o.driver_grace = from_seconds(r.driver_grace);
  if (!(r.drain_timeout >= 0)) return fail(fmt::format("--drain-timeout {}: must be 0 or more seconds", r.drain_timeout));
  o.drain_timeout = from_seconds(r.drain_timeout);
  if (!o.job_name.empty() && !valid_job_name(o.job_name)) {
    return fail(fmt::format("--job-name {}: use letters, digits, '.', '_' and '-' (not first '.'), at most 128",
                            o.job_name));
  }
  if (!(r.persist_interval >= 0)) return fail(fmt::format("--persist-interval {}: must be 0 or more seconds", r.persist_interval));
  o.persist_interval = from_seconds(r.persist_interval);
  for (const auto& d : kPositiveDurations) o.*d.option = from_seconds(r.*d.seconds);
  o.term_grace = from_seconds(r.term_grace);
  o.agent_relay = !r.no_agent_relay;
  o.host_commits = !r.no_host_commits;
  if (r.heartbeat_timeout < 2) {
    return fail(fmt::format("--heartbeat-timeout {}: must be at least 2 seconds (heartbeats go every second)",
                            r.heartbeat_timeout));
  }
  return std::nullopt;
}

// Counts that must be at least 1 (or 0) when given.
Check check_counts(const DriverOptions& o, const po::variables_map& vm) {
  if (o.crash_loop_limit < 0) return fail("--crash-loop-limit must be 0 (off) or more");
  if (vm.count("metrics-port") && (o.metrics_port < 0 || o.metrics_port > 65535)) {
    return fail(fmt::format("--metrics-port {}: not a port number (0 to 65535; 0: any free port)", o.metrics_port));
  }
  if (vm.count("standby") && o.standby < 0) {
    return fail(fmt::format("--standby {}: must be 0 (none) or more", o.standby));
  }
  if (vm.count("metrics-addr") && !vm.count("metrics-port")) {
    return fail("--metrics-addr needs --metrics-port: give the port to serve /metrics on");
  }
  if (vm.count("np") && o.np < 1) return fail(fmt::format("-np {}: must be at least 1", o.np));
  if (vm.count("min-np") && o.min_np < 1) return fail(fmt::format("--min-np {}: must be at least 1", o.min_np));
  if (o.commit_replicas < 0) {
    return fail(fmt::format("--commit-replicas {}: must be 0 or more (0: no replicas)", o.commit_replicas));
  }
  if (vm.count("max-np") && o.max_np < 1) return fail(fmt::format("--max-np {}: must be at least 1", o.max_np));
  if (vm.count("slots-per-host") && o.slots_per_host < 1) {
    return fail(fmt::format("--slots-per-host {}: must be at least 1", o.slots_per_host));
  }
  return std::nullopt;
}

// One host source at most; Slurm when inside an allocation and none is given.
Check resolve_host_source(DriverOptions& o, const CliContext& context) {
  int sources = !o.discovery_script.empty() + !o.hosts.empty() + !o.hostfile.empty();
  if (sources > 1) return fail("give only one of -H/--hosts, --hostfile and --host-discovery-script");
  if (o.slurm && (!o.hosts.empty() || !o.hostfile.empty())) {
    return fail("--slurm takes the hosts from the allocation: drop -H/--hosts/--hostfile, or drop --slurm");
  }
  if (context.in_slurm_allocation && sources == 0) o.slurm = true;
  if (!o.slurm_grow.empty() && (!o.slurm || !context.in_slurm_allocation)) {
    return fail("--slurm-grow " + o.slurm_grow +
                " grows a job of a Slurm allocation: run erun --slurm inside salloc or sbatch");
  }
  return std::nullopt;
}

// Elastic or not, and -np/--min-np/--max-np filled in and consistent.
Check resolve_world_size(DriverOptions& o, const po::variables_map& vm) {
  o.elastic = !o.discovery_script.empty() || vm.count("min-np") || vm.count("max-np");
  if (!o.elastic && !vm.count("np") && o.hosts.empty() && o.hostfile.empty() && !o.slurm) {
    return fail("say how many workers to run: -np N (or give hosts with -H/--hostfile)");
  }
  if (o.elastic) {
    if (!vm.count("np")) {
      if (vm.count("min-np")) o.np = o.min_np;
      else return fail("an elastic job needs -np N (the workers to start with), e.g. -np 4 --min-np 2");
    }
    if (!vm.count("min-np")) o.min_np = o.np;
    if (!vm.count("max-np")) o.max_np = o.np;
  } else {
    o.min_np = o.max_np = o.np;
  }
  if (o.np > 0 && o.min_np > o.np) {
    return fail(fmt::format("--min-np {} is larger than -np {}: lower --min-np or raise -np", o.min_np, o.np));
  }
  if (o.np > 0 && o.max_np < o.np) {
    return fail(fmt::format("--max-np {} is smaller than -np {}: raise --max-np or lower -np", o.max_np, o.np));
  }
  if (!o.slurm_grow.empty() && !vm.count("max-np")) {
    return fail("--slurm-grow " + o.slurm_grow + ": give --max-np, the size the job may grow to");
  }
  return std::nullopt;
}

// --reset-limit's default and the blacklist.
Check resolve_failure_policy(DriverOptions& o, const RawFlags& r, const po::variables_map& vm) {
  if (!vm.count("reset-limit")) o.reset_limit = o.elastic ? -1 : 0;
  else if (o.reset_limit < 0) return fail("--reset-limit must be 0 or more");
  if (vm.count("blacklist-cooldown-range")) {
    if (r.cooldown.size() != 2 || r.cooldown[0] < 0 || r.cooldown[1] < r.cooldown[0]) {
      return fail("--blacklist-cooldown-range takes two numbers MIN MAX with 0 <= MIN <= MAX (seconds)");
    }
    o.cooldown_min_s = r.cooldown[0];
    o.cooldown_max_s = r.cooldown[1];
  }
  if (o.blacklist_after < 1) return fail("--blacklist-after must be at least 1");
  return std::nullopt;
}

// horovodrun's log level names (any case) as erun's: TRACE is debug, FATAL error.
std::string horovod_log_level(const std::string& name) {
  std::string lower;
  for (char c : name) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "trace") return "debug";
  if (lower == "fatal") return "error";
  return lower;
}

// --tag-output and the log level.
Check resolve_output(DriverOptions& o, const RawFlags& r) {
  if (r.tag && r.no_tag) return fail("--tag-output and --no-tag-output contradict each other: give one");
  o.tag_output = !r.no_tag;
  if (r.log_level.empty()) {
    o.log_level = log_level_from_env(LogLevel::kWarn);
  } else if (auto level = parse_log_level(horovod_log_level(r.log_level))) {
    o.log_level = *level;
  } else {
    return fail("--log-level " + r.log_level + ": expected error, warn, info or debug (or horovodrun's "
                "TRACE, DEBUG, INFO, WARNING, ERROR, FATAL)");
  }
  if (o.verbose) o.log_level = LogLevel::kDebug;
  return std::nullopt;
}

// --launcher and --mode by name, and what mpirun cannot do.
Check resolve_launcher(DriverOptions& o, const RawFlags& r) {
  static const std::map<std::string, LauncherKind> launchers = {
      {"auto", LauncherKind::kAuto}, {"local", LauncherKind::kLocal}, {"ssh", LauncherKind::kSsh},
      {"srun", LauncherKind::kSrun}, {"mpirun", LauncherKind::kMpirun}};
  static const std::map<std::string, WorkerMode> modes = {
      {"auto", WorkerMode::kAuto}, {"elastic", WorkerMode::kElastic}, {"restart", WorkerMode::kRestart}};
  auto launcher = launchers.find(r.launcher);
  if (launcher == launchers.end()) {
    return fail(fmt::format(
        "--launcher {}: expected auto, local or ssh, or srun or mpirun for Slurm and MPI jobs", r.launcher));
  }
  o.launcher = launcher->second;
  if (o.launcher == LauncherKind::kMpirun && o.elastic) {
    return fail("--launcher mpirun runs a static job: drop --min-np/--max-np/--host-discovery-script, "
                "or use another launcher for an elastic job");
  }
  if (o.launcher == LauncherKind::kMpirun && r.mode == "restart") {
    return fail("--launcher mpirun and --mode restart contradict each other: mpirun starts the job once");
  }
  auto mode = modes.find(r.mode);
  if (mode == modes.end()) return fail(fmt::format("--mode {}: expected auto, elastic or restart", r.mode));
  o.mode = mode->second;
  static const std::map<std::string, StragglerPolicy> policies = {
      {"evict", StragglerPolicy::kEvict}, {"report", StragglerPolicy::kReport}, {"off", StragglerPolicy::kOff}};
  auto policy = policies.find(r.stragglers);
  if (policy == policies.end()) {
    return fail(fmt::format("--stragglers {}: expected evict, report or off", r.stragglers));
  }
  o.stragglers = policy->second;
  if (r.preflight != "on" && r.preflight != "off") {
    return fail(fmt::format("--preflight {}: expected on or off", r.preflight));
  }
  o.preflight = r.preflight == "on";
  if (!(o.straggler_factor > 1)) {
    return fail(fmt::format("--straggler-factor {}: must be more than 1 (1.5: half again as slow as the others)",
                            o.straggler_factor));
  }
  if (o.straggler_window < 1) {
    return fail(fmt::format("--straggler-window {}: must be 1 or more commit intervals", o.straggler_window));
  }
  return std::nullopt;
}

// --ssh-port in range and every -x a variable name.
Check check_ssh_and_env(const DriverOptions& o, const po::variables_map& vm) {
  if (vm.count("ssh-port") && (o.ssh_port < 1 || o.ssh_port > 65535)) {
    return fail(fmt::format("--ssh-port {}: expected 1-65535", o.ssh_port));
  }
  for (auto& e : o.env) {
    auto name = e.substr(0, e.find('='));
    bool ok = !name.empty() && (std::isalpha(static_cast<unsigned char>(name[0])) || name[0] == '_');
    for (char c : name) ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_');
    if (!ok) return fail(fmt::format("-x {}: not a variable name (expected NAME or NAME=VALUE)", e));
  }
  return std::nullopt;
}

}  // namespace

std::variant<DriverOptions, CliError, CliInfo> parse_cli(int argc, const char* const argv[],
                                                         const CliContext& context) {
  Words words = split_words(argc, argv);
  DriverOptions o;
  RawFlags raw;
  po::options_description desc("Options");
  add_host_flags(desc, o, raw);
  add_elasticity_flags(desc, o, raw);
  add_launcher_flags(desc, o, raw);
  add_output_flags(desc, o, raw);
  add_worker_flags(desc, o, raw);
  add_general_flags(desc, o, raw);
  po::options_description horovodrun("horovodrun's flags (for horovodrun command lines; see docs/horovod.md)");
  po::options_description ignored;  // parsed, left out of --help's table
  add_horovodrun_flags(horovodrun, ignored, raw);
  desc.add(horovodrun);
  po::options_description parsed;
  parsed.add(desc).add(ignored);

  po::variables_map vm;
  try {
    std::vector<const char*> args = {"erun"};
    for (auto& w : words.own) args.push_back(w.c_str());
    po::store(po::command_line_parser(static_cast<int>(args.size()), args.data())
                  .options(parsed)
                  .style(po::command_line_style::unix_style)
                  .run(),
              vm);
    po::notify(vm);
  } catch (const po::error& e) {
    return CliError{fmt::format("{} (see erun --help)", e.what())};
  }
  if (vm.count("help")) return CliInfo{usage_text(desc) + ignored_flags_text()};
  if (vm.count("version")) return CliInfo{fmt::format("erun {}\n", ERUN_VERSION)};
  if (vm.count("check-build")) return CliInfo{check_build_text()};
  if (words.command.empty()) {
    return CliError{"no command to run: give the program after the options, e.g. erun -np 4 ./train"};
  }
  o.command = words.command;

  if (Check c = resolve_horovodrun_flags(o, raw, vm)) return *c;
  if (Check c = apply_durations(o, raw)) return *c;
  if (Check c = check_counts(o, vm)) return *c;
  if (Check c = resolve_host_source(o, context)) return *c;
  if (Check c = resolve_world_size(o, vm)) return *c;
  if (Check c = resolve_failure_policy(o, raw, vm)) return *c;
  if (Check c = resolve_output(o, raw)) return *c;
  if (Check c = resolve_launcher(o, raw)) return *c;
  if (Check c = check_ssh_and_env(o, vm)) return *c;
  return o;
}

}  // namespace erun
