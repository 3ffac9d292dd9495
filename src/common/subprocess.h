// Subprocess: fork/exec of one child with optional pipes, in its own process
// group (or session), with non-blocking and deadline-bounded waits. Used by
// script discovery, the local and SSH launchers and the agent (its workers).
// Not thread-safe: one owner thread at a time. The destructor of a child that
// is still running SIGKILLs its process group and reaps it, so a Subprocess
// never leaks a process (unless release() handed it over).
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

// Closes every descriptor from `lowest` up (async-signal-safe: for a child
// after fork).
void close_from(int lowest);

struct ExitStatus {
  int code = 0;    // exit code when signal == 0
  int signal = 0;  // terminating signal, or 0
  // A SIGKILL that the kernel's OOM killer sent (common/oom.h): said so by
  // describe().
  bool oom_killed = false;
  bool ok() const { return signal == 0 && code == 0; }
  // The shell's convention: the exit code, or 128 + signal.
  int shell_code() const { return signal ? 128 + signal : code; }
  std::string describe() const;  // "exit code 3" / "signal 9 (Killed)" / "signal 9 (killed by the OOM killer)"
  static ExitStatus from_wait_status(int status);
};

// Exit code of a child whose program could not be started (as a shell's).
inline constexpr int kCannotStart = 127;

struct SpawnOptions {
  std::vector<std::string> argv;  // argv[0] is looked up in PATH
  // Full environment of the child as NAME=VALUE; when unset, the parent's.
  std::optional<std::vector<std::string>> env;
  // Looks argv[0] up in the PATH of `env` rather than in the parent's.
  bool path_from_env = false;
  std::string cwd;  // empty: the parent's
  bool pipe_stdin = false;   // otherwise /dev/null
  bool pipe_stdout = true;   // otherwise inherited
  bool pipe_stderr = true;   // otherwise inherited
  bool new_process_group = true;
  // Its own session (setsid), and so its own process group.
  bool new_session = false;
  // SIGKILL the child when the spawning *thread* dies (PR_SET_PDEATHSIG).
  bool kill_with_parent = false;
  // Closes every inherited descriptor above 2, not only the close-on-exec ones.
  bool close_other_fds = false;
  // A descriptor of the parent's that the child keeps, at the same number
  // (its close-on-exec flag cleared in the child): -1 none.
  int pass_fd = -1;
  // Written by the child as its first act once it leads its group or session,
  // before anything can fail: prefix, its pid in decimal, suffix, to fd (for
  // a watchdog that must learn of it even if the parent dies that instant).
  struct Announce {
    int fd = -1;
    std::string prefix, suffix;
  };
  std::optional<Announce> announce;
  // Set: spawn() returns as soon as the child leads its group or session; a
  // child that cannot enter `cwd` or run argv[0] then writes `cwd` or
  // `exec_prefix` + strerror + newline to its stderr and exits kCannotStart.
  // Unset: spawn() waits for the exec and returns such an error itself.
  struct ErrorsOnStderr {
    std::string cwd;
    std::string exec_prefix;
  };
  std::optional<ErrorsOnStderr> errors_on_stderr;
};

class Subprocess {
 public:
  static Result<Subprocess> spawn(const SpawnOptions& options);
  // No process: the two ends of a connection (`in` written, `out` read; the
  // same socket may be both, dup()ed) standing in for a child's stdin and
  // stdout, so that what talks to a process's pipes can talk to a socket.
  // It takes both descriptors; close_stdin() shuts the socket's writing side
  // down, so the peer reads its end. pid() is -1 and poll() never reports
  // an exit.
  static Subprocess channel(int in, int out);

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
  // Hands the child to the caller, who signals and reaps it from now on; the
  // Subprocess keeps only its pipes. Returns the pid.
  pid_t release();
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
  bool channel_ = false;  // channel(): `in_` is a socket
  std::optional<ExitStatus> exit_;
  int in_ = -1, out_ = -1, err_ = -1;
};

// Reads everything from fd until EOF or the deadline; appends to out. Returns
// false on timeout. The fd is made non-blocking.
bool read_all_until(int fd, std::string& out, TimePoint deadline);

// Writes all of `data` to fd (a pipe or a terminal: EINTR retried, a full
// non-blocking fd waited for); false when the fd is gone (EPIPE, EBADF...).
bool write_all(int fd, std::string_view data);

// This program's own path (/proc/self/exe); "" when it cannot be read.
std::string own_executable();

}  // namespace erun
