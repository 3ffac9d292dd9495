#include "runner/launch/fake_launcher.h"

#include <signal.h>

namespace erun {
namespace {

class FakeHandle final : public WorkerHandle {
 public:
  FakeHandle(std::shared_ptr<FakeLauncher::Worker> w, const bool& obey, const bool& obey_kill)
      : w_(std::move(w)), obey_(obey), obey_kill_(obey_kill) {}
  ~FakeHandle() override {
    if (!w_->exit) w_->exit = ExitStatus{0, SIGKILL};
  }
  std::optional<ExitStatus> poll() override { return w_->exit; }
  void terminate() override {
    w_->terminated = true;
    ++w_->terminate_calls;
    if (obey_ && !w_->exit) w_->exit = ExitStatus{0, SIGTERM};
  }
  void kill() override {
    w_->terminated = true;
    w_->killed = true;
    if (obey_kill_ && !w_->exit) w_->exit = ExitStatus{0, SIGKILL};
  }
  void signal(int sig) override { w_->signals.push_back(sig); }
  int take_stdout() override { return -1; }
  int take_stderr() override { return -1; }
  long pid() const override { return 0; }
  std::optional<std::vector<std::string>> exit_stderr() const override { return w_->exit_stderr; }
  TimePoint exited_at() const override { return w_->exited_at; }
  bool host_unreachable() const override { return w_->host_unreachable; }

 private:
  std::shared_ptr<FakeLauncher::Worker> w_;
  const bool& obey_;
  const bool& obey_kill_;
};

}  // namespace

Result<std::unique_ptr<WorkerHandle>> FakeLauncher::launch(const WorkerSpec& spec) {
  if (failing_hosts_.count(spec.host)) {
    return Result<std::unique_ptr<WorkerHandle>>::error("fake launch failure on " + spec.host);
  }
  auto w = std::make_shared<Worker>();
  w->spec = spec;
  workers_.push_back(w);
  return std::unique_ptr<WorkerHandle>(std::make_unique<FakeHandle>(w, obey_terminate_, obey_kill_));
}

std::vector<std::string> FakeLauncher::command_line(const WorkerSpec& spec) const {
  std::vector<std::string> out = {"fake", spec.host};
  out.insert(out.end(), spec.command.begin(), spec.command.end());
  return out;
}

std::vector<std::shared_ptr<FakeLauncher::Worker>> FakeLauncher::running() const {
  std::vector<std::shared_ptr<Worker>> out;
  for (auto& w : workers_) {
    if (!w->exit) out.push_back(w);
  }
  return out;
}

std::shared_ptr<FakeLauncher::Worker> FakeLauncher::running_rank(int rank) const {
  std::shared_ptr<Worker> best;
  for (auto& w : workers_) {
    if (!w->exit && w->spec.rank == rank && (!best || w->spec.generation > best->spec.generation)) best = w;
  }
  return best;
}

}  // namespace erun
