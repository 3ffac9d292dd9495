#include "runner/observe/event_log.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>

#include "common/private_files.h"

namespace erun {

EventSink& no_events() {
  static NoEvents none;
  return none;
}

EventLog::~EventLog() {
  if (fd_ >= 0) ::close(fd_);
}

Status EventLog::open(const std::string& path) {
  Result<int> fd = open_private_append(path, "--event-log");
  if (!fd) return fd.status();
  fd_ = fd.value();
  return Status::ok();
}

void EventLog::emit(const Event& event) {
  if (fd_ < 0 && !observer_) return;
  // erun's wall clock (realtime_seconds()): a step of the system clock does
  // not break the job's account, which is read from these stamps. Both to
  // the millisecond, as the line says them: the account reads the same
  // stamps live as from the file.
  Stamp stamp;
  stamp.time = std::round(realtime_seconds() * 1000) / 1000;
  stamp.t = std::round(seconds(std::chrono::steady_clock::now() - start_) * 1000) / 1000;
  if (observer_) observer_(stamp, event);
  if (fd_ < 0) return;
  const std::string line = event_line(stamp, event) + "\n";
  ssize_t n;
  do {
    n = ::write(fd_, line.data(), line.size());
  } while (n < 0 && errno == EINTR);
}

}  // namespace erun
