#include "worker/drain_signal.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "common/log.h"
#include "common/strings.h"

namespace erun::worker {

namespace {

// Read by the handler only: set once before it is installed.
int g_fd = -1;
pid_t g_pid = -1;
volatile sig_atomic_t g_noticed = 0;

// Async-signal-safe throughout.
void on_sigterm(int) {
  const int saved = errno;
  bool stop = ::getpid() != g_pid || g_noticed != 0;  // a forked child, or a second notice
  if (!stop) {
    char buf[64];
    while (true) {
      ssize_t n = ::recv(g_fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) {
        if (std::memchr(buf, 'S', static_cast<size_t>(n))) stop = true;
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) stop = true;  // the agent is gone
      break;
    }
  }
  if (!stop && ::send(g_fd, "D", 1, MSG_DONTWAIT | MSG_NOSIGNAL) != 1) stop = true;
  if (stop) {
    // As without erun: the default action, once this handler returns.
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    ::sigaction(SIGTERM, &dfl, nullptr);
    ::kill(::getpid(), SIGTERM);
  } else {
    g_noticed = 1;
  }
  errno = saved;
}

}  // namespace

bool install_drain_on_sigterm() {
  const char* fd_text = std::getenv("ERUN_AGENT_FD");
  const char* opt = std::getenv("ERUN_DRAIN_ON_SIGTERM");
  if (!fd_text || !*fd_text || (opt && std::strcmp(opt, "0") == 0)) return false;
  long fd = -1;
  struct stat st {};
  if (!parse_int(fd_text, fd) || fd < 3 || ::fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) {
    ERUN_LOG_WARN("ERUN_AGENT_FD={} is no open socket: a SIGTERM stops this worker at once instead of draining "
                  "its host",
                  fd_text);
    return false;
  }
  struct sigaction old {};
  if (::sigaction(SIGTERM, nullptr, &old) != 0 || (old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL) {
    ERUN_LOG_DEBUG("SIGTERM has a handler already: erun leaves it to the program (no drain on SIGTERM)");
    return false;
  }
  // Programs this worker runs do not inherit the socket.
  ::fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);
  g_fd = static_cast<int>(fd);
  g_pid = ::getpid();
  struct sigaction sa {};
  sa.sa_handler = on_sigterm;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  return ::sigaction(SIGTERM, &sa, nullptr) == 0;
}

}  // namespace erun::worker
