#include "agent/persister.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include <fmt/format.h>

#include "agent/detached.h"
#include "commits/persist.h"
#include "common/log.h"
#include "erun/errors.hpp"

namespace erun::agent {
namespace {

// "12.5 MiB" free to this user on the file system of `dir`, or "? MiB".
std::string free_space(const std::string& dir) {
  struct statvfs fs {};
  if (::statvfs(dir.c_str(), &fs) != 0) return "? MiB";
  return fmt::format("{:.1f} MiB", static_cast<double>(fs.f_bavail) * static_cast<double>(fs.f_frsize) / (1 << 20));
}

using SteadyClock = std::chrono::steady_clock;
namespace si = erun::state_internal;

class Persister {
 public:
  Persister(PersisterOptions o, int channel) : o_(std::move(o)), channel_(channel) {}

  [[noreturn]] void run() {
    bool last = false;
    while (!last) {
      last = wait_turn();
      // The final pass retries a commit whose worker began to overwrite it:
      // the newer one is then whole or about to be.
      for (int attempt = 0; attempt < (last ? 20 : 1); ++attempt) {
        if (!persist_once() || !last) break;
        ::usleep(10 * 1000);
      }
    }
    ::_exit(0);
  }

 private:
  // Waits for the next turn: 100 ms from now, or the interval after the
  // last write if that is later. True when the channel ended meanwhile.
  bool wait_turn() {
    const auto turn = std::max(SteadyClock::now() + std::chrono::milliseconds(100), last_write_ + o_.interval);
    while (true) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(turn - SteadyClock::now()).count();
      if (left <= 0) return false;
      pollfd p{channel_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left) + 1) <= 0) continue;
      char byte;
      ssize_t n = ::read(channel_, &byte, 1);
      if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) return true;
    }
  }

  // One attempt; true when the commit was overwritten under the copy.
  bool persist_once() {
    const auto started = SteadyClock::now();
    try {
      si::Persisted p = si::persist_newest(o_.commit_dir, o_.checkpoint_dir, written_, &scratch_);
      if (p.id != 0) {
        written_ = p.id;
        last_write_ = started;
        if (!failing_.empty()) {
          ERUN_LOG_INFO("{}: background persistence works again: commit {} is in {}", o_.me, p.id,
                        o_.checkpoint_dir);
        }
        failing_.clear();
        ERUN_LOG_DEBUG("{}: persisted commit {} from {} to {}", o_.me, p.id, p.from, o_.checkpoint_dir);
      }
      return p.raced;
    } catch (const Error& e) {
      // Said once per distinct failure; the next interval tries again. The
      // file on disk is the last commit written whole (written atomically).
      if (e.what() != failing_) {
        ERUN_LOG_ERROR("{}: background persistence: {} ({} free there); {} keeps {} whole, and erun tries again "
                       "every --persist-interval",
                       o_.me, e.what(), free_space(o_.checkpoint_dir), o_.checkpoint_dir,
                       written_ ? fmt::format("commit {}", written_) : std::string("what it held"));
      }
      failing_ = e.what();
      last_write_ = started;
      return false;
    }
  }

  PersisterOptions o_;
  int channel_;
  uint64_t written_ = 0;
  SteadyClock::time_point last_write_{};
  std::string failing_;
  std::vector<char> scratch_;  // the commit being persisted
};

}  // namespace

int spawn_persister(const PersisterOptions& options) {
  return spawn_helper([&options](int channel) { Persister(options, channel).run(); });
}

}  // namespace erun::agent
