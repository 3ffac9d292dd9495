// The agent's watchdog, a forked process in its own session, reads the agent's
// lines: "A <pgid> <grace_ms>", "R <pgid>", "D <relay dir>", "C <commit dir>",
// "T <attach socket dir>",
// "G <ms>" (the driver is gone: keep the commit directory at least that long
// should the agent die; "G 0": a driver is back), "H" (alive). When the channel ends or the agent is silent for `silence_ms` (then
// SIGKILLed), it stops the groups it knows (SIGTERM, longest grace, SIGKILL),
// removes the relay's and the attach socket's directories and hands the commit directory to
// commit_dir.h. It never signals other groups, never removes anything else.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <string>
#include <string_view>

namespace erun::agent {

// The attach directory's files besides the socket ("attach"): where a new
// driver is, for the workers that reach it without the relay
// (ERUN_DRIVER_FILE), and that file being written. The watchdog removes all.
constexpr const char* kDriverFile = "driver";
constexpr const char* kDriverFileTemp = ".driver.tmp";

// What the watchdog knows from the lines read so far.
struct WatchdogState {
  std::map<pid_t, long> groups;  // pgid -> grace ms
  std::string relay_dir;         // the relay's private socket directory
  std::string commit_dir;        // the job's host-memory commits (agent/commit_dir.h)
  std::string attach_dir;        // the agent's attach socket's private directory
  std::string partial;           // bytes after the last newline
  // While no driver holds the job (within --driver-grace), a dead agent's
  // commit directory waits until then, not only kCommitAdoptGrace.
  std::chrono::steady_clock::time_point keep_commits_until{};

  // Applies every whole line in `bytes`; malformed lines and "H" change nothing.
  void feed(std::string_view bytes);
  void apply(std::string_view line);
};

// Forks the watchdog (spawn_helper()); returns the agent's end of its
// channel (close-on-exec), or -1 with errno set. `silence_ms` 0: the agent is never taken for silent.
int spawn_watchdog(long silence_ms);

}  // namespace erun::agent
