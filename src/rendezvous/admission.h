// Admission: the rendezvous server's guard against connection floods and its
// refusal-burst log lines (docs/protocol.md, "Limits and deadlines", "Bad
// input"). Not thread-safe: the server's I/O thread uses it under the server's
// mutex.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <string>
#include <unordered_map>

#include "common/clock.h"

namespace erun {

class Admission {
 public:
  Admission(size_t cap, Duration min_age, Duration quiet) : cap_(cap), min_age_(min_age), quiet_(quiet) {}

  void accepted(uint64_t id, TimePoint now);
  // Authenticated or closed: no longer counted.
  void done(uint64_t id);
  size_t unauthenticated() const { return order_.size(); }
  bool full() const { return order_.size() >= cap_; }
  size_t cap() const { return cap_; }
  // The connection to close for a new one while full(): the oldest, if it is
  // older than min_age.
  std::optional<uint64_t> evictable(TimePoint now) const;

  // A refusal happened; true when the caller should log it in full (the first
  // of a burst). `summary` is what the burst line says of the latest one.
  bool refused(TimePoint now, std::string summary);
  // The burst's count line, once, when it is due (quiet, or a long burst).
  std::optional<std::string> burst_line(TimePoint now);
  // When burst_line() may next have something (TimePoint::max() when nothing).
  TimePoint next_burst_check() const;

 private:
  size_t cap_;
  Duration min_age_;
  Duration quiet_;
  std::list<std::pair<uint64_t, TimePoint>> order_;
  std::unordered_map<uint64_t, std::list<std::pair<uint64_t, TimePoint>>::iterator> where_;
  // The current burst.
  bool in_burst_ = false;
  long suppressed_ = 0;
  TimePoint burst_start_{}, last_refusal_{}, last_line_{};
  std::string latest_;
};

}  // namespace erun
