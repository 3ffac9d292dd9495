#include "state/host_commits.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "common/commit_files.h"
#include "common/private_files.h"
#include "erun/errors.hpp"

namespace erun::state_internal {
namespace {

constexpr const char* kSuffix[2] = {".a", ".b"};

std::string dir_of(const std::string& stem) {
  auto slash = stem.rfind('/');
  return slash == std::string::npos ? std::string(".") : stem.substr(0, slash);
}

// Sequential pwrite()s from offset 0; the first error stops it.
class PwriteSink final : public BufferedSink {
 public:
  explicit PwriteSink(int fd) : BufferedSink(64 << 10), fd_(fd) {}
  int error() const { return err_; }

 private:
  void put(const char* p, size_t n) override {
    while (n > 0 && err_ == 0) {
      ssize_t w = ::pwrite(fd_, p, n, static_cast<off_t>(offset_));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        err_ = w < 0 ? errno : EIO;
        return;
      }
      p += w;
      n -= static_cast<size_t>(w);
      offset_ += static_cast<size_t>(w);
    }
  }
  int fd_;
  size_t offset_ = 0;
  int err_ = 0;
};

size_t encoded_size(const std::vector<EntryRef>& entries) {
  size_t total = 8 + 4 + 4 + 8 + 8 + 4;
  for (const EntryRef& e : entries) total += 16 + e.name->size() + e.data->size();
  return total;
}

}  // namespace

HostCommits::HostCommits(std::string stem) : stem_(std::move(stem)) {}

HostCommits::~HostCommits() {
  for (int fd : fd_) {
    if (fd >= 0) ::close(fd);
  }
}

void HostCommits::open_files() {
  opened_ = true;
  const std::string dir = dir_of(stem_);
  DirPolicy policy;
  policy.refuse_link = true;
  if (Status ok = ensure_private_dir(dir, "host-memory commit directory", policy); !ok) {
    throw Error("erun: " + ok.message());
  }
  for (int i = 0; i < 2; ++i) {
    const std::string path = stem_ + kSuffix[i];
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
      throw Error(fmt::format("erun: cannot open host-memory commit file {}: {}{}", path, std::strerror(errno),
                              errno == ELOOP ? " (a symbolic link: erun never writes through one; remove it)" : ""));
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) {
      ::close(fd);
      throw Error(fmt::format("erun: host-memory commit file {} is not a regular file owned by this user; "
                              "remove it",
                              path));
    }
    fd_[i] = fd;
    // What a previous worker of this slot left: keep its newest commit whole.
    std::vector<char> bytes;
    try {
      if (read_file(path, &bytes) && !bytes.empty()) held_[i] = decode(bytes.data(), bytes.size(), path).commit_id;
    } catch (const Error&) {
      held_[i] = 0;  // torn or foreign: the first file to overwrite
    }
  }
}

std::optional<std::string> HostCommits::write(uint64_t commit_id, const std::vector<EntryRef>& entries) {
  if (!opened_) open_files();
  const int i = held_[0] <= held_[1] ? 0 : 1;
  const std::string path = stem_ + kSuffix[i];
  const size_t size = encoded_size(entries);
  held_[i] = 0;
  auto failed = [&](int err) {
    return fmt::format(
        "erun: host-memory commit {} was not written to {}: {}; the previous commit stays in {}{}", commit_id,
        path, std::strerror(err), stem_ + kSuffix[1 - i],
        err == ENOSPC ? fmt::format(". {} needs room for 2 copies of the state ({} bytes each) per worker of this "
                                    "host: enlarge it (e.g. docker run --shm-size) or free space there",
                                    dir_of(stem_), size)
                      : "");
  };
  // Reserve the pages first: a full /dev/shm fails here, before a byte of
  // the file changes, never later with SIGBUS or half a file. Pages this
  // file already holds stay reserved from commit to commit.
  if (size > reserved_[i]) {
    if (int err = ::posix_fallocate(fd_[i], 0, static_cast<off_t>(size)); err != 0 && err != EOPNOTSUPP) {
      return failed(err);
    }
  }
  if (::ftruncate(fd_[i], static_cast<off_t>(size)) != 0) return failed(errno);
  reserved_[i] = size;
  PwriteSink sink(fd_[i]);
  encode(commit_id, entries, sink);
  sink.flush();
  if (sink.error() != 0) return failed(sink.error());
  held_[i] = commit_id;
  return std::nullopt;
}

std::optional<std::string> HostCommits::room_warning(const std::vector<EntryRef>& entries, int workers) const {
  const size_t bytes = encoded_size(entries);
  const std::string dir = dir_of(stem_);
  struct statvfs fs {};
  if (::statvfs(dir.c_str(), &fs) != 0) return std::nullopt;
  const unsigned long long free_bytes = static_cast<unsigned long long>(fs.f_bavail) * fs.f_frsize;
  unsigned long long held = 0;  // this job's files count as room: they are overwritten
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      struct stat st {};
      if (::fstatat(::dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode)) {
        held += static_cast<unsigned long long>(st.st_blocks) * 512;
      }
    }
    ::closedir(d);
  }
  const unsigned long long need = 2ULL * bytes * static_cast<unsigned long long>(std::max(workers, 1));
  if (free_bytes + held >= need) return std::nullopt;
  auto mib = [](unsigned long long b) { return static_cast<double>(b) / (1 << 20); };
  return fmt::format(
      "erun: {} has {:.0f} MiB free, but host-memory commits need 2 copies of the state ({:.1f} MiB) for each "
      "of the {} worker(s) on this host, {:.0f} MiB: commits that do not fit are kept only in worker memory. "
      "Enlarge it (e.g. docker run --shm-size={}m) or pass --no-host-commits",
      dir_of(dir), mib(free_bytes + held), mib(bytes), std::max(workers, 1), mib(need),
      static_cast<unsigned long long>(mib(need)) + 64);
}

std::optional<HostCommits::Found> HostCommits::newest(const std::string& dir) {
  for (const ClaimedCommit& c : claimed_commits(dir)) {
    const std::string path = dir + "/" + c.name;
    std::vector<char> bytes;
    try {
      if (!read_file(path, &bytes)) continue;
      Found f{decode(bytes.data(), bytes.size(), "host-memory commit file " + path), path};
      return f;
    } catch (const Error&) {
      continue;  // torn by a worker killed while writing it, or not ours
    }
  }
  return std::nullopt;
}

}  // namespace erun::state_internal
