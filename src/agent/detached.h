// fork_detached: how the agent starts its helper processes (the watchdog, the
// persister), which must outlive it and ignore the terminal's signals.
#pragma once

#include <sys/types.h>

namespace erun::agent {

// Forks. In the child: its own session; SIGINT, SIGHUP, SIGTERM, SIGPIPE and
// SIGQUIT ignored, SIGCHLD default, no signal blocked; stdin and stdout (and
// stderr unless `keep_stderr`) on /dev/null; `child_end` as descriptor 3 and
// every other descriptor closed. Returns what fork() does: the child's pid,
// 0 in the child, -1 with errno set.
pid_t fork_detached(int child_end, bool keep_stderr);

}  // namespace erun::agent
