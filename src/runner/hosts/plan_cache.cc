#include "runner/hosts/plan_cache.h"

namespace erun {

void PlanCache::update(long discovered_epoch, const HostSet& discovered, const HostManager& hosts,
                       long generation, const Plan& running, int max_np, const std::vector<SlotKey>& keep) {
  auto blacklist = hosts.epoch();
  if (valid_ && discovered_epoch == discovered_epoch_ && blacklist == blacklist_ &&
      generation == generation_ && running.generation == plan_generation_ &&
      running.ranks.size() == plan_size_ && max_np == max_np_ && keep == keep_) {
    return;
  }
  valid_ = true;
  discovered_epoch_ = discovered_epoch;
  blacklist_ = blacklist;
  generation_ = generation;
  plan_generation_ = running.generation;
  plan_size_ = running.ranks.size();
  max_np_ = max_np;
  keep_ = keep;
  usable_ = hosts.usable(discovered, keep);
  usable_slots_ = plannable_slots(usable_, keep);
  next_ = make_plan(generation + 1, usable_, max_np, running.empty() ? nullptr : &running, keep);
  ++recomputations_;
}

}  // namespace erun
