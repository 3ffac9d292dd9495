// Host-memory commits: each worker keeps its newest commit in two files of a
// private per-job directory in host memory (/dev/shm, named by the driver,
// made 0700 by the first worker that needs it, removed by the host's agent or
// its watchdog when the job ends). The files outlive the worker that wrote
// them, so when every worker of a generation died the next one restores the
// newest complete commit its host holds (docs/state.md, "Where a commit
// lives").
//
// A worker's files are STEM.a and STEM.b, each one encoded snapshot
// (snapshot.h, CRC-32C over all of it). A commit overwrites the file that
// does not hold the newest valid commit, so a worker killed while writing
// leaves the other file whole, and a torn file fails its checksum. Files are
// 0600, opened with O_NOFOLLOW and checked to be regular files of this user.
// One object per worker, used from the training thread only.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "state/snapshot.h"

namespace erun::state_internal {

class HostCommits {
 public:
  // `stem`: DIR/NAME; DIR is created (0700) when missing.
  explicit HostCommits(std::string stem);
  ~HostCommits();
  HostCommits(const HostCommits&) = delete;
  HostCommits& operator=(const HostCommits&) = delete;

  // Writes the commit into the file that does not hold the newest valid one.
  // On failure (e.g. /dev/shm full) returns the error, naming the file and
  // what to do; the file holding the previous commit is untouched.
  std::optional<std::string> write(uint64_t commit_id, const std::vector<EntryRef>& entries);

  // Before the first write: whether the directory's file system has room
  // for two files of `entries` for each of `workers` workers on this host
  // (what is already allocated to this job's files counts as room). The
  // warning names the sizes and what to do; nullopt when there is room.
  std::optional<std::string> room_warning(const std::vector<EntryRef>& entries, int workers) const;

  struct Found {
    Snapshot snapshot;
    std::string path;
  };
  // The newest commit that a file in `dir` holds whole (its checksum right);
  // torn, foreign or unreadable files are skipped. nullopt when there is none
  // or no such directory.
  static std::optional<Found> newest(const std::string& dir);

  const std::string& stem() const { return stem_; }

 private:
  void open_files();

  std::string stem_;
  int fd_[2] = {-1, -1};
  uint64_t held_[2] = {0, 0};      // the commit id each file holds whole (0: none)
  size_t reserved_[2] = {0, 0};    // bytes of each file known to be allocated
  bool opened_ = false;
};

}  // namespace erun::state_internal
