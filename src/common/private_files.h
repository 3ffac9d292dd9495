// Files and directories that erun creates on a user's behalf (durable
// checkpoints, the event log, per-rank output files, file-store keys): never
// through a symbolic link planted at the name, with private modes (0600 files,
// 0700 directories), and never inside a directory another user can change
// unless asked to allow it. Every error names the path, the role (`what`, e.g.
// "checkpoint directory") and what to do. Thread-safe (no shared state).
#pragma once

#include <string>

#include "common/status.h"

namespace erun {

struct DirPolicy {
  // Refuse a directory that group or others may write to, unless its sticky
  // bit stops them from removing or renaming this user's files.
  bool refuse_shared_write = true;
  // Refuse a symbolic link as the directory itself (its parents may be links).
  bool refuse_link = false;
};

// Creates `dir` when missing (parents as by mkdir -p, the directory itself
// 0700), then checks it as check_private_dir.
Status ensure_private_dir(const std::string& dir, const std::string& what, DirPolicy policy = {});
// `fd` is `dir` opened with O_DIRECTORY: a directory owned by this user
// (the effective uid) and, per `policy`, not writable by other users.
Status check_private_dir(int fd, const std::string& dir, const std::string& what, DirPolicy policy = {});

// Opens `path` for appending (O_CLOEXEC), creating it 0600 when missing.
// Refuses a symbolic link at `path` and anything but a regular file owned
// by this user. Returns the descriptor.
Result<int> open_private_append(const std::string& path, const std::string& what);

// Creates a new file in the directory open as `dirfd`, named `prefix`
// followed by random hex digits, with O_CREAT|O_EXCL|O_NOFOLLOW and mode
// 0600, so a file or link planted at a guessed name is never used. Returns
// the descriptor (O_WRONLY|O_CLOEXEC) and sets *name (without the directory).
Result<int> create_private_temp(int dirfd, const std::string& dir, const std::string& prefix, std::string* name);

}  // namespace erun
