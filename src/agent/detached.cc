#include "agent/detached.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include "common/subprocess.h"

namespace erun::agent {

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
  if (child_end != 3) {
    ::dup2(child_end, 3);
  } else {
    ::fcntl(3, F_SETFD, 0);
  }
  close_from(4);
  return 0;
}

}  // namespace erun::agent
