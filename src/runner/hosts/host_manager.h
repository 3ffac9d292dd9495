// HostManager: which hosts may be used now. A host whose workers failed in
// `blacklist_after` consecutive generations is blacklisted for a cooldown that
// starts at cooldown_min and doubles with each blacklisting, up to
// cooldown_max; after it the host is tried again. A generation in which the
// host's workers ran without failing resets its count. A host that could not
// be reached at all (ssh's 255, no HELLO) is an outage, not a fault of the
// host: a blacklisting for that sits out the last cooldown again (the
// shortest when it has none) instead of a doubled one, so however often a
// cut-off host is tried, it rejoins within one cooldown of coming back. The
// histories are the driver's record's (DriverRecord::hosts). Driver thread
// only.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "common/clock.h"
#include "discovery/host_set.h"
#include "rendezvous/membership.h"

namespace erun {

class EventSink;

struct BlacklistPolicy {
  int blacklist_after = 2;
  Duration cooldown_min = std::chrono::seconds(10);
  Duration cooldown_max = std::chrono::seconds(300);
};

// One host's failures and blacklistings: its part of the driver's record
// (DriverRecord::hosts), where HostManager keeps it.
struct HostHistory {
  int failures_in_a_row = 0;
  int times_blacklisted = 0;
  // When its last blacklisting ends, on the driver's clock (the job record's
  // text holds it as a wall-clock time: the next driver's clock is another).
  TimePoint blacklisted_until{};
  bool operator==(const HostHistory&) const = default;
};
// Host name -> its history; a host with no failure in a row and never
// blacklisted has none.
using HostHistories = std::map<std::string, HostHistory>;

class HostManager {
 public:
  // The hosts' histories live in `history` (the driver's record): a job
  // taken over goes on from the counts and blacklistings it holds.
  HostManager(const Clock& clock, BlacklistPolicy policy, HostHistories& history)
      : clock_(clock), policy_(policy), history_(history) {}

  // What a failure did: nothing more than count, or blacklisted the host
  // (true), for the last cooldown again (`again`: not doubled).
  struct Blacklisting {
    bool blacklisted = false;
    bool again = false;
    explicit operator bool() const { return blacklisted; }
  };
  // `unreachable`: the host could not be reached at all (its agent never
  // answered), rather than a failure on it; such failures of a host that
  // sits out already (the try's other workers) count nothing.
  Blacklisting record_failure(const std::string& host, bool unreachable = false);
  // record_failure(), saying so (a warning and a host_blacklisted event)
  // when it blacklists the host. Returns whether it did.
  bool count_failure(const std::string& host, bool unreachable, EventSink& events);
  void record_success(const std::string& host);
  bool is_blacklisted(const std::string& host) const;
  // When a blacklisted host may be used again.
  TimePoint blacklisted_until(const std::string& host) const;
  // The discovered hosts minus the blacklisted ones, order kept, except
  // those that `kept` names (sorted slots that survivors of an in-place job
  // hold): a plan takes only those slots there (make_plan's `only`).
  HostSet usable(const HostSet& discovered, const std::vector<SlotKey>& kept = {}) const;
  std::vector<std::string> blacklisted() const;
  // Changes whenever usable() may give a different answer for the same input:
  // a new blacklisting, or a cooldown that ended.
  struct Epoch {
    long blacklistings = 0;  // the hosts' blacklistings so far
    size_t blacklisted_now = 0;
    bool operator==(const Epoch&) const = default;
  };
  Epoch epoch() const;

 private:
  const Clock& clock_;
  BlacklistPolicy policy_;
  HostHistories& history_;
};

}  // namespace erun
