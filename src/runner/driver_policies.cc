// Where the policies meet the driver (runner/policies/policy.h): the
// snapshot they read and the one place their actions are applied.
#include <algorithm>
#include <type_traits>

#include "common/log.h"
#include "runner/driver.h"

namespace erun {

JobSnapshot Driver::snapshot(const MembershipSnapshot* m) const {
  JobSnapshot s;
  s.now = clock_.now();
  s.generation = rec_.generation;
  s.plan = &plan_;
  s.listed = &discovery_.listed;
  s.hosts = &discovery_.hosts;
  s.in_place = in_place_possible();
  s.min_np = o_.min_np;
  s.workers.reserve(workers_.size());
  for (const Worker& w : workers_) s.workers.push_back(w.view());
  if (m) {
    for (auto& j : m->waiting) s.waiting.insert(j.slot);
  }
  return s;
}

void Driver::apply(const Actions& actions) {
  auto worker = [&](long key) -> Worker* {
    auto it = std::find_if(workers_.begin(), workers_.end(), [&](const Worker& w) { return w.key == key; });
    return it != workers_.end() && it->alive() ? &*it : nullptr;
  };
  for (const Action& action : actions) {
    std::visit(
        [&](const auto& a) {
          using A = std::decay_t<decltype(a)>;
          if constexpr (std::is_same_v<A, act::Dismiss>) {
            if (Worker* w = worker(a.worker)) {
              w->handle->terminate();
              w->set_state(WorkerState::kDismissed);
            }
          } else if constexpr (std::is_same_v<A, act::Kill>) {
            if (Worker* w = worker(a.worker)) w->handle->kill();
          } else if constexpr (std::is_same_v<A, act::CountReset>) {
            count_reset(a.reason.c_str());
          } else if constexpr (std::is_same_v<A, act::Emit>) {
            d_.events->emit(a.event);
          } else if constexpr (std::is_same_v<A, act::SlotsChanged>) {
            ++discovery_.epoch;
          } else if constexpr (std::is_same_v<A, act::HostsChanged>) {
            derive_usable_hosts();
          } else if constexpr (std::is_same_v<A, act::KeepMemory>) {
            bool local;
            memory_.kept(a.host, launcher_for(a.host, &local).keep(a.host, host_commit_dir(a.host), d_.secret));
          } else if constexpr (std::is_same_v<A, act::UnkeepMemory>) {
            bool local;
            launcher_for(a.host, &local).unkeep(a.host, /*forget=*/false);
            memory_.kept(a.host, false);
          } else {
            static_assert(sizeof(A) == 0, "an action the driver does not apply");
          }
        },
        action);
  }
}

void Driver::take_drains() {
  Launcher* remote = d_.remote_launcher != d_.local_launcher ? d_.remote_launcher : nullptr;
  for (Launcher* l : {d_.local_launcher, remote}) {
    if (!l) continue;
    for (auto& [host, why] : l->take_drains()) apply(drains_.start(snapshot(), host, why, /*from_discovery=*/false));
  }
}

void Driver::derive_usable_hosts() {
  discovery_.hosts = drains_.usable(discovery_.listed);
  ++discovery_.epoch;
  discovery_.all_local = true;
  for (auto& h : discovery_.hosts.hosts()) {
    bool local;
    launcher_for(h.name, &local);
    discovery_.all_local = discovery_.all_local && local;
  }
}

bool Driver::draining_members() const {
  // A straggler's slot that rests leaves the same way.
  if (!drains_.any() && !stragglers_.any_resting()) return false;
  return std::any_of(workers_.begin(), workers_.end(), [&](const Worker& w) {
    return survivor(w) && !w.pending() &&
           (drains_.draining(w.assignment.slot.host) || stragglers_.resting(w.assignment.slot));
  });
}

}  // namespace erun
