#include "runner/launch/launchers.h"

#include "runner/hosts/slurm_grow.h"
#include "runner/launch/launcher_srun.h"

namespace erun {

Result<Launchers> make_launchers(const DriverOptions& options,
                                  const std::shared_ptr<SlurmGrow>& slurm_grow) {
  AgentLaunchOptions agent;
  agent.agent_path = options.agent_path.empty() ? own_executable() : options.agent_path;
  agent.heartbeat_timeout = options.heartbeat_timeout;
  agent.relay = options.agent_relay;
  agent.driver_grace = options.driver_grace;
  agent.drain_timeout = options.drain_timeout;
  agent.log_level = options.log_level;
  if (agent.agent_path.empty()) {
    return Result<Launchers>::error(
        "cannot find erun's own executable (/proc/self/exe): pass --agent-path PATH");
  }
  Launchers l;
  l.local = make_local_launcher(agent);
  if (options.launcher == LauncherKind::kSrun ||
      (options.launcher == LauncherKind::kAuto && options.slurm)) {
    SrunOptions srun;
    if (slurm_grow) {
      // A node lent by a placeholder: its agent is a step of that job.
      srun.job_of = [slurm_grow](const std::string& host) { return slurm_grow->job_of(host); };
    }
    l.remote = make_srun_launcher(srun, agent);
  } else {
    SshOptions ssh;
    ssh.port = options.ssh_port;
    ssh.identity_file = options.ssh_identity_file;
    ssh.connect_timeout = options.ssh_connect_timeout;
    ssh.extra_options = options.ssh_options;
    // The ssh connection is part of an agent's start; the local agent keeps the default.
    agent.start_timeout = options.ssh_connect_timeout + std::chrono::seconds(60);
    l.remote = make_ssh_launcher(ssh, agent);
  }
  return l;
}

Launcher& launcher_of(const DriverOptions& o, Launchers& l, const std::string& host) {
  bool local = o.launcher == LauncherKind::kLocal ||
               (o.launcher == LauncherKind::kAuto && is_local_host(host)) || !l.remote;
  return local ? *l.local : *l.remote;
}

}  // namespace erun
