#include "common/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace erun {

std::string ExitStatus::describe() const {
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

[[noreturn]] void child_fail(int errpipe, int err) {
  (void)!::write(errpipe, &err, sizeof err);
  ::_exit(127);
}

}  // namespace

Result<Subprocess> Subprocess::spawn(const SpawnOptions& o) {
  if (o.argv.empty()) return Result<Subprocess>::error("spawn: empty command");
  Pipe in, out, err, status;
  if (!status.open() || (o.pipe_stdin && !in.open()) || (o.pipe_stdout && !out.open()) ||
      (o.pipe_stderr && !err.open())) {
    return Result<Subprocess>::error(fmt::format("spawn {}: pipe: {}", o.argv[0], strerror(errno)));
  }
  // Everything the child needs is prepared before fork: no allocation after it.
  std::vector<char*> argv;
  for (auto& a : o.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  if (o.env) {
    for (auto& e : *o.env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
  }
  pid_t parent = ::getpid();

  pid_t pid = ::fork();
  if (pid < 0) {
    return Result<Subprocess>::error(fmt::format("spawn {}: fork: {}", o.argv[0], strerror(errno)));
  }
  if (pid == 0) {
    // Child: only async-signal-safe calls from here on.
    sigset_t all;
    sigemptyset(&all);
    ::sigprocmask(SIG_SETMASK, &all, nullptr);
    for (int s : {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGCHLD}) ::signal(s, SIG_DFL);
    if (o.new_process_group) ::setpgid(0, 0);
    if (o.kill_with_parent) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
    }
    int devnull = ::open("/dev/null", O_RDWR);
    if (::dup2(o.pipe_stdin ? in.r : devnull, 0) < 0) child_fail(status.w, errno);
    if (o.pipe_stdout && ::dup2(out.w, 1) < 0) child_fail(status.w, errno);
    if (o.pipe_stderr && ::dup2(err.w, 2) < 0) child_fail(status.w, errno);
    if (!o.cwd.empty() && ::chdir(o.cwd.c_str()) != 0) child_fail(status.w, errno);
    if (o.env) ::execvpe(argv[0], argv.data(), envp.data());
    else ::execvp(argv[0], argv.data());
    child_fail(status.w, errno);
  }

  Subprocess p;
  p.pid_ = pid;
  p.own_group_ = o.new_process_group;
  if (o.new_process_group) ::setpgid(pid, pid);  // closes the race with an early signal()
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

int Subprocess::release_stderr() {
  int fd = err_;
  err_ = -1;
  return fd;
}

void Subprocess::close_stdin() { close_fd(in_); }

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

}  // namespace erun
