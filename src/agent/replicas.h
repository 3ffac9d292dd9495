// The agent's side of commit replicas (commits/replica.h; docs/state.md,
// "Replicas on spare hosts"): processes the agent forks, as it forks the
// persister, so that the agent's loop never waits for a commit's bytes.
// - The keeper, on a host of the job that runs no worker: listens on a TCP
//   port of every address and stores the commits a holder pushes into the
//   host's commit directory.
// - The pusher, on a host whose workers commit: pushes the newest commits of
//   the host's commit directory to one keeper, every 100 ms that one is new.
// Each ends when its channel to the agent ends (the agent exited or stopped
// it), within a poll's time even in the middle of an exchange.
#pragma once

#include <chrono>
#include <string>

namespace erun::agent {

struct KeeperProcess {
  int channel = -1;  // the agent's end (close-on-exec); -1: not started
  int port = 0;      // where it listens
};

// Forks the keeper for `commit_dir` (which this agent holds) under the job
// `secret` (spawn_helper()). On failure returns channel -1 and sets `error`.
KeeperProcess spawn_keeper(const std::string& commit_dir, const std::string& secret, const std::string& me,
                           std::string* error);

// Forks a pusher from `commit_dir` to the keeper at `host`:`port` whose
// commit directory is `keeper_dir` (spawn_helper()). Returns the agent's end
// of its channel (close-on-exec) or -1 with errno set.
int spawn_pusher(const std::string& commit_dir, const std::string& secret, const std::string& host, int port,
                 const std::string& keeper_dir, const std::string& me);

// How long stop_helper() waits for a keeper or a pusher: it ends within a
// poll's time, even in the middle of an exchange.
inline constexpr std::chrono::milliseconds kReplicaStopWait{2000};

}  // namespace erun::agent
