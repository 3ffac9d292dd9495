// erun::agent::Env: every side effect of the agent's core (agent.cc,
// agent_channel.cc, agent_commits.cc) on its host, behind one interface in the
// manner of leveldb's Env: processes and signals, descriptors and sockets,
// files, the helper processes it forks, and the clock. Env::real() makes the
// system calls; a fake (tests/unit/agent_fake_env.h) keeps descriptors in
// memory and lets a test script a worker's exit, a signal or time passing, so
// that the agent's own logic runs in a unit test.
// Contract: only the agent's one thread calls it. Descriptors are ints that
// the Env handed out (or the agent's options named), closed through close().
// A failed call returns what the system call does (-1 with errno set) unless
// its comment says otherwise. The relay (relay.h) keeps its own sockets and is
// not behind this seam.
#pragma once

#include <poll.h>
#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "agent/replicas.h"
#include "agent/persister.h"
#include "commits/replica.h"
#include "common/clock.h"
#include "common/net.h"
#include "common/oom.h"
#include "common/private_files.h"
#include "common/status.h"
#include "common/subprocess.h"

namespace erun::agent {

// A worker started by Env::spawn(): its pid (it leads its own session) and
// the read ends of its stdout and stderr pipes.
struct Spawned {
  pid_t pid = -1;
  int out_fd = -1;
  int err_fd = -1;
};

class Env {
 public:
  // The system's: each call below is the one system call (or erun helper) it names.
  static Env& real();
  virtual ~Env() = default;

  // ---- the clock and this process
  virtual TimePoint now() = 0;
  virtual pid_t pid() = 0;

  // ---- signals
  // SIGPIPE ignored: a write to a closed pipe or socket fails with EPIPE.
  virtual void ignore_sigpipe() = 0;
  // Takes SIGCHLD, SIGTERM, SIGHUP and SIGINT through the returned descriptor
  // (a signalfd: readable while one is pending) instead; -1 on failure.
  virtual int take_signals() = 0;
  // The next signal pending on take_signals()'s descriptor; 0: none.
  virtual int next_signal(int fd) = 0;

  // ---- processes
  // Starts a worker as `o` says (Subprocess::spawn); the Env keeps nothing of it.
  virtual Result<Spawned> spawn(const SpawnOptions& o) = 0;
  // kill(2): `pid` below 0 is a process group.
  virtual int kill(pid_t pid, int sig) = 0;
  // A child that ended, without waiting (waitpid(-1, WNOHANG)): its pid and
  // wait status; nullopt when none did.
  virtual std::optional<std::pair<pid_t, int>> reap() = 0;
  // Whether a later SIGKILL of `pid` is the OOM killer's (common/oom.h).
  virtual OomWatch oom_watch(pid_t pid) = 0;

  // ---- descriptors and sockets
  virtual ssize_t read(int fd, char* buf, size_t n) = 0;
  virtual ssize_t write(int fd, std::string_view data) = 0;
  virtual ssize_t recv(int fd, char* buf, size_t n, int flags) = 0;
  virtual ssize_t send(int fd, std::string_view data, int flags) = 0;
  virtual int poll(pollfd* fds, size_t n, int timeout_ms) = 0;
  virtual void close(int fd) = 0;
  virtual void shutdown_write(int fd) = 0;
  virtual void set_nonblocking(int fd) = 0;
  // A connected AF_UNIX stream pair, close-on-exec and non-blocking; false on failure.
  virtual bool socketpair(int ends[2]) = 0;
  // A Unix socket listening at `path` (mode 0600, non-blocking); -1 on failure.
  virtual int listen_unix(const std::string& path) = 0;
  // A connection waiting on `listen_fd` (non-blocking, close-on-exec); -1: none.
  virtual int accept(int listen_fd) = 0;
  // A connection to the Unix socket at `a` by `deadline`; -1 with `error` set.
  virtual int connect_unix(const net::Address& a, TimePoint deadline, std::string* error) = 0;

  // ---- files
  // mkdtemp(3): `templ` ends in XXXXXX, replaced by the directory made (0700).
  virtual bool make_temp_dir(std::string& templ) = 0;
  virtual Status ensure_private_dir(const std::string& dir, const std::string& what, DirPolicy policy) = 0;
  virtual Result<int> open_private_append(const std::string& path, const std::string& what) = 0;
  // Writes `text` to DIR/NAME whole: into DIR/TEMP, renamed over NAME. False
  // (errno set, TEMP removed) on failure.
  virtual bool replace_file(const std::string& dir, const char* name, const char* temp, std::string_view text) = 0;
  virtual void unlink(const std::string& path) = 0;
  virtual void rmdir(const std::string& path) = 0;
  // The agent's stderr onto /dev/null (it was a driver's that is gone).
  virtual void detach_stderr() = 0;
  // Lines to the agent's stderr, above a status line should it show one.
  virtual void write_stderr(std::string_view text) = 0;

  // ---- the job's host memory (agent/commit_dir.h, commits/replica.h)
  virtual int hold_commit_dir(const std::string& dir, std::string* error) = 0;
  virtual bool release_commit_dir(const std::string& dir, int lease_fd) = 0;
  virtual state_internal::RemovedReplicas remove_replicas(const std::string& dir, bool all) = 0;

  // ---- helper processes (agent/watchdog.h, persister.h, replicas.h, detached.h)
  // `first_lines` are in its channel before it starts (agent/watchdog.h).
  virtual int spawn_watchdog(long silence_ms, const std::string& first_lines) = 0;
  virtual KeeperProcess spawn_keeper(const std::string& commit_dir, const std::string& secret, const std::string& me,
                                     std::string* error) = 0;
  virtual int spawn_pusher(const std::string& commit_dir, const std::string& secret, const std::string& host,
                           int port, const std::string& keeper_dir, const std::string& me) = 0;
  virtual int spawn_persister(const PersisterOptions& options) = 0;
  // Ends a helper and closes its channel `fd` (stop_helper()).
  virtual void stop_helper(int fd, std::chrono::milliseconds wait) = 0;
  // A pipe (non-blocking, close-on-exec) that the helpers forked from now on
  // write their stderr to; false: they keep the agent's.
  virtual bool route_helper_stderr(int ends[2]) = 0;

  // ---- built on the calls above
  // write() of all of `data`, retrying EINTR; false on an error.
  bool write_fully(int fd, std::string_view data);
  // Closes `fd` when open and sets it to -1.
  void close_fd(int& fd) {
    if (fd >= 0) close(std::exchange(fd, -1));
  }
};

}  // namespace erun::agent
