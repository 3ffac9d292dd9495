#include "agent/commit_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "common/private_files.h"

namespace erun::agent {
namespace {

constexpr const char* kLease = "lease";

// Every entry of DIR, then DIR; without following links.
void remove_dir(const std::string& dir) {
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0) return;
  DIR* d = ::fdopendir(dfd);
  if (d == nullptr) {
    ::close(dfd);
    return;
  }
  while (dirent* e = ::readdir(d)) {
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    ::unlinkat(dfd, e->d_name, 0);
  }
  ::closedir(d);
  ::rmdir(dir.c_str());
}

// True when no agent holds DIR's lease (or there is none). With `keep`, the
// exclusive lock stays held on *keep until the caller closes it.
bool unheld(const std::string& dir, int* keep) {
  int fd = ::open((dir + "/" + kLease).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT;
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return false;
  }
  if (keep) {
    *keep = fd;
  } else {
    ::close(fd);
  }
  return true;
}

}  // namespace

int hold_commit_dir(const std::string& dir, std::string* error) {
  DirPolicy policy;
  policy.refuse_link = true;
  if (Status ok = ensure_private_dir(dir, "host-memory commit directory", policy); !ok) {
    *error = ok.message();
    return -1;
  }
  const std::string path = dir + "/" + kLease;
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    *error = path + ": " + std::strerror(errno);
    return -1;
  }
  if (::flock(fd, LOCK_SH) != 0) {
    *error = path + ": flock: " + std::strerror(errno);
    ::close(fd);
    return -1;
  }
  return fd;
}

bool release_commit_dir(const std::string& dir, int lease_fd) {
  if (lease_fd >= 0) ::close(lease_fd);  // drops this agent's shared lock
  // Two agents ending together: each sees the other's lock once; the one
  // that looks last removes the directory.
  for (int attempt = 0; attempt < 3; ++attempt) {
    int lock = -1;
    if (unheld(dir, &lock)) {
      remove_dir(dir);
      if (lock >= 0) ::close(lock);
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

void adopt_or_remove_commit_dir(const std::string& dir, std::chrono::milliseconds grace) {
  if (::access(dir.c_str(), F_OK) != 0) return;  // removed already (the agent ended normally)
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (std::chrono::steady_clock::now() < deadline) {
    if (!unheld(dir, nullptr)) return;  // another agent of the job took it over
    ::usleep(200 * 1000);
  }
  int lock = -1;
  if (unheld(dir, &lock)) remove_dir(dir);
  if (lock >= 0) ::close(lock);
}

}  // namespace erun::agent
