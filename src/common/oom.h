// OomWatch: whether the kernel's OOM killer ended a process. The kernel says
// nothing of it in the exit status (a SIGKILL like any other), so a watch
// taken while the process runs notes its memory cgroup (v2, or v1's memory
// controller) and that cgroup's count of OOM kills; a SIGKILL after which the
// count rose is taken for the OOM killer's. A zombie has left its cgroup
// already, so the watch must be taken while the process lives (at its start).
// The count is the cgroup's: when several of its processes were SIGKILLed
// while it rose, each is said to be the OOM killer's. Any thread; no state
// beyond the watch itself.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

namespace erun {

class OomWatch {
 public:
  OomWatch() = default;
  // The watch of a live process; an empty one (fired() false) where its
  // memory cgroup or its OOM count cannot be read.
  static OomWatch of(pid_t pid);
  // A watch of the cgroup that `proc_cgroup` (a /proc/PID/cgroup's text)
  // names, its files under the mounts that `proc_mounts` (/proc/self/mounts's
  // text) lists; for tests of the parsing.
  static OomWatch of(const std::string& proc_cgroup, const std::string& proc_mounts);

  // The file whose "oom_kill N" line is read: memory.events (v2) or
  // memory.oom_control (v1); "" for an empty watch.
  const std::string& counter_file() const { return file_; }
  // Whether the cgroup's OOM kill count is above what it was at the watch.
  bool fired() const;

  // The "oom_kill N" count in a memory.events or memory.oom_control text.
  static std::optional<uint64_t> parse_count(const std::string& text);

 private:
  std::string file_;
  uint64_t at_start_ = 0;
};

}  // namespace erun
