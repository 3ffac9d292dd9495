// Launcher: starts one worker process on a host and hands back a WorkerHandle.
// Implementations: LocalLauncher (fork/exec on this machine), SshLauncher
// (ssh to the host), and FakeLauncher for the driver's unit tests.
//
// Every real worker runs under a small POSIX-sh supervisor (see
// worker_wrapper.h) that reads the job secret from its stdin, starts the
// command in its own session, and kills that session when the driver says so
// or when its stdin reaches EOF: erun exiting, crashing, or an SSH connection
// dropping all end the worker. No worker outlives the driver.
//
// Handles are used from the driver's thread only. The destructor of a handle
// whose worker still runs kills it (SIGKILL of its whole session) and reaps.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
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
};

class WorkerHandle {
 public:
  virtual ~WorkerHandle() = default;
  // The worker's exit status once it has ended (for SSH: the remote status,
  // or 255 when ssh itself failed). Never blocks.
  virtual std::optional<ExitStatus> poll() = 0;
  // Asks the worker to stop: SIGTERM to its session, SIGKILL after the grace.
  // Returns at once; poll() reports the end.
  virtual void terminate() = 0;
  // SIGKILL now (best effort for remote workers: the supervisor does it).
  virtual void kill() = 0;
  // Sends a signal to the worker's session (SIGINT/SIGTERM forwarding).
  virtual void signal(int sig) = 0;
  // The pipes carrying the worker's stdout and stderr; the caller takes
  // ownership (and closes them). -1 after they were taken.
  virtual int take_stdout() = 0;
  virtual int take_stderr() = 0;
  // pid of the local process erun started (the supervisor or the ssh client).
  virtual long pid() const = 0;
};

class Launcher {
 public:
  virtual ~Launcher() = default;
  virtual Result<std::unique_ptr<WorkerHandle>> launch(const WorkerSpec& spec) = 0;
  // The exact command line launch() would run, for --dry-run and logs.
  virtual std::vector<std::string> command_line(const WorkerSpec& spec) const = 0;
};

struct SshOptions {
  int port = 0;                  // 0: ssh's default
  std::string identity_file;     // empty: ssh's default
  std::string user;              // empty: ssh's default
  Duration connect_timeout = std::chrono::seconds(10);
  std::vector<std::string> extra_options;  // more "-o Key=Value" words
};

std::unique_ptr<Launcher> make_local_launcher();
std::unique_ptr<Launcher> make_ssh_launcher(SshOptions options);

// True when `host` names this machine: localhost, 127.0.0.1, ::1, this
// machine's hostname or FQDN. Other loopback addresses (127.0.0.2, ...) are
// remote hosts on purpose: tests use them as distinct machines.
bool is_local_host(const std::string& host);

}  // namespace erun
