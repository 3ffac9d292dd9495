// HostManager: which hosts may be used now. A host whose workers failed in
// `blacklist_after` consecutive generations is blacklisted for a cooldown that
// starts at cooldown_min and doubles with each blacklisting, up to
// cooldown_max; after it the host is tried again. A generation in which the
// host's workers ran without failing resets its count. Driver thread only.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "common/clock.h"
#include "discovery/host_set.h"

namespace erun {

struct BlacklistPolicy {
  int blacklist_after = 2;
  Duration cooldown_min = std::chrono::seconds(10);
  Duration cooldown_max = std::chrono::seconds(300);
};

// One host's failure history, as the job record carries it across a
// takeover: the time left of a blacklisting rather than a time point (the
// next driver's clock is another).
struct HostHistory {
  std::string host;
  int failures_in_a_row = 0;
  int times_blacklisted = 0;
  Duration blacklisted_for{};  // what is left of its blacklisting (zero: none)
  bool operator==(const HostHistory&) const = default;
};

class HostManager {
 public:
  HostManager(const Clock& clock, BlacklistPolicy policy) : clock_(clock), policy_(policy) {}

  // Returns true when this failure blacklisted the host.
  bool record_failure(const std::string& host);
  void record_success(const std::string& host);
  // Bumped whenever a count or a blacklisting changes (the job record's cue).
  long changes() const { return changes_; }
  bool is_blacklisted(const std::string& host) const;
  // When a blacklisted host may be used again.
  TimePoint blacklisted_until(const std::string& host) const;
  // The discovered hosts minus the blacklisted ones, order kept.
  HostSet usable(const HostSet& discovered) const;
  std::vector<std::string> blacklisted() const;
  // Every host with a failure or a blacklisting behind it, by name.
  std::vector<HostHistory> history() const;
  // A taken-over job's history (history() of the driver before): the
  // counts go on, and a blacklisting ends when it would have.
  void restore(const std::vector<HostHistory>& h);
  // Changes whenever usable() may give a different answer for the same input:
  // a new blacklisting, or a cooldown that ended.
  struct Epoch {
    long blacklistings = 0;
    size_t blacklisted_now = 0;
    bool operator==(const Epoch&) const = default;
  };
  Epoch epoch() const;

 private:
  struct Record {
    int failures_in_a_row = 0;
    int times_blacklisted = 0;
    TimePoint until{};
  };
  const Clock& clock_;
  BlacklistPolicy policy_;
  std::map<std::string, Record> records_;
  long blacklistings_ = 0;
  long changes_ = 0;
};

}  // namespace erun
