// The system's Env: the agent's side effects as the system calls and erun's
// helpers make them (agent/env.h).
#include "agent/env.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include "agent/commit_dir.h"
#include "agent/detached.h"
#include "agent/watchdog.h"
#include "common/fd.h"
#include "common/net.h"
#include "common/status_line.h"

namespace erun::agent {

bool Env::write_fully(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = write(fd, data);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

namespace {

class RealEnv final : public Env {
 public:
  TimePoint now() override { return std::chrono::steady_clock::now(); }
  pid_t pid() override { return ::getpid(); }

  void ignore_sigpipe() override { ::signal(SIGPIPE, SIG_IGN); }

  int take_signals() override {
    sigset_t handled;
    sigemptyset(&handled);
    for (int s : {SIGCHLD, SIGTERM, SIGHUP, SIGINT}) sigaddset(&handled, s);
    ::sigprocmask(SIG_BLOCK, &handled, nullptr);
    return ::signalfd(-1, &handled, SFD_NONBLOCK | SFD_CLOEXEC);
  }

  int next_signal(int fd) override {
    signalfd_siginfo info;
    if (::read(fd, &info, sizeof info) != sizeof info) return 0;
    return static_cast<int>(info.ssi_signo);
  }

  Result<Spawned> spawn(const SpawnOptions& o) override {
    auto p = Subprocess::spawn(o);
    if (!p) return Result<Spawned>::error(p.message());
    Spawned s;
    s.out_fd = p->release_stdout();
    s.err_fd = p->release_stderr();
    s.pid = p->release();  // the agent reaps it (reap())
    return s;
  }

  int kill(pid_t pid, int sig) override { return ::kill(pid, sig); }

  std::optional<std::pair<pid_t, int>> reap() override {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return std::nullopt;
    return std::pair{pid, status};
  }

  OomWatch oom_watch(pid_t pid) override { return OomWatch::of(pid); }

  ssize_t read(int fd, char* buf, size_t n) override { return ::read(fd, buf, n); }
  ssize_t write(int fd, std::string_view data) override { return ::write(fd, data.data(), data.size()); }
  ssize_t recv(int fd, char* buf, size_t n, int flags) override { return ::recv(fd, buf, n, flags); }
  ssize_t send(int fd, std::string_view data, int flags) override {
    return ::send(fd, data.data(), data.size(), flags);
  }
  int poll(pollfd* fds, size_t n, int timeout_ms) override { return ::poll(fds, n, timeout_ms); }
  void close(int fd) override { ::close(fd); }
  void shutdown_write(int fd) override { ::shutdown(fd, SHUT_WR); }
  void set_nonblocking(int fd) override { (void)net::set_nonblocking(fd); }

  bool socketpair(int ends[2]) override {
    return ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, ends) == 0;
  }

  int listen_unix(const std::string& path) override {
    net::Address a;
    if (!net::unix_address(path, &a)) return -1;
    net::Socket sock = net::listen(a, 16);
    if (!sock.ok()) return -1;
    ::chmod(path.c_str(), 0600);
    return sock.fd.release();
  }

  int accept(int listen_fd) override { return net::accept(listen_fd).release(); }

  int connect_unix(const net::Address& a, TimePoint deadline, std::string* error) override {
    net::Socket s = net::connect_unix(a, deadline);
    if (!s.ok()) {
      *error = s.outcome.text();
      return -1;
    }
    return s.fd.release();
  }

  bool make_temp_dir(std::string& templ) override { return ::mkdtemp(templ.data()) != nullptr; }

  Status ensure_private_dir(const std::string& dir, const std::string& what, DirPolicy policy) override {
    return erun::ensure_private_dir(dir, what, policy);
  }

  Result<int> open_private_append(const std::string& path, const std::string& what) override {
    return erun::open_private_append(path, what);
  }

  bool replace_file(const std::string& dir, const char* name, const char* temp, std::string_view text) override {
    // Fixed names in a directory of the agent's own (0700): nobody else can
    // plant a link there.
    Fd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW));
    Fd file(d ? ::openat(d.get(), temp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600) : -1);
    if (file && write_fully(file.get(), text) && ::renameat(d.get(), temp, d.get(), name) == 0) return true;
    const int err = errno;
    if (d) ::unlinkat(d.get(), temp, 0);
    errno = err;
    return false;
  }

  void unlink(const std::string& path) override { ::unlink(path.c_str()); }
  void rmdir(const std::string& path) override { ::rmdir(path.c_str()); }

  void detach_stderr() override {
    if (int devnull = ::open("/dev/null", O_WRONLY | O_CLOEXEC); devnull >= 0) {
      ::dup2(devnull, STDERR_FILENO);
      ::close(devnull);
    }
  }

  void write_stderr(std::string_view text) override { (void)StatusLine::get().write_above(STDERR_FILENO, text); }

  int hold_commit_dir(const std::string& dir, std::string* error) override {
    return agent::hold_commit_dir(dir, error);
  }
  bool release_commit_dir(const std::string& dir, int lease_fd) override {
    return agent::release_commit_dir(dir, lease_fd);
  }
  state_internal::RemovedReplicas remove_replicas(const std::string& dir, bool all) override {
    return state_internal::remove_replicas(dir, all);
  }

  int spawn_watchdog(long silence_ms, const std::string& first_lines) override {
    return agent::spawn_watchdog(silence_ms, first_lines);
  }
  KeeperProcess spawn_keeper(const std::string& commit_dir, const std::string& secret, const std::string& me,
                             std::string* error) override {
    return agent::spawn_keeper(commit_dir, secret, me, error);
  }
  int spawn_pusher(const std::string& commit_dir, const std::string& secret, const std::string& host, int port,
                   const std::string& keeper_dir, const std::string& me) override {
    return agent::spawn_pusher(commit_dir, secret, host, port, keeper_dir, me);
  }
  int spawn_persister(const PersisterOptions& options) override { return agent::spawn_persister(options); }
  void stop_helper(int fd, std::chrono::milliseconds wait) override { agent::stop_helper(fd, wait); }

  bool route_helper_stderr(int ends[2]) override {
    if (::pipe2(ends, O_CLOEXEC | O_NONBLOCK) != 0) return false;  // the helpers keep the agent's stderr
    agent::route_helper_stderr(ends[1]);
    return true;
  }
};

}  // namespace

Env& Env::real() {
  static RealEnv env;
  return env;
}

}  // namespace erun::agent
