// Draining: a host that leaves on notice (docs/design.md, "Draining a
// host"). Its agent said DRAINING (SIGTERM to the agent, or a worker's
// library took its own SIGTERM as a notice), or discovery lists it as
// `host[:slots] draining`. The host leaves the plans as if discovery had
// dropped it (usable()): its workers leave at their next commit (the
// announcement says it is a drain, so a program that checks between commits
// commits there first), the survivors go on in place, nothing is rolled
// back, and neither the host nor the job counts a failure. Workers still
// there after --drain-timeout are killed, a failure.
#pragma once

#include <map>
#include <string>

#include "runner/policies/policy.h"

namespace erun {

class DrainPolicy {
 public:
  explicit DrainPolicy(Duration timeout) : timeout_(timeout) {}

  // A notice that `host` leaves (`from_discovery`: discovery marks it): its
  // drain starts, unless it drains already or is not the job's (no
  // survivor there and not discovered).
  Actions start(const JobSnapshot& s, const std::string& host, const std::string& reason, bool from_discovery);
  // Each turn: stops a draining host's workers once their part is done
  // (pending, or out of their generation at a commit), kills those still
  // members past --drain-timeout, and ends the drains whose workers are
  // gone and that discovery no longer holds out.
  Actions tend(const JobSnapshot& s);

  bool draining(const std::string& host) const { return drains_.count(host) > 0; }
  bool any() const { return !drains_.empty(); }
  // `listed` less the draining hosts, with every draining mark cleared:
  // the hosts the plans use.
  HostSet usable(const HostSet& listed) const;

 private:
  struct Drain {
    std::string reason;
    TimePoint since{};
    bool from_discovery = false;
    bool overdue = false;  // --drain-timeout passed
    bool drained = false;  // its workers are gone (logged)
  };
  // The drain of `host` is over: no worker left there, and discovery drops
  // the host or (a drain discovery asked for) lists it without the mark.
  bool ends(const JobSnapshot& s, const std::string& host, const Drain& d, int left) const;

  Duration timeout_;
  std::map<std::string, Drain> drains_;
};

}  // namespace erun
