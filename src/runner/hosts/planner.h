// The Planner: which slot gets which rank in a generation. Pure functions.
//
// Hosts that were in the previous plan keep their order and come first; new
// hosts follow in discovery order. Slots are filled host by host, up to
// max_np, so ranks are contiguous per host (local_rank = slot index), survivors'
// ranks move as little as possible, and rank 0 stays on the first surviving
// host. cross_rank/cross_size follow Horovod: among hosts with a slot at this
// local_rank, this host's index and their count.
#pragma once

#include <string>
#include <vector>

#include "discovery/host_set.h"
#include "rendezvous/rendezvous.h"

namespace erun {

struct Plan {
  long generation = 0;
  std::vector<RankAssignment> ranks;  // index == rank
  int size() const { return static_cast<int>(ranks.size()); }
  bool empty() const { return ranks.empty(); }
  // Distinct hosts in rank order.
  std::vector<std::string> hosts() const;
  bool contains(const SlotKey& slot) const;
  const RankAssignment* find(const SlotKey& slot) const;
  // Same slots at the same ranks (generation ignored).
  bool same_layout(const Plan& other) const;
  std::string to_string() const;  // "4 ranks: a[0-1] b[2-3]"
};

// Orders the usable hosts: previous plan's hosts first (in their order), then
// the rest in discovery order.
std::vector<Host> order_hosts(const HostSet& usable, const Plan* previous);

// Plans generation `generation` over `usable` with at most max_np ranks.
// On a host that `only` names, just the slots `only` lists for it are taken
// (a blacklisted host kept for its survivors: they stay, but it gets no new
// worker), and the places its other slots would have taken go to other
// hosts. `only` is sorted.
Plan make_plan(long generation, const HostSet& usable, int max_np, const Plan* previous,
               const std::vector<SlotKey>& only = {});
// The slots make_plan() may take from `usable` with that `only`.
int plannable_slots(const HostSet& usable, const std::vector<SlotKey>& only);

// Plans generation `generation` over exactly `slots`, in that order (each
// host's slots together): rank i is slots[i]; local ranks count a host's
// slots in the plan, so a host whose slot 1 is missing has local ranks 0, 1
// for its slots 0 and 2 (local_rank < local_size always holds).
Plan plan_over_slots(long generation, const std::vector<SlotKey>& slots);

// The hosts that `slots` use, in their order, each with as many slots as its
// highest slot index + 1 (a job record's plan as discovery would list it).
HostSet hosts_of_plan(const std::vector<SlotKey>& slots);

// How near host `b` is to host `a` in `hosts`: 0 the same host, 1 hosts of
// one rack (both listed with the same rack=NAME), 2 otherwise (or unknown).
// Standbys are taken nearest first (docs/design.md, "Standbys").
int host_distance(const HostSet& hosts, std::string_view a, std::string_view b);

}  // namespace erun
