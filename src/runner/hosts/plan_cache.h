// PlanCache: the usable hosts and the plan a fresh generation would have,
// recomputed only when one of their inputs changed: the discovered hosts (an
// epoch the driver bumps with each new host set), the blacklist (its epoch),
// the running plan (its generation), or the blacklisted hosts kept because
// survivors of an in-place job live there. The driver asks every tick; with
// 20,000 discovered hosts a recomputation copies and plans them all, so the
// tick must not. Driver thread only.
#pragma once

#include <vector>

#include "discovery/host_set.h"
#include "runner/hosts/host_manager.h"
#include "runner/hosts/planner.h"

namespace erun {

class PlanCache {
 public:
  // Brings the cache up to date; cheap when nothing changed.
  // `keep`: slots of blacklisted hosts that stay in the plan (sorted;
  // survivors holding the last commit run there): their hosts are usable
  // for those slots alone.
  void update(long discovered_epoch, const HostSet& discovered, const HostManager& hosts,
              long generation, const Plan& running, int max_np, const std::vector<SlotKey>& keep = {});
  // The next update() recomputes (the running plan changed in a way its
  // generation and size do not tell: a pending worker's slot).
  void invalidate() { valid_ = false; }
  // The usable hosts, the blacklisted ones of `keep` among them with all
  // their slots: a plan takes only what `keep` lists there.
  const HostSet& usable() const { return usable_; }
  // The slots a plan may take: usable()'s, less those `keep` rules out.
  int usable_slots() const { return usable_slots_; }
  // make_plan(generation + 1, usable(), max_np, &running, keep) (running
  // may be empty).
  const Plan& next() const { return next_; }
  long recomputations() const { return recomputations_; }

 private:
  bool valid_ = false;
  long discovered_epoch_ = 0;
  HostManager::Epoch blacklist_{};
  long generation_ = 0;
  long plan_generation_ = 0;
  size_t plan_size_ = 0;
  int max_np_ = 0;
  std::vector<SlotKey> keep_;
  HostSet usable_;
  int usable_slots_ = 0;
  Plan next_;
  long recomputations_ = 0;
};

}  // namespace erun
