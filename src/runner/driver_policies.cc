// Where the policies meet the driver (runner/policies/policy.h): the
// snapshot they read and the one place their actions are applied.
#include <algorithm>
#include <type_traits>

#include "common/log.h"
#include "runner/driver.h"

namespace erun {

JobSnapshot Driver::snapshot(const MembershipSnapshot* m, bool workers) const {
  JobSnapshot s;
  s.now = clock_.now();
  s.generation = rec_.generation;
  s.published_at = gen_.published_at;
  s.after_failure = gen_.after_failure;
  s.complete = gen_.complete;
  s.plan = &plan_;
  s.listed = &discovery_.listed;
  s.hosts = &discovery_.hosts;
  s.in_place = in_place_possible(o_.mode, d_.membership != nullptr, workers_);
  s.min_np = o_.min_np;
  s.blacklist = &hosts_;
  if (workers) {
    s.workers.reserve(workers_.size());
    for (const Worker& w : workers_) s.workers.push_back(w.view());
  }
  if (m) {
    for (auto& j : m->waiting) s.waiting.insert(j.slot);
  }
  return s;
}

namespace {
// The worker an action is about (its key), or 0 for an action about the job.
long target_of(const Action& action) {
  return std::visit(
      [](const auto& a) -> long {
        if constexpr (requires { a.worker; }) {
          return a.worker;
        } else {
          return 0;
        }
      },
      action);
}

// An action that names the worker `w`: the one place a policy's action
// touches a worker's handle and state.
void apply_to(DriverWorker& w, const Action& action, long generation, EventSink& events) {
  std::visit(
      [&](const auto& a) {
        using A = std::decay_t<decltype(a)>;
        const bool runs = w.alive();  // a signal goes only to a worker that still runs
        if constexpr (std::is_same_v<A, act::Dismiss> || std::is_same_v<A, act::Stop>) {
          if (!runs) return;
          w.handle->terminate();
          w.set_state(std::is_same_v<A, act::Dismiss> ? WorkerState::kDismissed : WorkerState::kStopping);
        } else if constexpr (std::is_same_v<A, act::Kill> || std::is_same_v<A, act::Exclude>) {
          if (!runs) return;
          w.handle->kill();
          if (std::is_same_v<A, act::Exclude>) w.set_state(WorkerState::kExcluded);
        } else if constexpr (std::is_same_v<A, act::SetStage>) {
          w.set_stage(a.stage);
        } else if constexpr (std::is_same_v<A, act::Promote>) {
          if (a.rank >= 0) w.assignment.rank = a.rank;
          w.set_stage(a.stage);
          const SlotKey& slot = w.assignment.slot;
          ERUN_LOG_INFO("{}: standby {}[{}] promoted ({}): it joins without starting again", who(generation),
                        slot.host, slot.local_index, a.reason);
          events.emit(ev::StandbyPromoted{
              .generation = generation, .host = slot.host, .slot = slot.local_index, .reason = a.reason});
        } else if constexpr (requires { a.worker; }) {
          static_assert(sizeof(A) == 0, "an action on a worker the driver does not apply");
        }
      },
      action);
}
}  // namespace

void Driver::apply(const Actions& actions) {
  for (const Action& action : actions) {
    if (const long key = target_of(action)) {
      auto it = std::find_if(workers_.begin(), workers_.end(), [&](const Worker& w) { return w.key == key; });
      if (it != workers_.end()) apply_to(*it, action, rec_.generation, *d_.events);  // else forgotten meanwhile
      continue;
    }
    std::visit(
        [&](const auto& a) {
          using A = std::decay_t<decltype(a)>;
          if constexpr (requires { a.worker; }) {
            // apply_to()'s
          } else if constexpr (std::is_same_v<A, act::LaunchStandby>) {
            if (launch_worker(a.assignment, a.master_host, 0, WorkerStage::kStandby)) {
              ERUN_LOG_INFO("{}[{}]: standby started (--standby {}{})", a.assignment.slot.host,
                            a.assignment.slot.local_index, a.wanted, a.spare ? "; a spare host" : "");
            }
          } else if constexpr (std::is_same_v<A, act::Replan>) {
            plan_cache_.invalidate();
          } else if constexpr (std::is_same_v<A, act::RolledBack>) {
            if (!d_.account || rolled_back_logged_ == a.generation) return;  // once per generation
            const double now = realtime_seconds();
            auto lost = d_.account->rolled_back_to(
                a.commit, now, a.commit_age_s >= 0 ? std::optional<double>(now - a.commit_age_s) : std::nullopt);
            if (!lost) return;
            rolled_back_logged_ = a.generation;
            d_.events->emit(
                ev::RolledBack{.generation = a.generation, .commit = static_cast<long>(a.commit), .seconds = *lost});
          } else if constexpr (std::is_same_v<A, act::FailGeneration>) {
            gen_.fail(Failure{rec_.generation, a.host, a.rank, a.status, a.stderr_tail, a.after_s});
          } else if constexpr (std::is_same_v<A, act::CountReset>) {
            count_reset(rec_, *d_.events, a.reason);
          } else if constexpr (std::is_same_v<A, act::Emit>) {
            d_.events->emit(a.event);
          } else if constexpr (std::is_same_v<A, act::SlotsChanged>) {
            ++discovery_.epoch;
          } else if constexpr (std::is_same_v<A, act::HostsChanged>) {
            discovery_.derive(drains_.usable(discovery_.listed),
                              [this](const std::string& h) { return specs_.is_local(h); });
          } else if constexpr (std::is_same_v<A, act::KeepMemory>) {
            bool local;
            Launcher& launcher = specs_.launcher_for(a.host, &local);
            memory_.kept(a.host, launcher.keep(a.host, specs_.host_commit_dir(a.host), d_.secret));
          } else if constexpr (std::is_same_v<A, act::UnkeepMemory>) {
            bool local;
            specs_.launcher_for(a.host, &local).unkeep(a.host, /*forget=*/false);
          } else if constexpr (std::is_same_v<A, act::ReleaseAgent>) {
            bool local;
            specs_.launcher_for(a.host, &local).release(a.host);
            memory_.forget(a.host);
          } else {
            static_assert(sizeof(A) == 0, "an action the driver does not apply");
          }
        },
        action);
  }
}


}  // namespace erun
