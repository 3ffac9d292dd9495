// Where the driver's events go. The driver hands every event (events.h) to an
// EventSink, which is never null: no_events() drops them, EventLog stamps them,
// hands them to its observer as they are (the job's account, job_account.h)
// and appends them to the --event-log FILE as JSON lines, one object per
// event with an ISO timestamp, seconds since start, the event name and its
// fields. Each line goes out in one append write, so a crash never leaves
// half a line. Driver thread only.
#pragma once

#include <functional>
#include <string>
#include <utility>

#include "common/clock.h"
#include "common/status.h"
#include "runner/observe/events.h"

namespace erun {

class EventSink {
 public:
  virtual ~EventSink() = default;
  virtual void emit(const Event& event) = 0;
};

// The sink of a driver that writes no events (unit tests): drops them.
class NoEvents final : public EventSink {
 public:
  void emit(const Event&) override {}
};
// One for every such driver (it holds nothing).
EventSink& no_events();

class EventLog final : public EventSink {
 public:
  EventLog() = default;
  ~EventLog() override;
  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;
  Status open(const std::string& path);
  bool enabled() const { return fd_ >= 0; }
  // Also hands every event, stamped, to `observer`, file or not.
  void set_observer(std::function<void(const Stamp&, const Event&)> observer) { observer_ = std::move(observer); }
  void emit(const Event& event) override;

 private:
  int fd_ = -1;
  std::function<void(const Stamp&, const Event&)> observer_;
  TimePoint start_ = std::chrono::steady_clock::now();
};

}  // namespace erun
