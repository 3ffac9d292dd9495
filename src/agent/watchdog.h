// The agent's watchdog, a forked process in its own session, reads the agent's
// lines: "A <pgid> <grace_ms>", "R <pgid>", "D <relay dir>", "C <commit dir>",
// "T <attach socket dir>", "O" (with the descriptor of the agent's channel to
// its driver: send_channel_to_watchdog()), "o" (no channel now), "E" (the
// agent ends on purpose),
// "G <ms>" (the driver is gone: keep the commit directory at least that long
// should the agent die; "G 0": a driver is back), "H" (alive). When the channel ends or the agent is silent for `silence_ms` (then
// SIGKILLed), it stops the groups it knows (SIGTERM, longest grace, SIGKILL),
// removes the relay's and the attach socket's directories and hands the commit directory to
// commit_dir.h. It never signals other groups, never removes anything else.
// When the channel ends without "E" (the agent was SIGKILLed, or crashed), it
// first writes ENDED (agent/protocol.h) on the agent's driver channel: over
// ssh the driver would only see ssh's exit 255. ENDED says whether the OOM
// kill count of the agent's memory cgroup rose since the agent was last
// heard. It holds that channel only until then, or until "o" or "E".
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
  bool ended_on_purpose = false;  // "E": the agent ends by its own decision
  bool channel_dropped = false;   // "o" since the last descriptor came (listen() closes it)

  // Applies every whole line in `bytes`; malformed lines and "H" change nothing.
  void feed(std::string_view bytes);
  void apply(std::string_view line);
};

// Forks the watchdog (spawn_helper()); returns the agent's end of its
// channel (close-on-exec), or -1 with errno set. `silence_ms` 0: the agent is never taken for silent.
// `first_lines`: what it must know from its start (the groups, the
// directories), in its channel before it runs: an agent killed right after
// starting it leaves nothing it had not told.
int spawn_watchdog(long silence_ms, std::string_view first_lines = {});

// Hands the watchdog (its channel `watchdog_fd`) a copy of the agent's
// channel to its driver, `channel_fd`, with an "O" line; -1 says "o" (no
// channel: the watchdog lets go of its copy). False when it could not send.
bool send_channel_to_watchdog(int watchdog_fd, int channel_fd);

}  // namespace erun::agent
