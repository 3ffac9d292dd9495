#include "runner/hosts/planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <unordered_map>

namespace erun {

std::vector<std::string> Plan::hosts() const {
  std::vector<std::string> out;
  for (auto& r : ranks) {
    if (out.empty() || out.back() != r.slot.host) out.push_back(r.slot.host);
  }
  return out;
}

bool Plan::contains(const SlotKey& slot) const { return find(slot) != nullptr; }

const RankAssignment* Plan::find(const SlotKey& slot) const {
  for (auto& r : ranks) {
    if (r.slot == slot) return &r;
  }
  return nullptr;
}

bool Plan::same_layout(const Plan& other) const {
  if (ranks.size() != other.ranks.size()) return false;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (!(ranks[i].slot == other.ranks[i].slot)) return false;
  }
  return true;
}

std::string Plan::to_string() const {
  std::string out = fmt::format("{} rank{}:", ranks.size(), ranks.size() == 1 ? "" : "s");
  size_t i = 0;
  while (i < ranks.size()) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1].slot.host == ranks[i].slot.host) ++j;
    out += i == j ? fmt::format(" {}[{}]", ranks[i].slot.host, i)
                  : fmt::format(" {}[{}-{}]", ranks[i].slot.host, i, j);
    i = j + 1;
  }
  return out;
}

std::vector<Host> order_hosts(const HostSet& usable, const Plan* previous) {
  std::vector<Host> out;
  out.reserve(usable.size());
  std::vector<bool> taken(usable.size(), false);
  if (previous) {
    // Linear: an index of the usable hosts, not a search per previous host.
    std::unordered_map<std::string_view, size_t> index;
    index.reserve(usable.size());
    for (size_t i = 0; i < usable.size(); ++i) index.emplace(usable.hosts()[i].name, i);
    for (auto& name : previous->hosts()) {
      auto it = index.find(name);
      int i = it == index.end() ? -1 : static_cast<int>(it->second);
      if (i >= 0 && !taken[static_cast<size_t>(i)]) {
        out.push_back(usable.hosts()[static_cast<size_t>(i)]);
        taken[static_cast<size_t>(i)] = true;
      }
    }
  }
  for (size_t i = 0; i < usable.size(); ++i) {
    if (!taken[i]) out.push_back(usable.hosts()[i]);
  }
  return out;
}

namespace {

// The hosts `only` names, each with the slots it may take.
std::map<std::string, std::vector<int>, std::less<>> only_by_host(const std::vector<SlotKey>& only) {
  std::map<std::string, std::vector<int>, std::less<>> out;
  for (auto& s : only) out[s.host].push_back(s.local_index);
  return out;
}

}  // namespace

int plannable_slots(const HostSet& usable, const std::vector<SlotKey>& only) {
  int slots = usable.total_slots();
  for (auto& [host, indices] : only_by_host(only)) {
    const int have = usable.slots_of(host);
    const auto within = std::count_if(indices.begin(), indices.end(), [&](int s) { return s < have; });
    slots -= have - static_cast<int>(within);
  }
  return slots;
}

Plan make_plan(long generation, const HostSet& usable, int max_np, const Plan* previous,
               const std::vector<SlotKey>& only) {
  auto hosts = order_hosts(usable, previous);
  const size_t limit = static_cast<size_t>(max_np > 0 ? max_np : usable.total_slots());
  const auto restricted = only_by_host(only);
  auto open = [&](const std::string& host, int s) {
    auto it = restricted.find(host);
    return it == restricted.end() || std::find(it->second.begin(), it->second.end(), s) != it->second.end();
  };
  // The slots the previous plan used come first, on every host, then the
  // lowest free ones, host by host: a plan that took a standby's slot in
  // place of a failed one's keeps it (docs/design.md, "Standbys"), also when
  // --max-np leaves no room for a free slot of an earlier host.
  std::map<std::string, std::vector<int>> kept;
  if (previous) {
    for (auto& r : previous->ranks) kept[r.slot.host].push_back(r.slot.local_index);
  }
  std::vector<std::vector<int>> chosen(hosts.size());
  size_t taken = 0;
  for (size_t i = 0; i < hosts.size() && taken < limit; ++i) {
    if (auto it = kept.find(hosts[i].name); it != kept.end()) {
      for (int s : it->second) {
        if (taken < limit && s < hosts[i].slots && open(hosts[i].name, s) &&
            std::find(chosen[i].begin(), chosen[i].end(), s) == chosen[i].end()) {
          chosen[i].push_back(s);
          ++taken;
        }
      }
    }
  }
  for (size_t i = 0; i < hosts.size() && taken < limit; ++i) {
    for (int s = 0; s < hosts[i].slots && taken < limit; ++s) {
      if (open(hosts[i].name, s) && std::find(chosen[i].begin(), chosen[i].end(), s) == chosen[i].end()) {
        chosen[i].push_back(s);
        ++taken;
      }
    }
  }
  std::vector<SlotKey> slots;
  slots.reserve(taken);
  for (size_t i = 0; i < hosts.size(); ++i) {
    for (int s : chosen[i]) slots.push_back(SlotKey{hosts[i].name, s});
  }
  return plan_over_slots(generation, slots);
}

HostSet hosts_of_plan(const std::vector<SlotKey>& slots) {
  HostSet out;
  for (auto& s : slots) {
    int i = out.find(s.host);
    if (i < 0) {
      out.append_new(Host{s.host, s.local_index + 1});
    } else if (int have = out.slots_of(s.host); s.local_index + 1 > have) {
      out.add_slots_at(static_cast<size_t>(i), s.local_index + 1 - have);
    }
  }
  return out;
}

Plan plan_over_slots(long generation, const std::vector<SlotKey>& slots) {
  Plan plan;
  plan.generation = generation;
  std::map<std::string, int> local_size;
  for (auto& s : slots) local_size[s.host]++;
  std::map<std::string, int> local_seen;     // host -> its slots so far
  std::map<int, int> hosts_with_local_rank;  // local_rank -> count so far
  int size = static_cast<int>(slots.size());
  plan.ranks.reserve(slots.size());
  for (int i = 0; i < size; ++i) {
    RankAssignment r;
    r.slot = slots[static_cast<size_t>(i)];
    r.rank = i;
    r.size = size;
    r.local_rank = local_seen[r.slot.host]++;
    r.local_size = local_size[r.slot.host];
    r.cross_rank = hosts_with_local_rank[r.local_rank]++;
    plan.ranks.push_back(r);
  }
  // Horovod's cross ranks: among hosts with a slot at this local_rank.
  for (auto& r : plan.ranks) r.cross_size = hosts_with_local_rank[r.local_rank];
  return plan;
}

int host_distance(const HostSet& hosts, std::string_view a, std::string_view b) {
  if (a == b) return 0;
  const int i = hosts.find(a), j = hosts.find(b);
  if (i < 0 || j < 0) return 2;
  const std::string& rack = hosts.hosts()[static_cast<size_t>(i)].rack;
  return !rack.empty() && rack == hosts.hosts()[static_cast<size_t>(j)].rack ? 1 : 2;
}

}  // namespace erun
