// The generation's joining (docs/design.md, "Recovery policy"): how long a
// worker may take to join a published generation, and when a worker whose
// slot left the job stops.
#pragma once

#include "rendezvous/membership.h"
#include "runner/options.h"
#include "runner/policies/policy.h"

namespace erun {

// A worker launched for this generation has --rendezvous-timeout to join
// it. So has a survivor, except after a failure: then its collectives broke
// (a peer died or stopped), so a live survivor re-joins within
// --collective-timeout (+1 s); one that does not is stopped or hung like the
// peer the others could not name (across hosts Gloo cannot tell which rank
// hung) and is left out, instead of holding the generation's barrier for
// the rendezvous timeout. A worker waiting in the rendezvous (`m`) is never
// killed here: it asks for a newer generation.
class RejoinDeadlines {
 public:
  explicit RejoinDeadlines(const DriverOptions& o)
      : rendezvous_timeout_(o.rendezvous_timeout), collective_timeout_(o.collective_timeout), mode_(o.mode) {}

  // Some worker may be late: the generation published at `published_at`
  // (`after_failure`: re-formed after one) has waited the shortest limit.
  bool due(TimePoint published_at, bool after_failure, TimePoint now) const;
  // Each turn of a running job until its generation is complete: the
  // generation fails for each late worker, which is left out (SIGKILL).
  Actions watch(const JobSnapshot& s, const MembershipSnapshot& m) const;

 private:
  Duration survivor_limit(bool after_failure) const;

  Duration rendezvous_timeout_;
  Duration collective_timeout_;
  WorkerMode mode_;
};

// Workers retiring (their slot left the plan) that waited in the
// rendezvous for a newer generation, or passed their retire_by: dismissed
// (SIGTERM, their end no failure).
Actions retire_due(const JobSnapshot& s);

}  // namespace erun
