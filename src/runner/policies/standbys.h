// Standbys (docs/design.md, "Standbys"): on free slots (discovered beyond
// the plan) erun runs the program up to its first join, where it waits as a
// pending worker of no plan; when a member is lost, the next plan takes a
// ready standby's slot in its place (with_standbys()), so the job is back at
// full size as soon as the survivors re-join, without paying the program's
// start-up. The nearest standby goes first: on the same host, then in the
// same rack (`rack=NAME` on the discovery line), then any. A standby that
// ends or never reaches the rendezvous is a broken slot, not a failure: its
// slot waits (doubling) before the next.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>

#include "runner/options.h"
#include "runner/policies/policy.h"

namespace erun {

class StandbyPolicy {
 public:
  explicit StandbyPolicy(const DriverOptions& o) : want_(o.standby), rendezvous_timeout_(o.rendezvous_timeout) {}

  // What tend() needs beyond the snapshot.
  struct Turn {
    const HostSet* usable = nullptr;  // the slots the plans may use now
    long hosts_epoch = 0;             // bumps whenever they may change
    bool starts = false;              // new standbys may start (a complete generation runs, no rank finished)
    bool finishing = false;           // a rank finished: every standby goes
    std::function<bool(const SlotKey&)> resting = [](const SlotKey&) { return false; };
  };
  // How many standbys the job keeps: --standby, by default one where the
  // job recovers in place, none otherwise.
  int wanted(const JobSnapshot& s) const;
  // Each turn of a running job: stops the standbys whose slot is no longer
  // usable (all of them once a rank finished), marks those that wait in
  // the rendezvous ready, gives up those past --rendezvous-timeout, and
  // launches new ones on free slots up to wanted(): the hosts of members
  // first (beside the members they may replace), then spare hosts.
  Actions tend(const JobSnapshot& s, const Turn& turn);
  // A pending replacement still starting gives its place to a standby that
  // waits in the rendezvous now (same host first): the job grows back to
  // full size without the cold start; the replacement is stopped.
  Actions overtake(const JobSnapshot& s);
  // `full` with each slot no survivor holds swapped for a ready standby's
  // (nearest first): the standby takes the failed rank's place at once.
  Plan with_standbys(const JobSnapshot& s, const Plan& full) const;
  // A standby ended or never reached the rendezvous (`why`): its slot waits
  // (doubling) before the next, and the free slots are looked at again.
  void lost(const SlotKey& slot, TimePoint now, const std::string& why);

 private:
  struct Backoff {
    TimePoint until{};
    int times = 0;        // waits so far (each doubles)
    bool active = false;  // waiting now
  };
  // tend()'s first part: the live standbys; how many live on.
  int tend_live(const JobSnapshot& s, const Turn& turn, Actions& out);
  // tend()'s second part: launches on free slots while `live` < wanted().
  void start_more(const JobSnapshot& s, const Turn& turn, int live, Actions& out);
  // The slot may get a standby now (its backoff, if any, is over).
  bool backoff_over(const SlotKey& slot, TimePoint now);

  int want_;
  Duration rendezvous_timeout_;
  std::map<SlotKey, Backoff> backoff_;  // slots whose standby died: wait before the next
  std::pair<long, long> scanned_{-1, -1};  // (hosts epoch, generation) of the last scan for free slots
  bool found_ = false;                     // that scan found a free slot
};

// A ready standby (not promoted, alive) waits on `slot`.
bool standby_ready_at(const JobSnapshot& s, const SlotKey& slot);

}  // namespace erun
