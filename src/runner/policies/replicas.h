// The driver's side of commit replicas (docs/state.md, "Replicas on spare
// hosts"; --commit-replicas N). Every host that runs workers of the job holds
// its newest commit already (commits are the same on every rank), so a commit
// is on as many hosts as the plan has. When that is fewer than N + 1, the
// job's spare hosts (usable, discovered, running no worker) make up the
// difference: each keeper's agent keeps what one holder pushes to it, the
// holders taken in turn. plan() makes that plan when the hosts change; tick()
// moves the agents toward it as their answers come, without waiting for
// any. Driver thread only.
#pragma once

#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "runner/hosts/host_manager.h"
#include "runner/hosts/planner.h"
#include "runner/launch/launcher.h"

namespace erun {

// Keepers and the holder that pushes to each, enough that holders +
// keepers reach replicas + 1 hosts, in the order of `spares`. The keepers of
// `current` (keeper -> holder) that are still spares stay keepers, and keep
// their holder while it is one: a new keeper starts empty and must be sent
// the whole state. The others are the first spares in the order given,
// each given the holder with the fewest keepers.
std::vector<std::pair<std::string, std::string>> plan_keepers(
    const std::vector<std::string>& holders, const std::vector<std::string>& spares, int replicas,
    const std::map<std::string, std::string>& current = {});

class CommitReplicas {
 public:
  // `commit_dir(host)`: the host's ERUN_COMMIT_DIR; `address(host)`: where
  // the other hosts reach it (its name, or for an agent this machine runs,
  // the address its workers advertise); `launcher_for(host)`: the launcher
  // of its agent. `holders` (the driver's record's keepers) is where the
  // keepers and their holders live (keeper host -> its holder): a job taken
  // over starts with the keepers its record names (their agents keep what
  // they hold; KEEP is asked again and answered with the running keeper's
  // port).
  CommitReplicas(int replicas, std::string secret, std::function<std::string(const std::string&)> commit_dir,
                 std::function<std::string(const std::string&)> address,
                 std::function<Launcher&(const std::string&)> launcher_for, Clock& clock,
                 std::map<std::string, std::string>& holders);

  // Plans the keepers anew, for `holders` (the hosts of the running plan)
  // and `spares` (the usable hosts without a worker, in discovery order):
  // called when those change, not every tick. A keeper given another holder
  // has its pusher stopped. A keeper no longer wanted has its pusher stopped;
  // its agent is told UNKEEP (its keeper ends) at once when its host runs
  // workers now (its replicas go once they hold a commit as new) or left the
  // spares (they stay); a keeper still a spare is told UNKEEP with `forget`
  // (tick()) a minute after the holders last changed, unless it is wanted
  // again by then. A plan without holders changes nothing: a keeper's
  // replica may be the only copy left.
  void plan(const std::vector<std::string>& holders, const std::vector<std::string>& spares);
  // Moves the agents toward the plan as their answers come; cheap (a few
  // keepers), called every tick of the running job.
  void tick();
  // Each turn of the running job: plan() again when the plan cache made a
  // new plan (`recomputations` moved on: the hosts, the blacklist or the
  // running plan changed; with 20,000 hosts a tick must not list them),
  // then tick(). The holders are `running`'s hosts; the spares the `usable`
  // hosts beyond them, then the blacklisted hosts of `discovered`.
  void tend(const Plan& running, const HostSet& usable, const HostSet& discovered, const HostManager& hosts,
            long recomputations);

  // host -> the holder it keeps for, once its keeper pushes reach it.
  std::map<std::string, std::string> serving() const;
  // Every keeper (host -> its holder), retiring ones too: what the job
  // record carries to the next driver.
  const std::map<std::string, std::string>& keepers() const { return holders_; }

 private:
  long planned_at_ = -1;  // the recomputations of the last plan() by tend()
  // A keeper's state beside its holder (in holders_, under the same host).
  struct Keeper {
    bool asked = false;      // KEEP sent
    TimePoint kept_at{};     // when KEEP was last sent (repeated every kRetry)
    int port = 0;            // its answer
    std::string told;        // the holder told to push to it
    TimePoint told_at{};     // when it was last told
    TimePoint retry_at{};    // after a failure: ask again then
    Duration backoff{};      // the wait after the last failure
    bool retiring = false;   // no longer wanted: told UNKEEP at retire_at
    TimePoint retire_at{};
  };
  // Stops the pushes to `host`'s keeper.
  void drop(const std::string& host, Keeper& k);
  void back_off(Keeper& k, TimePoint now);
  void retire_due(TimePoint now);
  bool keeper_listens(const std::string& host, Keeper& k, TimePoint now);

  int replicas_;
  std::string secret_;
  std::function<std::string(const std::string&)> commit_dir_;
  std::function<std::string(const std::string&)> address_;
  std::function<Launcher&(const std::string&)> launcher_for_;
  Clock& clock_;
  std::map<std::string, std::string>& holders_;  // keeper -> its holder
  std::map<std::string, Keeper> keepers_;         // the same hosts
  std::set<std::string> last_holders_;
  std::string last_said_;  // the last plan logged
};

}  // namespace erun
