#include "commits/commit_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace erun {
namespace {

uint64_t claimed_id(int dirfd, const char* name) {
  int fd = ::openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return 0;
  unsigned char h[24];
  const ssize_t r = ::pread(fd, h, sizeof h, 0);
  ::close(fd);
  if (r != static_cast<ssize_t>(sizeof h) || std::memcmp(h, "ERUNSTAT", 8) != 0) return 0;
  uint64_t id = 0;
  for (int i = 7; i >= 0; --i) id = (id << 8) | h[16 + i];
  return id;
}

}  // namespace

bool commit_file_name(const std::string& name, bool buddies) {
  return name.size() >= 3 && name[name.size() - 2] == '.' && (name.back() == 'a' || name.back() == 'b') &&
         (buddies || name.rfind(kBuddyPrefix, 0) != 0);
}

std::vector<ClaimedCommit> claimed_commits(const std::string& dir, bool buddies) {
  std::vector<ClaimedCommit> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    if (!commit_file_name(e->d_name, buddies)) continue;
    if (uint64_t id = claimed_id(::dirfd(d), e->d_name); id > 0) out.push_back({id, e->d_name});
  }
  ::closedir(d);
  std::sort(out.begin(), out.end(), [](const ClaimedCommit& x, const ClaimedCommit& y) {
    return x.id != y.id ? x.id > y.id : x.name < y.name;
  });
  return out;
}

}  // namespace erun
