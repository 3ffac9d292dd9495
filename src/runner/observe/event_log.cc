#include "runner/observe/event_log.h"

#include <cmath>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include <fmt/format.h>

#include "common/private_files.h"

namespace erun {

EventLog::~EventLog() {
  if (fd_ >= 0) ::close(fd_);
}

Status EventLog::open(const std::string& path) {
  Result<int> fd = open_private_append(path, "--event-log");
  if (!fd) return fd.status();
  fd_ = fd.value();
  return Status::ok();
}

void EventLog::write(const std::string& event, const std::vector<Field>& fields) {
  if (fd_ < 0 && !observer_) return;
  // erun's wall clock (realtime_seconds()): a step of the system clock
  // does not break the job's account, which is read from these stamps.
  const long ms_since_epoch = std::lround(realtime_seconds() * 1000);
  const time_t sec = static_cast<time_t>(ms_since_epoch / 1000);
  tm utc;
  gmtime_r(&sec, &utc);
  char when[32];
  strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &utc);
  std::string line = fmt::format("{{\"time\":\"{}.{:03d}Z\",\"t\":{:.3f},\"event\":{}", when,
                                 static_cast<int>(ms_since_epoch % 1000),
                                 seconds(std::chrono::steady_clock::now() - start_), json_string(event));
  for (auto& [k, v] : fields) line += fmt::format(",{}:{}", json_string(k), v);
  line += "}";
  if (observer_) observer_(line);
  if (fd_ < 0) return;
  line += "\n";
  ssize_t n;
  do {
    n = ::write(fd_, line.data(), line.size());
  } while (n < 0 && errno == EINTR);
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) out += fmt::format("\\u{:04x}", c);
        else out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string json_number(double v) { return fmt::format("{:.6g}", v); }
std::string json_number(long v) { return fmt::format("{}", v); }

}  // namespace erun
