// The slots that hold the job back (docs/design.md, "Stragglers"): the
// ranks report each commit interval (TIMING: its length, its time in
// collectives); the detector (stragglers.h) finds a rank that computes much
// longer than the others, again and again. With --stragglers evict its slot
// leaves the job at the next commit, as a drain does, when the job stays at
// --min-np or above and would run at least 20 % faster; the slot then rests
// (sits out a cooldown that doubles on repeat, --blacklist-cooldown-range)
// and may grow the job again after it. Otherwise, and in restart mode, it
// is only reported. A new host's worker whose pre-flight checks (its link
// probe, its compute check) are far slower than the members' is held back
// the same way before it joins (--preflight).
#pragma once

#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "runner/options.h"
#include "runner/policies/policy.h"
#include "runner/policies/stragglers.h"

namespace erun {

class StragglerWatch {
 public:
  explicit StragglerWatch(const DriverOptions& o);

  // Each turn: ends the cooldowns that passed; once the running generation
  // is complete (`s.complete`: every rank joined it), feeds the members'
  // commit intervals to the detector and decides on each straggler it
  // found. Reads no worker of `s` (the driver leaves them out).
  Actions watch(const JobSnapshot& s, const std::vector<RankTiming>& timings);
  // watch() has something to do: intervals came, or a slot rests.
  bool watching(const std::vector<RankTiming>& timings) const { return !timings.empty() || any_resting(); }
  // A pending worker `w` on a host new to the job whose link probe (its
  // JOIN `j`) did not finish within its bound or took more than 3 times the
  // members' median, or whose compute check took more than 3 times theirs,
  // is held back: it is stopped and its slot rests. Nothing otherwise.
  Actions preflight(const JobSnapshot& s, const WorkerView& w, const JoinRequest& j, const MembershipSnapshot& m);

  bool resting(const SlotKey& slot) const;
  bool any_resting() const;
  // `p` without the resting slots (planned again over the others).
  Plan without_resting(Plan p) const;
  // --preflight on, and not --stragglers off.
  bool preflight_on() const;
  // The members' link probe responders (a few, one per host), noted again
  // when the generation or its member count changes.
  void note_probe_responders(const MembershipSnapshot& m);
  // The membership's state this turn (empty without a rendezvous), its
  // probe responders noted.
  MembershipSnapshot look(Membership* membership);
  // The responder a worker launched on `host` times its link with (its
  // slot and probe port): one on another host of the running plan; none
  // when `host` is not new to the job or no such member answers probes.
  std::optional<std::pair<SlotKey, uint32_t>> probe_peer_for(const std::string& host, const Plan& running) const;

 private:
  struct Rest {
    TimePoint until{};
    int times = 0;        // cooldowns so far (each doubles)
    bool active = false;  // sitting out now
  };
  // What to do with a straggler the detector found: evict it or report it.
  Actions decide(const JobSnapshot& s, const Straggler& found);
  // The slot sits out its next cooldown (doubling per time); its seconds.
  double rest_slot(const SlotKey& slot, TimePoint now);

  StragglerPolicy mode_;
  int window_;
  double cooldown_min_s_, cooldown_max_s_;
  bool preflight_;
  StragglerDetector detector_;
  long detector_gen_ = -1;  // the generation the detector watches
  std::map<SlotKey, Rest> resting_;
  std::vector<std::pair<SlotKey, uint32_t>> responders_;  // note_probe_responders()
  std::pair<long, size_t> responders_key_{-1, 0};         // (generation, members) they were noted at
};

// No rank of `running` is on `host`: its workers are checked before they join.
bool new_to_job(const Plan& running, const std::string& host);

}  // namespace erun
