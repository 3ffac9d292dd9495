#include <fmt/format.h>

#include "runner/launcher.h"
#include "runner/worker_wrapper.h"

namespace erun {

namespace {

class LocalLauncher final : public Launcher {
 public:
  Result<std::unique_ptr<WorkerHandle>> launch(const WorkerSpec& spec) override {
    using R = Result<std::unique_ptr<WorkerHandle>>;
    if (Status s = validate_worker_spec(spec); !s) return R(s);
    SpawnOptions options;
    options.argv = command_line(spec);
    options.pipe_stdin = true;
    options.pipe_stdout = true;
    options.pipe_stderr = true;
    options.new_process_group = true;
    auto process = Subprocess::spawn(options);
    if (!process) {
      return R::error(fmt::format("rank {} on {}: {}", spec.rank, spec.host, process.message()));
    }
    Subprocess p = std::move(process).value();
    std::string what = fmt::format("rank {} on {}", spec.rank, spec.host);
    if (Status s = SupervisedWorker::start_control(p, spec.secret, what); !s) return R(s);
    return std::unique_ptr<WorkerHandle>(new SupervisedWorker(std::move(p), /*local=*/true));
  }

  std::vector<std::string> command_line(const WorkerSpec& spec) const override {
    return {"/bin/sh", "-c", worker_script(spec)};
  }
};

}  // namespace

std::unique_ptr<Launcher> make_local_launcher() { return std::make_unique<LocalLauncher>(); }

}  // namespace erun
