// fork_detached: how the agent starts its helper processes (the watchdog, the
// persister, the commit replica keeper and pushers), which must outlive it
// and ignore the terminal's signals.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string_view>

namespace erun::agent {

// Forks. In the child: its own session; SIGINT, SIGHUP, SIGTERM, SIGPIPE and
// SIGQUIT ignored, SIGCHLD default, no signal blocked; stdin and stdout (and
// stderr unless `keep_stderr`) on /dev/null; `child_end` as descriptor 3 and
// every other descriptor closed. Returns what fork() does: the child's pid,
// 0 in the child, -1 with errno set.
pid_t fork_detached(int child_end, bool keep_stderr);

// A helper that talks with the agent over a socketpair (the watchdog, the
// persister, the keeper, a pusher): forks it detached (fork_detached(), with
// `keep_stderr`: the agent's, so that its errors reach the driver) and runs
// `body(3)` in it, its end of the channel; `body` must not return. Returns
// the agent's end (close-on-exec), or -1 with errno set.
// `first`: bytes the helper finds on its channel before anything else,
// written before it starts (a helper killed or ended right after its start
// still had them).
int spawn_helper(const std::function<void(int channel)>& body, bool keep_stderr = true, std::string_view first = {});

// Where the stderr of the helpers forked from now on goes when they keep it:
// `fd` (the agent's pipe, which it copies to its own stderr while that is
// the driver's), or the caller's own stderr when -1. A helper that held
// erun's stderr itself would keep a pipe from erun (`erun ... | tee`) open
// after erun is gone, through the whole --driver-grace.
void route_helper_stderr(int fd);

// Ends a helper started by spawn_helper(): EOF on its channel, then waits up
// to `wait` for its end of the channel to close (it exited). Closes `fd`.
void stop_helper(int fd, std::chrono::milliseconds wait);

}  // namespace erun::agent
