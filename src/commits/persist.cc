#include "commits/persist.h"

#include <algorithm>
#include <optional>
#include <vector>

#include "commits/commit_files.h"
#include "commits/host_commits.h"
#include "commits/snapshot.h"
#include "common/fd.h"
#include "common/private_files.h"
#include "erun/errors.hpp"

namespace erun::state_internal {

Persisted persist_newest(const std::string& commit_dir, const std::string& checkpoint_dir, uint64_t after,
                         std::vector<char>* scratch) {
  // Called every 100 ms while nothing is new: the directory listing alone
  // decides that; the durable file is looked at only for a candidate.
  std::optional<uint64_t> floor;  // max(after, the durable file's id), once needed
  for (const ClaimedCommit& c : claimed_commits(commit_dir)) {
    if (c.id <= after) break;  // newest first
    if (HostCommits::ordinal_of(c.name) != 0) continue;
    if (!floor) floor = std::max(after, file_commit_id(checkpoint_dir + "/" + kStateFile));
    if (c.id <= *floor) break;
    const std::string path = commit_dir + "/" + c.name;
    Fd fd = HostCommits::open_own(path);
    if (!fd) continue;
    auto listing = HostCommits::list(fd.get());
    if (!listing || (listing->flags & kRankZeroCommit) == 0 || listing->id <= *floor) continue;
    // Copied out first, at memory speed, so that the worker's next commits
    // have as little time as possible to reclaim the file under the copy;
    // then written to disk at the disk's speed from the copy.
    uint64_t total = 0;
    for (uint64_t n : listing->sizes) total += n;
    scratch->resize(total);
    std::vector<EntryRef> entries;
    uint64_t at = 0;
    for (size_t k = 0; k < listing->names.size(); ++k) {
      if (!pread_all(fd.get(), scratch->data() + at, listing->sizes[k], listing->offsets[k])) {
        return Persisted{0, path, true};  // truncated: a new State of the worker emptied it
      }
      entries.push_back(EntryRef{&listing->names[k], scratch->data() + at, listing->sizes[k]});
      at += listing->sizes[k];
    }
    if (!HostCommits::held(fd.get(), listing->id)) return Persisted{0, path, true};
    if (Status ok = ensure_private_dir(checkpoint_dir, "checkpoint directory"); !ok) {
      throw Error("erun: " + ok.message());
    }
    write_file_atomically(checkpoint_dir, kStateFile, listing->id, entries);
    return Persisted{listing->id, path, false};
  }
  return {};
}

}  // namespace erun::state_internal
