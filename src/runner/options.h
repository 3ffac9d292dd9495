// DriverOptions: everything the driver is told, built once from the command
// line in main (see cli.h) and passed down by value. Nothing inside the driver
// reads the environment or argv again.
#pragma once

#include <string>
#include <vector>

#include "common/clock.h"
#include "common/log.h"

namespace erun {

// kSrun: a Slurm job step per node (its agent); kMpirun: erun execs mpirun (static, no driver).
enum class LauncherKind { kAuto, kLocal, kSsh, kSrun, kMpirun };
enum class WorkerMode { kAuto, kElastic, kRestart };
// --stragglers: what the driver does with a rank that holds the job back.
enum class StragglerPolicy { kEvict, kReport, kOff };

struct DriverOptions {
  int np = 0;      // -np: the number of workers to start with (0: all available slots)
  int min_np = 0;  // smallest world the job may run with
  int max_np = 0;  // largest world the job may grow to
  bool elastic = false;  // discovery script or --min-np/--max-np given

  std::string discovery_script;
  Duration discovery_interval = std::chrono::seconds(1);
  Duration discovery_timeout = std::chrono::seconds(30);
  std::string hosts;     // -H
  std::string hostfile;  // --hostfile
  int slots_per_host = 0;  // 0: not given
  // Hosts from the Slurm allocation (--slurm, or SLURM_JOB_ID set and no other
  // host source); with a discovery script, the script stays the source.
  bool slurm = false;
  // --slurm-grow PARTITION: placeholder jobs there lend the job idle nodes
  // up to --max-np (runner/hosts/slurm_grow.h); "" none.
  std::string slurm_grow;

  Duration elastic_timeout = std::chrono::seconds(600);
  int reset_limit = -1;  // -1: unlimited
  // --stragglers, --straggler-factor, --straggler-window (runner/policies/stragglers.h).
  StragglerPolicy stragglers = StragglerPolicy::kEvict;
  double straggler_factor = 1.5;
  int straggler_window = 3;
  // --preflight on|off: a new host's worker is held back when its pre-flight
  // compute check is far slower than the job's workers'.
  bool preflight = true;
  // --standby N: standby workers on free slots (-1: 1 when a slot is free; 0: none).
  int standby = -1;
  double cooldown_min_s = 10;
  double cooldown_max_s = 300;
  int blacklist_after = 2;  // consecutive failures of a host before it is blacklisted
  // Generations in a row failing the same way everywhere before the job ends
  // (see runner/policies/crash_loop.h); 0: never. A failure after crash_loop_progress
  // of running counts as progress.
  int crash_loop_limit = 3;
  Duration crash_loop_progress = std::chrono::seconds(60);

  LauncherKind launcher = LauncherKind::kAuto;
  WorkerMode mode = WorkerMode::kAuto;
  int ssh_port = 0;
  std::string ssh_identity_file;
  Duration ssh_connect_timeout = std::chrono::seconds(10);
  std::vector<std::string> ssh_options;  // --ssh-option, in order
  std::string agent_path;                // --agent-path (empty: erun's own executable)
  Duration heartbeat_timeout = std::chrono::seconds(5);
  // --driver-grace: how long agents keep their workers running once erun is
  // gone without a stop order (SIGKILL, a dropped connection, SIGHUP), for a
  // new erun to take the job over; 0: the workers stop with erun.
  Duration driver_grace = std::chrono::seconds(60);
  // --drain-timeout: a host that leaves on notice (SIGTERM to its agent or
  // workers, a `draining` discovery line) gets this long for its workers to
  // leave at a commit; after it they are stopped as a failure. 0: a SIGTERM
  // stops them at once, as a failure (the behaviour before draining).
  Duration drain_timeout = std::chrono::seconds(20);
  std::string job_name;  // --job-name (empty: from the user, directory and command)
  bool agent_relay = true;               // false: --no-agent-relay (workers connect to the driver themselves)
  std::vector<std::string> env;  // -x NAME or NAME=VALUE

  std::string output_dir;
  bool tag_output = true;
  std::string event_log;
  bool no_status = false;          // --no-status
  int metrics_port = -1;           // --metrics-port (-1: no metrics)
  std::string metrics_addr = "127.0.0.1";
  bool dry_run = false;
  bool verbose = false;             // -v: log_level debug
  // One line each about flags accepted without effect (horovodrun's tuning
  // flags); main prints them as notes.
  std::vector<std::string> notes;
  LogLevel log_level = LogLevel::kWarn;  // --log-level, else $ERUN_LOG_LEVEL, else warn

  Duration term_grace = std::chrono::seconds(5);       // SIGTERM -> SIGKILL
  Duration finish_timeout = std::chrono::seconds(60);  // after the first worker succeeded
  Duration rendezvous_timeout = std::chrono::seconds(60);
  Duration collective_timeout = std::chrono::seconds(30);
  std::string driver_address;  // address workers reach the driver at (empty: detect)
  std::string checkpoint_dir;
  // How often each host's agent writes the newest host-memory commit to
  // checkpoint_dir in the background (--persist-interval).
  Duration persist_interval = std::chrono::seconds(5);
  // Every commit also goes to the job's directory in each host's /dev/shm
  // (docs/state.md, "Where a commit lives"); false: --no-host-commits.
  bool host_commits = true;
  // Hosts beyond the one that made it that hold each commit in memory
  // (--commit-replicas): spare hosts keep replicas when the plan's own hosts
  // are fewer (docs/state.md, "Replicas on spare hosts"). 0: none.
  int commit_replicas = 1;

  std::vector<std::string> command;
};

}  // namespace erun
