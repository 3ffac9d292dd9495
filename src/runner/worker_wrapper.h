// The POSIX-sh supervisor every real worker runs under (`sh -c SCRIPT`, the
// same script for local and SSH launch), and the erun side of its control
// channel. The supervisor reads the job secret as the first line of stdin,
// exports it with the worker's env, cd's to the working dir, starts the command
// with `setsid` (the worker leads its own session and process group, with
// default signal dispositions) and then reads control lines from stdin: TERM
// (SIGTERM, grace, SIGKILL of the group), KILL, INT, "SIG <n>"; EOF acts as
// TERM. When the worker ends, the rest of its group is SIGKILLed. It exits
// with the worker's status (128+signal when signalled) and leaves none of its
// helpers behind.
// Used from the driver's thread; write_control never raises SIGPIPE.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"
#include "common/subprocess.h"
#include "runner/launcher.h"

namespace erun {

// Exit codes of the supervisor itself (before the worker started).
inline constexpr int kWrapperNoSecret = 125;  // stdin closed before the secret line
inline constexpr int kWrapperSetupFailed = 127;  // cwd missing, setsid missing

// Checks what the script cannot express: env names must be shell identifiers,
// the command non-empty, no newline in the secret.
Status validate_worker_spec(const WorkerSpec& spec);

// The supervisor's script text. The secret is not in it.
std::string worker_script(const WorkerSpec& spec);

// Control lines (each ends with '\n').
std::string control_line_terminate();
std::string control_line_kill();
std::string control_line_signal(int sig);

// Writes all of `data` to a pipe without raising SIGPIPE in the process
// (EPIPE and a full pipe are reported as false). Never blocks for long: the
// fd is expected to be non-blocking.
bool write_control(int fd, std::string_view data);

// The worker a local supervisor started: the session leader whose parent is in
// the supervisor's process group, found through /proc; nullopt when there is
// none (not started yet, or ended).
std::optional<pid_t> find_supervised_worker(pid_t supervisor_group);

// For launchers that run the supervisor through another program (ssh, srun):
// spawns `argv` with piped stdio in its own process group, sends the secret,
// and returns the handle. `via` names the program in errors ("ssh"), `hint`
// says what to check when it cannot be started.
Result<std::unique_ptr<WorkerHandle>> launch_through(const WorkerSpec& spec, std::vector<std::string> argv,
                                                      const std::string& via, const std::string& hint);

// Shared WorkerHandle over a spawned supervisor (local) or ssh client (remote):
// owns the Subprocess and its control pipe.
class SupervisedWorker : public WorkerHandle {
 public:
  // Writes the secret line; on failure returns an error naming `what`.
  static Status start_control(Subprocess& process, const std::string& secret,
                              const std::string& what);

  SupervisedWorker(Subprocess process, bool local);
  ~SupervisedWorker() override;

  std::optional<ExitStatus> poll() override;
  void terminate() override;
  void kill() override;
  void signal(int sig) override;
  int take_stdout() override { return process_.release_stdout(); }
  int take_stderr() override { return process_.release_stderr(); }
  long pid() const override { return process_.pid(); }

  // Closes erun's end of the control channel (as erun's death would).
  void close_control() { process_.close_stdin(); }

 private:
  void send(const std::string& line);
  // Local only: SIGKILL the worker's own group, found under the supervisor.
  void kill_worker_group();

  Subprocess process_;
  bool local_;
};

}  // namespace erun
