// Launchers that hand workers to the cluster's own tools.
//  - make_srun_launcher(): one Slurm job step per node inside the current
//    allocation (`srun --overlap --nodes=1 --ntasks=1 --nodelist=HOST`),
//    running that node's erun agent; the agent's channel is srun's
//    stdin/stdout. A step that dies ends its agent (Slurm kills the task,
//    the agent sees EOF), and the agent's workers with it.
//  - mpirun_command(): the argv erun execs for `--launcher mpirun` (a static
//    job: no driver, no elasticity; mpirun owns the processes from then on).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "discovery/host_set.h"
#include "runner/launch/launcher.h"
#include "runner/options.h"

namespace erun {

struct SrunOptions {
  std::string srun = "srun";               // program, looked up in PATH
  std::vector<std::string> extra_options;  // more srun flags, before the command
  // The job a node's step joins when it is not erun's allocation (a
  // --slurm-grow placeholder's): "" for the allocation. Unset: always that.
  std::function<std::string(const std::string& host)> job_of;
};

std::unique_ptr<Launcher> make_srun_launcher(SrunOptions options, AgentLaunchOptions agent);

// `mpirun --allow-run-as-root --oversubscribe -np N -H h:s,... -x NAME=VALUE... COMMAND`;
// N is options.np, or every slot of `hosts` when it is 0. `env` holds NAME=VALUE words.
std::vector<std::string> mpirun_command(const DriverOptions& options, const HostSet& hosts,
                                        const std::vector<std::string>& env);

}  // namespace erun
