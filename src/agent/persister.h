// The host side's persister: with --checkpoint-dir, a process the agent forks
// that writes the newest host-memory commit of the job's rank 0 to disk in
// the background (commits/persist.h), at most once per interval, so that no
// worker waits for a disk. It runs in its own session and outlives the agent
// long enough to write the last commit: when its channel ends (the agent
// asked it to stop, or died) it persists the newest commit once more and
// exits. It never removes anything; the commit directory's files it reads
// stay readable after they are unlinked.
#pragma once

#include <chrono>
#include <string>

namespace erun::agent {

struct PersisterOptions {
  std::string commit_dir;      // ERUN_COMMIT_DIR
  std::string checkpoint_dir;  // absolute
  std::chrono::milliseconds interval{5000};
  std::string me;  // for log lines: "agent on HOST (pid N)"
};

// Forks the persister (spawn_helper()). Returns the agent's end of its channel
// (close-on-exec) or -1 with errno set. stop_helper() asks it to write the
// newest commit and exit, and waits for that.
int spawn_persister(const PersisterOptions& options);

}  // namespace erun::agent
