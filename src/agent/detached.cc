#include "agent/detached.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "common/subprocess.h"

namespace erun::agent {

namespace {
int helper_stderr = -1;
}  // namespace

void route_helper_stderr(int fd) { helper_stderr = fd; }

pid_t fork_detached(int child_end, bool keep_stderr) {
  pid_t pid = ::fork();
  if (pid != 0) return pid;
  ::setsid();
  for (int s : {SIGINT, SIGHUP, SIGTERM, SIGPIPE, SIGQUIT}) ::signal(s, SIG_IGN);
  ::signal(SIGCHLD, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  int null = ::open("/dev/null", O_RDWR);
  for (int target : {0, 1, 2}) {
    if (target != 2 || !keep_stderr) ::dup2(null, target);
  }
  if (keep_stderr && helper_stderr >= 0) ::dup2(helper_stderr, 2);
  if (child_end != 3) {
    ::dup2(child_end, 3);
  } else {
    ::fcntl(3, F_SETFD, 0);
  }
  close_from(4);
  return 0;
}

int spawn_helper(const std::function<void(int channel)>& body, bool keep_stderr, std::string_view first) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) return -1;
  // Into the socket's buffer before the fork: never lost to a parent that
  // dies between the fork and its first write.
  if (!write_all(fds[0], first)) {
    const int saved = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    errno = saved;
    return -1;
  }
  pid_t pid = fork_detached(fds[1], keep_stderr);
  if (pid < 0) {
    int saved = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    errno = saved;
    return -1;
  }
  if (pid == 0) {
    body(3);
    ::_exit(1);  // body() does not return
  }
  ::close(fds[1]);
  return fds[0];
}

void stop_helper(int fd, std::chrono::milliseconds wait) {
  if (fd < 0) return;
  ::shutdown(fd, SHUT_WR);
  const auto deadline = std::chrono::steady_clock::now() + wait;
  char buf[64];
  while (true) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) break;
    pollfd p{fd, POLLIN, 0};
    int ready = ::poll(&p, 1, static_cast<int>(left));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) break;
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) break;  // it exited
  }
  ::close(fd);
}

}  // namespace erun::agent
