// The job's host-memory commit directory on this host (ERUN_COMMIT_DIR): kept
// for the next agent under a lease every agent of the job holds, removed when
// the job ends (docs/state.md, "Where a commit lives").
#pragma once

#include <chrono>
#include <string>

namespace erun::agent {

// How long a dead agent's host-memory commits wait for the driver to start
// the host again (it does at once unless the host is blacklisted or gone).
inline constexpr std::chrono::seconds kCommitAdoptGrace{10};

// Creates DIR (0700, refusing a link or a directory of another user) and
// takes a shared lock on DIR/lease. Returns the lease's descriptor
// (close-on-exec), or -1 with *error set.
int hold_commit_dir(const std::string& dir, std::string* error);

// Closes `lease_fd` (-1: none held) and removes DIR unless another agent
// holds its lease. Returns whether it removed it.
bool release_commit_dir(const std::string& dir, int lease_fd);

// For the watchdog of an agent that died: polls until `grace` passed; returns
// at once (keeping DIR) when another agent holds the lease, else removes DIR.
void adopt_or_remove_commit_dir(const std::string& dir, std::chrono::milliseconds grace);

}  // namespace erun::agent
