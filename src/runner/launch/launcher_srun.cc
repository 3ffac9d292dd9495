#include "runner/launch/launcher_srun.h"

#include <fmt/format.h>

#include "common/strings.h"
#include "runner/launch/launcher_agent.h"

namespace erun {

std::unique_ptr<Launcher> make_srun_launcher(SrunOptions options, AgentLaunchOptions agent) {
  auto command = [options](const std::string& host, const std::vector<std::string>& agent_args) {
    // One step per node, holding that node's agent; --input=0 gives the
    // step's single task erun's pipe as stdin (the agent's channel).
    std::vector<std::string> argv = {options.srun,
                                     "--overlap",
                                     "--nodes=1",
                                     "--ntasks=1",
                                     "--nodelist=" + host,
                                     "--kill-on-bad-exit=1",
                                     "--input=0",
                                     "--unbuffered",  // frames, not lines: no line buffering in srun
                                     "--quiet",
                                     "--job-name=erun-agent-" + host};
    if (options.job_of) {
      if (std::string job = options.job_of(host); !job.empty()) argv.push_back("--jobid=" + job);
    }
    argv.insert(argv.end(), options.extra_options.begin(), options.extra_options.end());
    for (auto& a : agent_args) argv.push_back(a);
    return argv;
  };
  return std::make_unique<AgentLauncher>(command, agent, "srun",
                                         "is srun in PATH? --launcher srun needs a Slurm allocation");
}

std::vector<std::string> mpirun_command(const DriverOptions& o, const HostSet& hosts,
                                        const std::vector<std::string>& env) {
  int np = o.np > 0 ? o.np : hosts.total_slots();
  std::vector<std::string> argv = {"mpirun", "--allow-run-as-root", "--oversubscribe", "-np", std::to_string(np)};
  if (!hosts.empty()) {
    std::vector<std::string> h;
    for (const auto& host : hosts.hosts()) h.push_back(fmt::format("{}:{}", host.name, host.slots));
    argv.push_back("-H");
    argv.push_back(join(h, ","));
  }
  for (const auto& e : env) {
    argv.push_back("-x");
    argv.push_back(e);
  }
  argv.insert(argv.end(), o.command.begin(), o.command.end());
  return argv;
}

}  // namespace erun
