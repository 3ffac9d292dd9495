#include "runner/launcher_srun.h"

#include <fmt/format.h>

#include "common/strings.h"
#include "runner/worker_wrapper.h"

namespace erun {
namespace {

class SrunLauncher final : public Launcher {
 public:
  explicit SrunLauncher(SrunOptions options) : options_(std::move(options)) {}

  Result<std::unique_ptr<WorkerHandle>> launch(const WorkerSpec& spec) override {
    using R = Result<std::unique_ptr<WorkerHandle>>;
    if (Status s = validate_worker_spec(spec); !s) return R(s);
    if (spec.host.empty() || spec.host[0] == '-') {
      return R::error(fmt::format("rank {}: '{}' is not a Slurm node name", spec.rank, spec.host));
    }
    return launch_through(spec, command_line(spec), "srun", "is srun in PATH? --launcher srun needs a Slurm allocation");
  }

  std::vector<std::string> command_line(const WorkerSpec& spec) const override {
    std::vector<std::string> argv = {options_.srun,
                                     "--overlap",
                                     "--nodes=1",
                                     "--ntasks=1",
                                     "--nodelist=" + spec.host,
                                     "--kill-on-bad-exit=1",
                                     "--input=0",
                                     "--quiet",
                                     fmt::format("--job-name=erun-g{}-r{}", spec.generation, spec.rank)};
    argv.insert(argv.end(), options_.extra_options.begin(), options_.extra_options.end());
    argv.insert(argv.end(), {"/bin/sh", "-c", worker_script(spec)});
    return argv;
  }

 private:
  SrunOptions options_;
};

}  // namespace

std::unique_ptr<Launcher> make_srun_launcher(SrunOptions options) {
  return std::make_unique<SrunLauncher>(std::move(options));
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
