// Clock: the driver's only source of time, so that cooldowns, timeouts and the
// discovery interval are tested with a FakeClock in microseconds. Clocks are
// thread-safe. FakeClock::sleep_for advances the fake time instead of sleeping.
#pragma once

#include <atomic>
#include <chrono>
#include <thread>

namespace erun {

using Duration = std::chrono::steady_clock::duration;
using TimePoint = std::chrono::steady_clock::time_point;

class Clock {
 public:
  virtual ~Clock() = default;
  virtual TimePoint now() const = 0;
  virtual void sleep_for(Duration d) = 0;
};

class SystemClock final : public Clock {
 public:
  TimePoint now() const override { return std::chrono::steady_clock::now(); }
  void sleep_for(Duration d) override { std::this_thread::sleep_for(d); }
};

class FakeClock final : public Clock {
 public:
  TimePoint now() const override { return TimePoint(Duration(ticks_.load())); }
  void sleep_for(Duration d) override { advance(d); }
  void advance(Duration d) { ticks_ += d.count(); }

 private:
  std::atomic<Duration::rep> ticks_{Duration(std::chrono::hours(1)).count()};
};

// The wall clock in seconds since the epoch, as read at this process's first
// call and advanced by the monotonic clock since (what the event log's "time"
// says, and what the job's account, its summary and /metrics are computed
// from). A step of the system clock while erun runs (NTP, an operator: an
// hour either way) does not move it, so the difference of two stamps is the
// time that passed; the log lines' own timestamps show the system clock.
inline double realtime_seconds() {
  using namespace std::chrono;
  static const double wall_at_start = duration<double>(system_clock::now().time_since_epoch()).count();
  static const steady_clock::time_point steady_at_start = steady_clock::now();
  return wall_at_start + duration<double>(steady_clock::now() - steady_at_start).count();
}

// Seconds as a double, for logs and the event log.
inline double seconds(Duration d) { return std::chrono::duration<double>(d).count(); }
inline Duration from_seconds(double s) {
  return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(s));
}

}  // namespace erun
