#include "commits/persist.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include "commits/commit_files.h"
#include "commits/host_commits.h"
#include "commits/snapshot.h"
#include "common/fd.h"
#include "common/private_files.h"
#include "erun/errors.hpp"

namespace erun::state_internal {
namespace {

bool pread_all(int fd, char* out, uint64_t n, uint64_t offset) {
  while (n > 0) {
    ssize_t r = ::pread(fd, out, std::min<uint64_t>(n, uint64_t{1} << 30), static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    out += r;
    n -= static_cast<uint64_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return true;
}

}  // namespace

Persisted persist_newest(const std::string& commit_dir, const std::string& checkpoint_dir, uint64_t after,
                         std::vector<char>* scratch) {
  if (Status ok = ensure_private_dir(checkpoint_dir, "checkpoint directory"); !ok) throw Error("erun: " + ok.message());
  const uint64_t floor = std::max(after, file_commit_id(checkpoint_dir + "/" + kStateFile));
  for (const ClaimedCommit& c : claimed_commits(commit_dir)) {
    if (c.id <= floor) break;  // newest first
    if (HostCommits::ordinal_of(c.name) != 0) continue;
    const std::string path = commit_dir + "/" + c.name;
    Fd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    struct stat st {};
    if (fd.get() < 0 || ::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) continue;
    auto listing = HostCommits::list(fd.get());
    if (!listing || (listing->flags & kRankZeroCommit) == 0 || listing->id <= floor) continue;
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
    write_file_atomically(checkpoint_dir, kStateFile, listing->id, entries);
    return Persisted{listing->id, path, false};
  }
  return {};
}

}  // namespace erun::state_internal
