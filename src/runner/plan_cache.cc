#include "runner/plan_cache.h"

namespace erun {

void PlanCache::update(long discovered_epoch, const HostSet& discovered, const HostManager& hosts,
                       long generation, const Plan& running, int max_np) {
  auto blacklist = hosts.epoch();
  if (valid_ && discovered_epoch == discovered_epoch_ && blacklist == blacklist_ &&
      generation == generation_ && running.generation == plan_generation_ &&
      running.ranks.size() == plan_size_ && max_np == max_np_) {
    return;
  }
  valid_ = true;
  discovered_epoch_ = discovered_epoch;
  blacklist_ = blacklist;
  generation_ = generation;
  plan_generation_ = running.generation;
  plan_size_ = running.ranks.size();
  max_np_ = max_np;
  usable_ = hosts.usable(discovered);
  usable_slots_ = usable_.total_slots();
  next_ = make_plan(generation + 1, usable_, max_np, running.empty() ? nullptr : &running);
  ++recomputations_;
}

}  // namespace erun
