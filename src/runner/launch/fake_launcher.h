// FakeLauncher: a Launcher for the driver's unit tests. launch() records the
// spec and returns a handle whose exit the test decides (finish()); no process
// is started. Driver thread only, like the real ones.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "runner/launch/launcher.h"

namespace erun {

class FakeLauncher final : public Launcher {
 public:
  struct Worker {
    WorkerSpec spec;
    std::optional<ExitStatus> exit;
    bool terminated = false;  // terminate() or kill() was called
    int terminate_calls = 0;  // how many times terminate() was called
    bool killed = false;      // kill() was called
    std::vector<int> signals;
    std::optional<std::vector<std::string>> exit_stderr;  // what its agent's EXITED would carry
    TimePoint exited_at = TimePoint::max();  // when the launcher learned of `exit`: max, not known
    bool host_unreachable = false;  // with `exit`: its host could not be reached at all
  };

  Result<std::unique_ptr<WorkerHandle>> launch(const WorkerSpec& spec) override;
  std::vector<std::string> command_line(const WorkerSpec& spec) const override;
  int free_port(const std::string&, const std::string&, Duration) override { return port_; }
  void set_free_port(int port) { port_ = port; }

  // Every launch so far, in order.
  const std::vector<std::shared_ptr<Worker>>& launched() const { return workers_; }
  // Workers launched and not yet exited.
  std::vector<std::shared_ptr<Worker>> running() const;
  // The running worker of a rank in the newest generation that has it.
  std::shared_ptr<Worker> running_rank(int rank) const;
  void finish(const std::shared_ptr<Worker>& w, ExitStatus status) { w->exit = status; }
  // Ends it, the launcher having learned of the end at `at`.
  void finish(const std::shared_ptr<Worker>& w, ExitStatus status, TimePoint at) {
    w->exit = status;
    w->exited_at = at;
  }
  // Ends it with the last stderr lines its agent reports.
  void finish(const std::shared_ptr<Worker>& w, ExitStatus status, std::vector<std::string> stderr_lines) {
    w->exit_stderr = std::move(stderr_lines);
    w->exit = status;
  }
  // Workers exit at once when terminated (default), or stay until finish().
  void set_obey_terminate(bool obey) { obey_terminate_ = obey; }
  // Workers exit at once when killed (default), or stay (a host that is gone).
  void set_obey_kill(bool obey) { obey_kill_ = obey; }
  // launch() fails for this host.
  void fail_launches_on(const std::string& host) { failing_hosts_.insert(host); }
  // The host's agent says DRAINING (take_drains() returns it once).
  void drain(const std::string& host, const std::string& reason) { drains_.emplace_back(host, reason); }
  std::vector<std::pair<std::string, std::string>> take_drains() override { return std::exchange(drains_, {}); }
  // Commit replicas: how many times each host was asked to KEEP (it never
  // answers: keeper_port() stays nullopt).
  bool keep(const std::string& host, const std::string&, const std::string&) override {
    ++kept_[host];
    return true;
  }
  std::optional<int> keeper_port(const std::string&) override { return std::nullopt; }
  const std::map<std::string, int>& kept() const { return kept_; }

 private:
  std::vector<std::shared_ptr<Worker>> workers_;
  std::set<std::string> failing_hosts_;
  std::vector<std::pair<std::string, std::string>> drains_;
  bool obey_terminate_ = true;
  bool obey_kill_ = true;
  int port_ = 4242;
  std::map<std::string, int> kept_;
};

}  // namespace erun
