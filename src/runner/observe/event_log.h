// EventLog: the job's history as JSON lines (--event-log FILE), one object per
// event with an ISO timestamp, seconds since start, the event name and its
// fields. Each line goes out in one append write, so a crash never leaves half
// a line. A disabled log (no file, no observer) costs nothing. Driver thread only.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/status.h"

namespace erun {

class EventLog {
 public:
  // A field: name and an already-encoded JSON value (use json_string/json_number).
  using Field = std::pair<std::string, std::string>;

  EventLog() = default;
  ~EventLog();
  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;
  Status open(const std::string& path);
  bool enabled() const { return fd_ >= 0; }
  // Also hands every line (without its newline) to `observer`, file or not:
  // the job's account (job_account.h) reads the same lines a report does.
  void set_observer(std::function<void(std::string_view)> observer) { observer_ = std::move(observer); }
  void write(const std::string& event, const std::vector<Field>& fields);

 private:
  int fd_ = -1;
  std::function<void(std::string_view)> observer_;
  TimePoint start_ = std::chrono::steady_clock::now();
};

std::string json_string(const std::string& s);
std::string json_number(double v);
std::string json_number(long v);

}  // namespace erun
