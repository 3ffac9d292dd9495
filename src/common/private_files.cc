#include "common/private_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>

#include <fmt/format.h>

namespace erun {
namespace {

std::string mode_text(mode_t m) { return fmt::format("{:04o}", static_cast<unsigned>(m & 07777)); }

}  // namespace

Status check_private_dir(int fd, const std::string& dir, const std::string& what, DirPolicy policy) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    return Status::error(fmt::format("{} {}: cannot stat: {}", what, dir, std::strerror(errno)));
  }
  if (!S_ISDIR(st.st_mode)) return Status::error(fmt::format("{} {} is not a directory", what, dir));
  if (st.st_uid != ::geteuid()) {
    return Status::error(fmt::format(
        "{} {} is owned by uid {}, not by this user (uid {}); another user could replace what erun writes there: "
        "use a directory you own",
        what, dir, static_cast<unsigned>(st.st_uid), static_cast<unsigned>(::geteuid())));
  }
  if (policy.refuse_shared_write && (st.st_mode & (S_IWGRP | S_IWOTH)) != 0 && (st.st_mode & S_ISVTX) == 0) {
    return Status::error(fmt::format(
        "{} {} is writable by other users (mode {}) and has no sticky bit, so they could plant or replace files "
        "in it: run 'chmod go-w {}' (or 'chmod +t {}'), or use a directory only you can write",
        what, dir, mode_text(st.st_mode), dir, dir));
  }
  return Status::ok();
}

Status ensure_private_dir(const std::string& dir, const std::string& what, DirPolicy policy) {
  if (dir.empty()) return Status::error(what + ": empty path");
  std::error_code ec;
  const std::filesystem::path p(dir);
  if (p.has_parent_path() && p.parent_path() != p) std::filesystem::create_directories(p.parent_path(), ec);
  if (ec) return Status::error(fmt::format("cannot create the parent of {} {}: {}", what, dir, ec.message()));
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return Status::error(fmt::format("cannot create {} {}: {}", what, dir, std::strerror(errno)));
  }
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | (policy.refuse_link ? O_NOFOLLOW : 0));
  if (fd < 0 && policy.refuse_link && (errno == ELOOP || errno == ENOTDIR) && std::filesystem::is_symlink(p, ec)) {
    return Status::error(fmt::format("{} {} is a symbolic link; erun does not write through links: remove it",
                                     what, dir));
  }
  if (fd < 0) return Status::error(fmt::format("cannot open {} {}: {}", what, dir, std::strerror(errno)));
  Status s = check_private_dir(fd, dir, what, policy);
  ::close(fd);
  return s;
}

Result<int> open_private_append(const std::string& path, const std::string& what) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    if (errno == ELOOP) {
      return Result<int>::error(fmt::format("{} {} is a symbolic link; erun does not write through links: "
                                            "remove it or give another path",
                                            what, path));
    }
    return Result<int>::error(fmt::format("{} {}: cannot open for appending: {}", what, path, std::strerror(errno)));
  }
  struct stat st {};
  std::string problem;
  if (::fstat(fd, &st) != 0) {
    problem = std::string("cannot stat: ") + std::strerror(errno);
  } else if (!S_ISREG(st.st_mode)) {
    problem = "is not a regular file";
  } else if (st.st_uid != ::geteuid()) {
    problem = fmt::format("is owned by uid {}, not by this user: remove it or give another path",
                          static_cast<unsigned>(st.st_uid));
  }
  if (!problem.empty()) {
    ::close(fd);
    return Result<int>::error(fmt::format("{} {} {}", what, path, problem));
  }
  return fd;
}

Result<int> create_private_temp(int dirfd, const std::string& dir, const std::string& prefix, std::string* name) {
  std::random_device rd;
  for (int attempt = 0; attempt < 8; ++attempt) {
    *name = fmt::format("{}{:08x}{:08x}", prefix, rd(), rd());
    int fd = ::openat(dirfd, name->c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0) return fd;
    if (errno != EEXIST) {
      return Result<int>::error(fmt::format("cannot create {}/{}: {}", dir, *name, std::strerror(errno)));
    }
  }
  return Result<int>::error(fmt::format("cannot create a temporary file {}/{}*: every name tried exists", dir, prefix));
}

}  // namespace erun
