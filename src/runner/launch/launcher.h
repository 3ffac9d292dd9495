// Launcher: starts a worker on a host and hands back its WorkerHandle; the
// real ones start one erun agent per host (a local child, ssh, an srun step)
// and drive it (docs/protocol.md, "The agent protocol"). Handles are used from
// the driver's thread only; a launcher's own threads read the agents.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/log.h"
#include "common/status.h"
#include "common/subprocess.h"

namespace erun {

struct WorkerSpec {
  long generation = 0;
  int rank = 0;
  std::string host;        // as discovery named it
  int local_index = 0;     // slot on the host
  std::vector<std::string> command;  // the user's program and arguments
  // Variables set for the worker (ERUN_*, torchrun's, and the forwarded -x ones).
  std::vector<std::pair<std::string, std::string>> env;
  std::string cwd;         // working directory on the host
  std::string secret;      // delivered on stdin, exported as ERUN_SECRET; never in argv
  Duration term_grace = std::chrono::seconds(5);  // SIGTERM -> SIGKILL on stop
  // Non-empty (absolute): the agent appends the worker's stdout and stderr
  // to output_dir/rank.N/{stdout,stderr} on the worker's host.
  std::string output_dir;
};

class WorkerHandle {
 public:
  // A real launcher's handle whose worker still runs kills it (SIGKILL of its
  // session) and waits briefly for its end.
  virtual ~WorkerHandle() = default;
  // The worker's exit status once it has ended (255 when its host's agent
  // was lost or could not be started). Never blocks.
  virtual std::optional<ExitStatus> poll() = 0;
  // Asks the worker to stop: SIGTERM to its session, SIGKILL after the grace.
  // Returns at once; poll() reports the end.
  virtual void terminate() = 0;
  // SIGKILL of the worker's session now.
  virtual void kill() = 0;
  // Sends a signal to the worker's session (SIGINT/SIGTERM forwarding).
  virtual void signal(int sig) = 0;
  // The pipes carrying the worker's stdout and stderr; the caller takes
  // ownership (and closes them). -1 after they were taken.
  virtual int take_stdout() = 0;
  virtual int take_stderr() = 0;
  // pid of the worker on its host once the agent reported it, else 0.
  virtual long pid() const = 0;
  // The worker's last stderr lines as its host's agent reported them with its
  // exit (bounded, agent/protocol.h), once poll() has a status; nullopt when
  // there is no such report (the agent was lost or the worker could not be
  // started): the driver then uses the lines it forwarded itself. A worker
  // whose agent was lost because its transport failed in a way the launcher
  // recognises (ssh refusing the host key) reports that line and its fix.
  virtual std::optional<std::vector<std::string>> exit_stderr() const { return std::nullopt; }
  // When the launcher learned of the worker's end, once poll() has a status
  // (max: not known). The driver takes the ends it finds at one look in this
  // order, so the failure it learned of first is the one it acts on.
  virtual TimePoint exited_at() const { return TimePoint::max(); }
  // Once poll() has a status: the worker never started because its host
  // could not be reached at all (its agent never answered: ssh's exit 255,
  // or nothing within the start timeout), rather than a failure on the
  // host. The driver does not double a blacklisting for it (HostManager).
  virtual bool host_unreachable() const { return false; }
};

// A worker that a driver taking a job over found running (or ended while no
// driver was there) on an agent it attached to.
struct AdoptedWorker {
  std::string host;
  long generation = 0;  // the generation it was started for
  int rank = 0;         // its rank then
  int slot = 0;
  long pid = 0;
  std::unique_ptr<WorkerHandle> handle;
};

// Where a driver taking a job over tells the agents to relay the workers'
// rendezvous, and which term it is.
struct AttachRequest {
  std::string secret;
  uint64_t term = 0;
  std::string rdzv_host;  // as the host's workers reach the new driver
  int rdzv_port = 0;
  Duration timeout = std::chrono::seconds(10);  // for the agents' STATE, all together
};

// One agent's answer to attach(): its workers, or why not.
struct AttachOutcome {
  std::string host;
  Status status;
  std::vector<AdoptedWorker> workers;
};

class Launcher {
 public:
  virtual ~Launcher() = default;
  virtual Result<std::unique_ptr<WorkerHandle>> launch(const WorkerSpec& spec) = 0;
  // The exact command line that starts the agent of spec.host (for
  // --dry-run and logs); the worker itself travels over the agent's channel.
  virtual std::vector<std::string> command_line(const WorkerSpec& spec) const = 0;
  // A TCP port on `host` that nothing listens on (MASTER_PORT in restart
  // mode). This default asks the host through launch() (`cat /proc/net/tcp
  // /proc/net/tcp6`, with `secret`, for at most `timeout`) and picks a random
  // port in 20000-32000 that is not listening there, any such port when the
  // host does not answer. Launchers for this machine bind port 0 instead.
  virtual int free_port(const std::string& host, const std::string& secret, Duration timeout);

  // Commit replicas (docs/state.md, "Replicas on spare hosts"); only the
  // launchers that run agents have them. keep() starts `host`'s agent when
  // it has none (with `secret`) and asks it to keep the commits that holders
  // push into `commit_dir`, its ERUN_COMMIT_DIR; false when it cannot ask.
  virtual bool keep(const std::string& host, const std::string& commit_dir, const std::string& secret) {
    (void)host, (void)commit_dir, (void)secret;
    return false;
  }
  // The port that `host`'s keeper listens on: nullopt until its agent
  // answered KEEP, 0 when it could not keep or its agent was lost since.
  virtual std::optional<int> keeper_port(const std::string& host) {
    (void)host;
    return 0;
  }
  // Asks `holder`'s agent to push its host's newest commits to the keeper at
  // keeper:port with directory `keeper_dir` (one pusher per keeper); port 0
  // stops its pusher to that keeper.
  virtual void replicate(const std::string& holder, const std::string& keeper, int port,
                         const std::string& keeper_dir) {
    (void)holder, (void)keeper, (void)port, (void)keeper_dir;
  }
  // Whether `host` has a live agent; launchers without agents say true
  // (there is nothing to start).
  virtual bool agent_alive(const std::string& host) {
    (void)host;
    return true;
  }
  // Asks `host`'s agent, when it has a live one, to keep no more: its keeper
  // ends; with `forget` the replicas it stored go at once (when no worker
  // runs there), otherwise once its workers hold a commit as new.
  virtual void unkeep(const std::string& host, bool forget) { (void)host, (void)forget; }
  // The job needs no agent on `host` any more (it left discovery, runs no
  // worker of the job, keeps no replica): its agent, when it has one, is
  // told SHUTDOWN and let go off the caller's thread; the host's next
  // worker starts a new one. Returns at once.
  virtual void release(const std::string& host) { (void)host; }

  // Taking a job over (docs/protocol.md, "Taking a job over"); only the
  // launchers that run agents have it. attach() reaches each (host, attach
  // socket)'s running agent (`erun --agent --attach PATH` started as the
  // launcher starts agents, all at once) and returns, in the same order,
  // its workers once its STATE came, or why not (it is gone, it obeys a
  // newer driver, no STATE within the request's timeout).
  virtual std::vector<AttachOutcome> attach(const std::vector<std::pair<std::string, std::string>>& agents,
                                            const AttachRequest& request) {
    (void)request;
    std::vector<AttachOutcome> out;
    for (auto& [host, path] : agents) {
      out.push_back(AttachOutcome{host, Status::error("this launcher cannot take agents over"), {}});
    }
    return out;
  }
  // Each live agent's host and attach socket (for the job record), and a
  // number that changes whenever an agent names a new one.
  virtual std::vector<std::pair<std::string, std::string>> attach_paths() { return {}; }
  virtual uint64_t attach_paths_version() { return 0; }
  // The job record now names these agents (host, attach socket): each is
  // told RECORDED once, and keeps its workers for a new driver from then on.
  virtual void recorded(const std::vector<std::pair<std::string, std::string>>& agents) { (void)agents; }
  // The highest driver term an agent said it obeys now instead of this
  // driver (SUPERSEDED), or 0.
  virtual uint64_t superseded() { return 0; }
  // Hosts whose agent said since the last call that the host leaves on
  // notice (DRAINING: SIGTERM to the agent or to a worker), with the reason.
  virtual std::vector<std::pair<std::string, std::string>> take_drains() { return {}; }
  // This driver leaves the job to another: nothing more is sent to the
  // agents, whose workers keep running; handles report them ended at once.
  virtual void abandon() {}
};

// A free TCP port on this machine (bind to port 0).
int find_free_local_port();

// How the real launchers start and watch agents.
struct AgentLaunchOptions {
  std::string agent_path;  // the erun binary on the hosts; must be set (main: its own executable)
  Duration heartbeat_interval = std::chrono::seconds(1);
  Duration heartbeat_timeout = std::chrono::seconds(5);
  // From starting the agent to its HELLO (ssh connection set-up included).
  Duration start_timeout = std::chrono::seconds(30);
  // The agent relays its workers' rendezvous connections (`--relay`).
  bool relay = true;
  // `--driver-grace`: the agent keeps its workers this long once erun is
  // gone without SHUTDOWN (0: it stops them at once).
  Duration driver_grace = Duration::zero();
  // `--drain-timeout`: SIGTERM to the agent (or a worker's notice) drains
  // the host: its workers get this long to leave at a commit (0: SIGTERM
  // stops them at once, as a failure).
  Duration drain_timeout = Duration::zero();
  // `--log-level` of the agent: what it says on erun's stderr.
  LogLevel log_level = LogLevel::kInfo;
};

struct SshOptions {
  int port = 0;                  // 0: ssh's default
  std::string identity_file;     // empty: ssh's default
  std::string user;              // empty: ssh's default
  Duration connect_timeout = std::chrono::seconds(10);
  // More ssh options, in order after erun's own: "Key=Value" words get their
  // -o, words starting with '-' pass as given (a two-letter flag takes the
  // next word as its argument: "-F", "FILE").
  std::vector<std::string> extra_options;
};

std::unique_ptr<Launcher> make_local_launcher(AgentLaunchOptions agent);
std::unique_ptr<Launcher> make_ssh_launcher(SshOptions options, AgentLaunchOptions agent);
// For a line that ssh wrote to stderr while reaching `host`: how to fix the
// failure it reports (a host key it cannot verify: the ssh-keyscan command
// for the known_hosts file that `options` use, or
// --ssh-option StrictHostKeyChecking=accept-new), or nullopt. The ssh
// launcher reports it with the host's failure.
std::optional<std::string> ssh_failure_hint(const SshOptions& options, const std::string& host,
                                            std::string_view line);

// The agent's command line: `AGENT_PATH --agent --heartbeat-interval S --heartbeat-timeout S
// [--driver-grace S] [--drain-timeout S] [--relay]`.
std::vector<std::string> agent_argv(const AgentLaunchOptions& agent);

// Checks a spec before it is sent: a command, env names without '=' or NUL,
// no newline in the secret. The error names the bad input.
Status validate_worker_spec(const WorkerSpec& spec);

// True when `host` names this machine: localhost, 127.0.0.1, ::1, this
// machine's hostname or FQDN. Other loopback addresses (127.0.0.2, ...) are
// remote hosts on purpose: tests use them as distinct machines.
bool is_local_host(const std::string& host);

// This machine's host name, as gethostname() gives it ("" when it fails).
std::string this_host_name();

}  // namespace erun
