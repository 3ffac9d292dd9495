// AgentLauncher: the Launcher every real launch goes through. It keeps one
// agent connection per host (started on first use with the command the
// concrete launcher gives), sends START for each worker and proxies the
// handle's calls to that agent. One reader thread per connection handles the
// agent's frames (output into local pipes that the Output module reads,
// STARTED, EXITED), sends heartbeats, and declares the agent lost when its
// channel closes, a frame is malformed, or it is silent for the heartbeat
// timeout: every worker of that host then ends with exit code 255.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "runner/launch/launcher.h"

namespace erun {

class AgentConnection;
class AgentRetirer;

// What a launcher makes of one line that its transport (ssh) wrote to stderr
// for `host`: how to fix a failure it recognises, or nullopt.
using StderrHint = std::function<std::optional<std::string>(const std::string& host, std::string_view line)>;

// The argv that starts `host`'s agent process running `agent_args` (erun's
// own argv for an agent, or for `erun --agent --attach PATH`): the args
// themselves locally, wrapped in ssh or srun otherwise.
using AgentCommand =
    std::function<std::vector<std::string>(const std::string& host, const std::vector<std::string>& agent_args)>;

class AgentLauncher final : public Launcher {
 public:
  // `agent_command(host)`: the argv that starts the host's agent. `via` names
  // the transport in messages ("ssh"); `hint` says what to check when it
  // cannot be started. With `stderr_hint`, the agent's stderr comes through a
  // pipe: every byte is copied to erun's stderr, and the first line it
  // recognises becomes the fix that the host's failure reports (the log
  // line, and the lost workers' exit_stderr()); without, the agent writes to
  // erun's stderr itself.
  AgentLauncher(AgentCommand agent_command, AgentLaunchOptions options, std::string via, std::string hint, StderrHint stderr_hint = {});
  ~AgentLauncher() override;  // SHUTDOWN to every agent, bounded wait, then SIGKILL

  Result<std::unique_ptr<WorkerHandle>> launch(const WorkerSpec& spec) override;
  std::vector<std::string> command_line(const WorkerSpec& spec) const override {
    return agent_command_(spec.host, agent_argv(options_));
  }
  int free_port(const std::string& host, const std::string& secret, Duration timeout) override {
    return via_ == "local" ? find_free_local_port() : Launcher::free_port(host, secret, timeout);
  }
  bool keep(const std::string& host, const std::string& commit_dir, const std::string& secret) override;
  std::optional<int> keeper_port(const std::string& host) override;
  bool agent_alive(const std::string& host) override;
  void replicate(const std::string& holder, const std::string& keeper, int port,
                 const std::string& keeper_dir) override;
  void unkeep(const std::string& host, bool forget) override;
  void release(const std::string& host) override;
  std::vector<AttachOutcome> attach(const std::vector<std::pair<std::string, std::string>>& agents,
                                    const AttachRequest& request) override;
  std::vector<std::pair<std::string, std::string>> attach_paths() override;
  uint64_t attach_paths_version() override { return paths_version_->load(); }
  void recorded(const std::vector<std::pair<std::string, std::string>>& agents) override;
  uint64_t superseded() override;
  std::vector<std::pair<std::string, std::string>> take_drains() override;
  void abandon() override;

 private:
  // `host`'s live connection, started (and sent `secret`) when it has none;
  // null with `error` set when its agent cannot be started.
  std::shared_ptr<AgentConnection> connection(const std::string& host, const std::string& secret,
                                              std::string* error);
  // A connection to the process that runs `agent_args` for `host` (an agent,
  // or `erun --agent --attach`); null with `error` set when it cannot start.
  std::shared_ptr<AgentConnection> spawn_connection(const std::string& host, const std::vector<std::string>& agent_args,
                                                    std::string* error);
  // A connection straight to a local agent's attach socket `path`; null
  // with `error` set when it cannot be reached.
  std::shared_ptr<AgentConnection> connect_attach_socket(const std::string& host, const std::string& path,
                                                         std::string* error);
  // attach()'s first step for one agent: its connection (straight to a
  // local agent's socket, else through `erun --agent --attach PATH`), sent
  // the secret and ATTACH; null with `status` set when it cannot be reached.
  std::shared_ptr<AgentConnection> send_attach(const std::string& host, const std::string& path,
                                               const AttachRequest& request, Status& status);
  // attach()'s last step for one agent: waits (until `deadline`) for its
  // STATE, then its workers go into `out` and the connection becomes its
  // host's (abandoning an older one); an agent that does not answer is left.
  void adopt_agent(const std::shared_ptr<AgentConnection>& conn, TimePoint deadline, AttachOutcome& out);
  // With --driver-grace, a lost agent may keep its workers for a new
  // driver: `conn`'s loss hands it to the retirer (made on first use).
  void watch_loss(AgentConnection& conn);
  std::shared_ptr<AgentRetirer> retirer_;
  uint64_t term_ = 1;  // this driver's: 1 for the first, a takeover's ATTACH term
  AgentCommand agent_command_;
  bool abandoned_ = false;
  // Bumped by a connection whose agent names its attach socket (HELLO).
  std::shared_ptr<std::atomic<uint64_t>> paths_version_ = std::make_shared<std::atomic<uint64_t>>(0);
  AgentLaunchOptions options_;
  std::string via_, hint_;
  StderrHint stderr_hint_;
  uint64_t next_id_ = 1;
  std::map<std::string, std::shared_ptr<AgentConnection>> agents_;  // by host
  // Agents released (release()) whose end a thread of their own waits for;
  // `done` once it has, then joined by the next release() or the destructor.
  struct Released {
    std::thread waiter;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::vector<Released> released_;
};

}  // namespace erun
