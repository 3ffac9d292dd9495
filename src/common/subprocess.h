// Subprocess: fork/exec of one child with optional pipes, in its own process
// group, with non-blocking and deadline-bounded waits. Used by script discovery
// and the local and SSH launchers. Not thread-safe: one owner thread at a time.
// The destructor of a child that is still running SIGKILLs its process group
// and reaps it, so a Subprocess never leaks a process.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"

namespace erun {

// Closes `fd` when it is open and sets it to -1 (so a second call is a no-op).
void close_fd(int& fd);

struct ExitStatus {
  int code = 0;    // exit code when signal == 0
  int signal = 0;  // terminating signal, or 0
  bool ok() const { return signal == 0 && code == 0; }
  // The shell's convention: the exit code, or 128 + signal.
  int shell_code() const { return signal ? 128 + signal : code; }
  std::string describe() const;  // "exit code 3" / "signal 9 (Killed)"
  static ExitStatus from_wait_status(int status);
};

struct SpawnOptions {
  std::vector<std::string> argv;  // argv[0] is looked up in PATH
  // Full environment of the child as NAME=VALUE; when unset, the parent's.
  std::optional<std::vector<std::string>> env;
  std::string cwd;  // empty: the parent's
  bool pipe_stdin = false;   // otherwise /dev/null
  bool pipe_stdout = true;   // otherwise inherited
  bool pipe_stderr = true;   // otherwise inherited
  bool new_process_group = true;
  // SIGKILL the child when the spawning *thread* dies (PR_SET_PDEATHSIG).
  bool kill_with_parent = false;
};

class Subprocess {
 public:
  static Result<Subprocess> spawn(const SpawnOptions& options);

  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) noexcept;
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;
  ~Subprocess();

  pid_t pid() const { return pid_; }
  int stdin_fd() const { return in_; }
  int stdout_fd() const { return out_; }
  int stderr_fd() const { return err_; }
  // Hands a pipe's ownership to the caller (it must close it); -1 if none.
  int release_stdout();
  int release_stderr();
  void close_stdin();

  // Reaps the child if it has exited; never blocks.
  std::optional<ExitStatus> poll();
  // Waits up to `timeout`; nullopt if the child is still running then.
  std::optional<ExitStatus> wait_for(Duration timeout);
  bool running() { return !poll().has_value(); }
  // Sends sig to the child's process group (or the child alone without one).
  void signal(int sig);
  // SIGTERM, up to `grace`, then SIGKILL; always reaps.
  ExitStatus terminate(Duration grace);

 private:
  Subprocess() = default;
  void reset_fds();
  pid_t pid_ = -1;
  bool own_group_ = false;
  std::optional<ExitStatus> exit_;
  int in_ = -1, out_ = -1, err_ = -1;
};

// Reads everything from fd until EOF or the deadline; appends to out. Returns
// false on timeout. The fd is made non-blocking.
bool read_all_until(int fd, std::string& out, TimePoint deadline);

}  // namespace erun
