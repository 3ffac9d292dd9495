#include "runner/cli.h"

#include <boost/program_options.hpp>
#include <fmt/format.h>

#include <map>
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
      {"-H", 1}, {"--hosts", 1}, {"--hostfile", 1}, {"--slots-per-host", 1}, {"--slots", 1},
      {"--elastic-timeout", 1}, {"--reset-limit", 1}, {"--blacklist-cooldown-range", 2},
      {"--blacklist-after", 1}, {"--crash-loop-limit", 1}, {"--ssh-port", 1}, {"-p", 1}, {"--ssh-identity-file", 1},
      {"-i", 1}, {"--ssh-connect-timeout", 1}, {"-x", 1}, {"--env", 1},
      {"--output-filename", 1}, {"--event-log", 1}, {"--launcher", 1}, {"--mode", 1},
      {"--term-grace", 1}, {"--finish-timeout", 1}, {"--rendezvous-timeout", 1},
      {"--collective-timeout", 1}, {"--driver-address", 1}, {"--checkpoint-dir", 1},
      {"--ssh-option", 1}, {"--agent-path", 1}, {"--heartbeat-timeout", 1},
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
      << desc;
  return out.str();
}

Duration seconds_option(double v) { return from_seconds(v); }

}  // namespace

std::variant<DriverOptions, CliError, CliInfo> parse_cli(int argc, const char* const argv[],
                                                         const CliContext& context) {
  // Split erun's own words from the user's command.
  std::vector<std::string> own;
  std::vector<std::string> command;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      for (int j = i + 1; j < argc; ++j) command.emplace_back(argv[j]);
      break;
    }
    if (a.size() > 1 && a[0] == '-') {
      own.push_back(a);
      if (a.find('=') != std::string::npos) continue;
      auto it = option_arity().find(a);
      int n = it == option_arity().end() ? 0 : it->second;
      for (int k = 0; k < n && i + 1 < argc; ++k) own.emplace_back(argv[++i]);
      continue;
    }
    for (int j = i; j < argc; ++j) command.emplace_back(argv[j]);
    break;
  }
  // mpirun's -np is one word with one dash; program_options wants --np.
  for (auto& w : own) {
    if (w == "-np") w = "--np";
    else if (starts_with(w, "-np=")) w = "--np=" + w.substr(4);
  }

  DriverOptions o;
  double discovery_interval = 1, discovery_timeout = 30, elastic_timeout = 600;
  double term_grace = 5, finish_timeout = 60, rdzv_timeout = 60, coll_timeout = 30, ssh_timeout = 10;
  bool no_agent_relay = false;
  double heartbeat_timeout = 5;
  std::vector<double> cooldown;
  std::string launcher = "auto", mode = "auto";
  bool no_tag = false, tag = false;

  po::options_description desc("Options");
  // clang-format off
  desc.add_options()
    ("np,n", po::value<int>(&o.np), "number of workers to start (-np N as with mpirun/horovodrun)")
    ("min-np", po::value<int>(&o.min_np), "smallest number of workers the job runs with (elastic)")
    ("max-np", po::value<int>(&o.max_np), "largest number of workers the job grows to (elastic)")
    ("host-discovery-script", po::value<std::string>(&o.discovery_script), "script printing one host[:slots] per line; run every --discovery-interval")
    ("discovery-interval", po::value<double>(&discovery_interval), "seconds between discoveries (default 1)")
    ("discovery-timeout", po::value<double>(&discovery_timeout), "seconds a discovery script may run (default 30)")
    ("hosts,H", po::value<std::string>(&o.hosts), "hosts and slots, e.g. a:4,b:4")
    ("hostfile", po::value<std::string>(&o.hostfile), "file with one 'host:slots' or 'host slots=N' per line")
    ("slots-per-host", po::value<int>(&o.slots_per_host), "slots of a host given without a count (with --slurm: of every node)")
    ("slurm", po::bool_switch(&o.slurm), "hosts and slots from the Slurm allocation (SLURM_JOB_NODELIST, SLURM_TASKS_PER_NODE); default when SLURM_JOB_ID is set and no hosts are given; with --host-discovery-script the script's output is used (e.g. to drop drained nodes)")
    ("elastic-timeout", po::value<double>(&elastic_timeout), "seconds to wait for --min-np slots (default 600)")
    ("reset-limit", po::value<int>(&o.reset_limit), "resets (restarts or resizes) allowed before the job fails (default: unlimited when elastic, 0 otherwise)")
    ("blacklist-cooldown-range", po::value<std::vector<double>>(&cooldown)->multitoken(), "MIN MAX seconds a failing host stays blacklisted, doubling per blacklisting (default 10 300)")
    ("blacklist-after", po::value<int>(&o.blacklist_after), "consecutive failures before a host is blacklisted (default 2)")
    ("crash-loop-limit", po::value<int>(&o.crash_loop_limit), "end the job when this many generations in a row fail with the same exit status on every host, each within 60 s and before any commit or finished worker (default 3; 0: never)")
    ("launcher", po::value<std::string>(&launcher), "auto (local for this machine; srun under --slurm, ssh otherwise), local, ssh, srun (a Slurm job step per node), mpirun (static: erun execs mpirun with the hosts and -x variables; no driver, not elastic)")
    ("mode", po::value<std::string>(&mode), "auto, elastic (workers use the erun library) or restart (any program, torchrun-style)")
    ("ssh-port,p", po::value<int>(&o.ssh_port), "SSH port of the hosts")
    ("ssh-identity-file,i", po::value<std::string>(&o.ssh_identity_file), "SSH private key")
    ("ssh-connect-timeout", po::value<double>(&ssh_timeout), "seconds for an SSH connection (default 10)")
    ("ssh-option", po::value<std::vector<std::string>>(&o.ssh_options), "more ssh options, repeatable: Key=Value (as -o Key=Value) or a raw flag; e.g. --ssh-option StrictHostKeyChecking=no --ssh-option UserKnownHostsFile=/dev/null turns host-key checking off (throwaway clusters only)")
    ("agent-path", po::value<std::string>(&o.agent_path), "the erun binary that runs the per-host agent on every host (default: this erun's own path)")
    ("heartbeat-timeout", po::value<double>(&heartbeat_timeout), "seconds a host's agent (or the driver, seen from the agent) may be silent before it is declared lost (default 5; heartbeats every 1 s)")
    ("env,x", po::value<std::vector<std::string>>(&o.env), "NAME or NAME=VALUE to set for the workers (repeatable)")
    ("output-filename", po::value<std::string>(&o.output_dir), "directory for per-rank stdout/stderr files (DIR/rank.N/)")
    ("tag-output", po::bool_switch(&tag), "prefix worker lines with [rank]<stdout>: (default)")
    ("no-tag-output", po::bool_switch(&no_tag), "forward worker lines without prefixes")
    ("event-log", po::value<std::string>(&o.event_log), "append the job's events as JSON lines to this file")
    ("term-grace", po::value<double>(&term_grace), "seconds between SIGTERM and SIGKILL when stopping workers (default 5)")
    ("finish-timeout", po::value<double>(&finish_timeout), "seconds the others may take to finish after one worker succeeded (default 60)")
    ("rendezvous-timeout", po::value<double>(&rdzv_timeout), "seconds a worker may take to (re-)join a generation (default 60)")
    ("collective-timeout", po::value<double>(&coll_timeout), "seconds a collective may block before it fails (default 30)")
    ("driver-address", po::value<std::string>(&o.driver_address), "address workers use to reach this driver (default: detected)")
    ("checkpoint-dir", po::value<std::string>(&o.checkpoint_dir), "directory for durable commits of elastic state")
    ("no-agent-relay", po::bool_switch(&no_agent_relay), "workers connect to the driver's rendezvous themselves, one TCP connection each, instead of through their host's agent (one connection per host)")
    ("dry-run", po::bool_switch(&o.dry_run), "print the plan, each host's agent command and each rank's program, environment and directory; launch nothing")
    ("verbose,v", po::bool_switch(&o.verbose), "debug logging")
    ("version", "print the version")
    ("help,h", "print this help");
  // clang-format on

  po::variables_map vm;
  try {
    std::vector<const char*> words = {"erun"};
    for (auto& w : own) words.push_back(w.c_str());
    po::store(po::command_line_parser(static_cast<int>(words.size()), words.data())
                  .options(desc)
                  .style(po::command_line_style::unix_style)
                  .run(),
              vm);
    po::notify(vm);
  } catch (const po::error& e) {
    return CliError{fmt::format("{} (see erun --help)", e.what())};
  }
  if (vm.count("help")) return CliInfo{usage_text(desc)};
  if (vm.count("version")) return CliInfo{fmt::format("erun {}\n", ERUN_VERSION)};

  if (command.empty()) {
    return CliError{"no command to run: give the program after the options, e.g. erun -np 4 ./train"};
  }
  o.command = command;

  auto positive = [](double v) { return v > 0; };
  struct {
    const char* name;
    double value;
  } durations[] = {{"--discovery-interval", discovery_interval}, {"--discovery-timeout", discovery_timeout},
                   {"--elastic-timeout", elastic_timeout},       {"--finish-timeout", finish_timeout},
                   {"--rendezvous-timeout", rdzv_timeout},      {"--collective-timeout", coll_timeout},
                   {"--ssh-connect-timeout", ssh_timeout},      {"--heartbeat-timeout", heartbeat_timeout}};
  for (auto& d : durations) {
    if (!positive(d.value)) {
      return CliError{fmt::format("{} {}: must be a positive number of seconds", d.name, d.value)};
    }
  }
  if (term_grace < 0) return CliError{"--term-grace must be 0 or more seconds"};
  o.discovery_interval = seconds_option(discovery_interval);
  o.discovery_timeout = seconds_option(discovery_timeout);
  o.elastic_timeout = seconds_option(elastic_timeout);
  o.term_grace = seconds_option(term_grace);
  o.finish_timeout = seconds_option(finish_timeout);
  o.rendezvous_timeout = seconds_option(rdzv_timeout);
  o.collective_timeout = seconds_option(coll_timeout);
  o.ssh_connect_timeout = seconds_option(ssh_timeout);
  o.agent_relay = !no_agent_relay;
  o.heartbeat_timeout = seconds_option(heartbeat_timeout);
  if (heartbeat_timeout < 2) {
    return CliError{fmt::format("--heartbeat-timeout {}: must be at least 2 seconds (heartbeats go every second)",
                                heartbeat_timeout)};
  }

  if (o.crash_loop_limit < 0) return CliError{"--crash-loop-limit must be 0 (off) or more"};
  if (vm.count("np") && o.np < 1) return CliError{fmt::format("-np {}: must be at least 1", o.np)};
  if (vm.count("min-np") && o.min_np < 1) return CliError{fmt::format("--min-np {}: must be at least 1", o.min_np)};
  if (vm.count("max-np") && o.max_np < 1) return CliError{fmt::format("--max-np {}: must be at least 1", o.max_np)};
  if (vm.count("slots-per-host") && o.slots_per_host < 1) {
    return CliError{fmt::format("--slots-per-host {}: must be at least 1", o.slots_per_host)};
  }
  int sources = !o.discovery_script.empty() + !o.hosts.empty() + !o.hostfile.empty();
  if (sources > 1) {
    return CliError{"give only one of -H/--hosts, --hostfile and --host-discovery-script"};
  }
  if (o.slurm && (!o.hosts.empty() || !o.hostfile.empty())) {
    return CliError{"--slurm takes the hosts from the allocation: drop -H/--hosts/--hostfile, or drop --slurm"};
  }
  if (context.in_slurm_allocation && sources == 0) o.slurm = true;
  o.elastic = !o.discovery_script.empty() || vm.count("min-np") || vm.count("max-np");
  if (!o.elastic && !vm.count("np") && o.hosts.empty() && o.hostfile.empty() && !o.slurm) {
    return CliError{"say how many workers to run: -np N (or give hosts with -H/--hostfile)"};
  }
  if (o.elastic) {
    if (!vm.count("np")) {
      if (vm.count("min-np")) o.np = o.min_np;
      else return CliError{"an elastic job needs -np N (the workers to start with), e.g. -np 4 --min-np 2"};
    }
    if (!vm.count("min-np")) o.min_np = o.np;
    if (!vm.count("max-np")) o.max_np = o.np;
  } else {
    o.min_np = o.max_np = o.np;
  }
  if (o.np > 0 && o.min_np > o.np) {
    return CliError{fmt::format("--min-np {} is larger than -np {}: lower --min-np or raise -np", o.min_np, o.np)};
  }
  if (o.np > 0 && o.max_np < o.np) {
    return CliError{fmt::format("--max-np {} is smaller than -np {}: raise --max-np or lower -np", o.max_np, o.np)};
  }
  if (!vm.count("reset-limit")) o.reset_limit = o.elastic ? -1 : 0;
  else if (o.reset_limit < 0) return CliError{"--reset-limit must be 0 or more"};
  if (vm.count("blacklist-cooldown-range")) {
    if (cooldown.size() != 2 || cooldown[0] < 0 || cooldown[1] < cooldown[0]) {
      return CliError{"--blacklist-cooldown-range takes two numbers MIN MAX with 0 <= MIN <= MAX (seconds)"};
    }
    o.cooldown_min_s = cooldown[0];
    o.cooldown_max_s = cooldown[1];
  }
  if (o.blacklist_after < 1) return CliError{"--blacklist-after must be at least 1"};
  if (tag && no_tag) return CliError{"--tag-output and --no-tag-output contradict each other: give one"};
  o.tag_output = !no_tag;
  if (launcher == "auto") o.launcher = LauncherKind::kAuto;
  else if (launcher == "local") o.launcher = LauncherKind::kLocal;
  else if (launcher == "ssh") o.launcher = LauncherKind::kSsh;
  else if (launcher == "srun") o.launcher = LauncherKind::kSrun;
  else if (launcher == "mpirun") o.launcher = LauncherKind::kMpirun;
  else return CliError{fmt::format("--launcher {}: expected auto, local or ssh, or srun or mpirun for Slurm and MPI jobs", launcher)};
  if (o.launcher == LauncherKind::kMpirun && o.elastic) {
    return CliError{"--launcher mpirun runs a static job: drop --min-np/--max-np/--host-discovery-script, "
                    "or use another launcher for an elastic job"};
  }
  if (o.launcher == LauncherKind::kMpirun && mode == "restart") {
    return CliError{"--launcher mpirun and --mode restart contradict each other: mpirun starts the job once"};
  }
  if (mode == "auto") o.mode = WorkerMode::kAuto;
  else if (mode == "elastic") o.mode = WorkerMode::kElastic;
  else if (mode == "restart") o.mode = WorkerMode::kRestart;
  else return CliError{fmt::format("--mode {}: expected auto, elastic or restart", mode)};
  if (vm.count("ssh-port") && (o.ssh_port < 1 || o.ssh_port > 65535)) {
    return CliError{fmt::format("--ssh-port {}: expected 1-65535", o.ssh_port)};
  }
  for (auto& e : o.env) {
    auto name = e.substr(0, e.find('='));
    bool ok = !name.empty() && (std::isalpha(static_cast<unsigned char>(name[0])) || name[0] == '_');
    for (char c : name) ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_');
    if (!ok) return CliError{fmt::format("-x {}: not a variable name (expected NAME or NAME=VALUE)", e)};
  }
  return o;
}

}  // namespace erun
