// The files of a host-memory commit directory (state/host_commits.h). Each
// starts with the snapshot header of state/snapshot.h: "ERUNSTAT", u32
// version, u32 flags, u64 commit id. Only that header is read here: the
// commit id a file claims, before anyone checks the whole file. Shared by the
// State (which file to read first) and the worker runtime (the commit a new
// worker reports in its first join). Any thread; no state.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace erun {

struct ClaimedCommit {
  uint64_t id = 0;
  std::string name;  // within the directory
};

// The prefix of buddy files: another host's workers' sharded pieces, kept
// here in case that host is lost (docs/state.md, "Sharded entries"). They
// hold pieces only, never a whole commit, so they are not commit files.
inline constexpr const char* kBuddyPrefix = "buddy-";

// Whether `name` is one of a commit file pair's names (STEM.a, STEM.b); a
// buddy file is not, unless `buddies`.
bool commit_file_name(const std::string& name, bool buddies = false);

// The *.a and *.b files of `dir` whose header claims a commit, newest first
// (ties by name); empty when there is none or no such directory. Links are
// not followed. `buddies`: the buddy files too.
std::vector<ClaimedCommit> claimed_commits(const std::string& dir, bool buddies = false);

}  // namespace erun
