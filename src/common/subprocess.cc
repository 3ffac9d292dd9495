#include "common/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string_view>

#include <fmt/format.h>

extern char** environ;

namespace erun {

std::string ExitStatus::describe() const {
  if (signal && oom_killed) return fmt::format("signal {} (killed by the OOM killer)", signal);
  if (signal) return fmt::format("signal {} ({})", signal, strsignal(signal));
  return fmt::format("exit code {}", code);
}

ExitStatus ExitStatus::from_wait_status(int status) {
  ExitStatus s;
  if (WIFEXITED(status)) s.code = WEXITSTATUS(status);
  else if (WIFSIGNALED(status)) s.signal = WTERMSIG(status);
  return s;
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

void close_from(int lowest) {
#ifdef SYS_close_range
  if (::syscall(SYS_close_range, lowest, ~0u, 0) == 0) return;
#endif
  long max = ::sysconf(_SC_OPEN_MAX);
  for (int fd = lowest; fd < (max > 0 ? max : 1024); ++fd) ::close(fd);
}

namespace {

struct Pipe {
  int r = -1, w = -1;
  bool open() {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return false;
    r = fds[0];
    w = fds[1];
    return true;
  }
  ~Pipe() {
    close_fd(r);
    close_fd(w);
  }
};

// What the child needs, prepared before fork: after it the child makes only
// async-signal-safe calls and allocates nothing.
struct ChildPlan {
  const SpawnOptions* o = nullptr;
  std::vector<char*> argv, envp;
  pid_t parent = -1;
  int in = -1, out = -1, err = -1;  // the child's ends of the pipes, or -1
  int status = -1;                  // the status pipe's write end, or -1
  std::string announce;             // room for the announcement line
};

void write_text(int fd, std::string_view text) { (void)!::write(fd, text.data(), text.size()); }

[[noreturn]] void child_fail(int errpipe, int err) {
  if (errpipe >= 0) (void)!::write(errpipe, &err, sizeof err);
  ::_exit(kCannotStart);
}

// Options::announce's line, in one write (a pipe keeps it whole).
void announce(ChildPlan& c) {
  const SpawnOptions::Announce& a = *c.o->announce;
  char digits[24];
  size_t n = 0;
  for (unsigned long v = static_cast<unsigned long>(::getpid()); n == 0 || v > 0; v /= 10) {
    digits[n++] = static_cast<char>('0' + v % 10);
  }
  char* line = c.announce.data();
  size_t len = a.prefix.size();
  std::memcpy(line, a.prefix.data(), len);
  while (n > 0) line[len++] = digits[--n];
  std::memcpy(line + len, a.suffix.data(), a.suffix.size());
  len += a.suffix.size();
  (void)!::write(a.fd, line, len);
}

// Every descriptor above 2 but `keep` and `keep2` (-1: none).
void close_others(int keep, int keep2) {
  int lowest = 3;
  for (int k : {std::min(keep, keep2), std::max(keep, keep2)}) {
    if (k < lowest) continue;
    for (int fd = lowest; fd < k; ++fd) ::close(fd);
    lowest = k + 1;
  }
  close_from(lowest);
}

[[noreturn]] void run_child(ChildPlan& c) {
  const SpawnOptions& o = *c.o;
  if (o.new_session) {
    ::setsid();
  } else if (o.new_process_group) {
    ::setpgid(0, 0);
  }
  // It leads its group now: a signal to the group reaches it. With errors on
  // stderr, spawn() returns here.
  if (o.errors_on_stderr) close_fd(c.status);
  if (o.announce && o.announce->fd >= 0) announce(c);
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig != SIGKILL && sig != SIGSTOP) ::signal(sig, SIG_DFL);
  }
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  if (o.kill_with_parent) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != c.parent) ::_exit(kCannotStart);
  }
  int devnull = ::open("/dev/null", O_RDONLY);
  if (::dup2(o.pipe_stdin ? c.in : devnull, 0) < 0) child_fail(c.status, errno);
  if (o.pipe_stdout && ::dup2(c.out, 1) < 0) child_fail(c.status, errno);
  if (o.pipe_stderr && ::dup2(c.err, 2) < 0) child_fail(c.status, errno);
  if (!o.cwd.empty() && ::chdir(o.cwd.c_str()) != 0) {
    if (!o.errors_on_stderr) child_fail(c.status, errno);
    write_text(2, o.errors_on_stderr->cwd);
    ::_exit(kCannotStart);
  }
  if (o.pass_fd >= 0 && ::fcntl(o.pass_fd, F_SETFD, 0) != 0) child_fail(c.status, errno);
  if (o.close_other_fds) close_others(c.status, o.pass_fd);
  if (o.env && o.path_from_env) {
    environ = c.envp.data();
    ::execvp(c.argv[0], c.argv.data());
  } else if (o.env) {
    ::execvpe(c.argv[0], c.argv.data(), c.envp.data());
  } else {
    ::execvp(c.argv[0], c.argv.data());
  }
  int e = errno;
  if (!o.errors_on_stderr) child_fail(c.status, e);
  const char* why = std::strerror(e);
  write_text(2, o.errors_on_stderr->exec_prefix);
  write_text(2, why);
  write_text(2, "\n");
  ::_exit(kCannotStart);
}

}  // namespace

Result<Subprocess> Subprocess::spawn(const SpawnOptions& o) {
  if (o.argv.empty()) return Result<Subprocess>::error("spawn: empty command");
  Pipe in, out, err, status;
  if (!status.open() || (o.pipe_stdin && !in.open()) || (o.pipe_stdout && !out.open()) ||
      (o.pipe_stderr && !err.open())) {
    return Result<Subprocess>::error(fmt::format("spawn {}: pipe: {}", o.argv[0], strerror(errno)));
  }
  ChildPlan c;
  c.o = &o;
  for (auto& a : o.argv) c.argv.push_back(const_cast<char*>(a.c_str()));
  c.argv.push_back(nullptr);
  if (o.env) {
    for (auto& e : *o.env) c.envp.push_back(const_cast<char*>(e.c_str()));
    c.envp.push_back(nullptr);
  }
  if (o.announce) c.announce.resize(o.announce->prefix.size() + 24 + o.announce->suffix.size());
  c.parent = ::getpid();
  c.in = in.r;
  c.out = out.w;
  c.err = err.w;
  c.status = status.w;

  pid_t pid = ::fork();
  if (pid < 0) {
    return Result<Subprocess>::error(fmt::format("spawn {}: fork: {}", o.argv[0], strerror(errno)));
  }
  if (pid == 0) run_child(c);

  Subprocess p;
  p.pid_ = pid;
  p.own_group_ = o.new_process_group || o.new_session;
  // Closes the race with an early signal(); a session's leader makes its own.
  if (o.new_process_group && !o.new_session) ::setpgid(pid, pid);
  close_fd(status.w);
  int child_errno = 0;
  ssize_t n;
  do {
    n = ::read(status.r, &child_errno, sizeof child_errno);
  } while (n < 0 && errno == EINTR);
  if (n == sizeof child_errno) {
    int st;
    ::waitpid(pid, &st, 0);
    p.pid_ = -1;
    return Result<Subprocess>::error(
        fmt::format("cannot run '{}': {}", o.argv[0], strerror(child_errno)));
  }
  if (o.pipe_stdin) { p.in_ = in.w; in.w = -1; }
  if (o.pipe_stdout) { p.out_ = out.r; out.r = -1; }
  if (o.pipe_stderr) { p.err_ = err.r; err.r = -1; }
  return p;
}

Subprocess::Subprocess(Subprocess&& o) noexcept { *this = std::move(o); }

Subprocess& Subprocess::operator=(Subprocess&& o) noexcept {
  if (this != &o) {
    this->~Subprocess();
    pid_ = o.pid_;
    own_group_ = o.own_group_;
    channel_ = o.channel_;
    exit_ = o.exit_;
    in_ = o.in_;
    out_ = o.out_;
    err_ = o.err_;
    o.pid_ = -1;
    o.in_ = o.out_ = o.err_ = -1;
  }
  return *this;
}

Subprocess::~Subprocess() {
  if (pid_ > 0 && !exit_) {
    signal(SIGKILL);
    int st;
    while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
    }
  }
  pid_ = -1;
  reset_fds();
}

void Subprocess::reset_fds() {
  close_fd(in_);
  close_fd(out_);
  close_fd(err_);
}

int Subprocess::release_stdout() {
  int fd = out_;
  out_ = -1;
  return fd;
}

pid_t Subprocess::release() {
  pid_t pid = pid_;
  pid_ = -1;
  return pid;
}

int Subprocess::release_stderr() {
  int fd = err_;
  err_ = -1;
  return fd;
}

Subprocess Subprocess::channel(int in, int out) {
  Subprocess s;
  s.channel_ = true;
  s.in_ = in;
  s.out_ = out;
  return s;
}

void Subprocess::close_stdin() {
  if (channel_ && in_ >= 0) ::shutdown(in_, SHUT_WR);
  close_fd(in_);
}

std::optional<ExitStatus> Subprocess::poll() {
  if (exit_ || pid_ <= 0) return exit_;
  int st;
  pid_t r;
  do {
    r = ::waitpid(pid_, &st, WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == pid_) exit_ = ExitStatus::from_wait_status(st);
  else if (r < 0) exit_ = ExitStatus{127, 0};  // not our child any more: treat as gone
  return exit_;
}

std::optional<ExitStatus> Subprocess::wait_for(Duration timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  auto step = std::chrono::microseconds(200);
  while (true) {
    if (auto s = poll()) return s;
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(step);
    if (step < std::chrono::milliseconds(10)) step *= 2;
  }
}

void Subprocess::signal(int sig) {
  if (pid_ <= 0 || exit_) return;
  if (own_group_) ::kill(-pid_, sig);
  else ::kill(pid_, sig);
}

ExitStatus Subprocess::terminate(Duration grace) {
  if (auto s = poll()) return *s;
  signal(SIGTERM);
  if (auto s = wait_for(grace)) {
    if (own_group_) ::kill(-pid_, SIGKILL);  // stragglers left in the group
    return *s;
  }
  signal(SIGKILL);
  int st;
  while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
  }
  exit_ = ExitStatus::from_wait_status(st);
  return *exit_;
}

bool read_all_until(int fd, std::string& out, TimePoint deadline) {
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  char buf[65536];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) return true;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return true;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(std::min<long>(left.count() + 1, 1000)));
  }
}

bool write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 1000);
    } else {
      return false;
    }
  }
  return true;
}

std::string own_executable() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return {};
  return std::string(buf, static_cast<size_t>(n));
}

}  // namespace erun
