// What each rank's worker is given and where it runs (docs/design.md,
// "Launching"): the launcher of its host, its environment (the topology,
// erun's ERUN_*, torchrun's, the user's -x), its WorkerSpec, and the
// addresses at which it reaches the driver and its peers. The driver asks;
// nothing here launches anything.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "runner/hosts/planner.h"
#include "runner/launch/launcher.h"
#include "runner/options.h"

namespace erun {

class WorkerSpecs {
 public:
  // The job's facts that never change.
  struct Site {
    Launcher* local = nullptr;
    Launcher* remote = nullptr;  // null: every host launches locally
    std::string job_id;
    std::string secret;
    std::string commit_dir;  // "": no host commits
    bool rendezvous = false;  // workers join the driver's rendezvous (else restart mode only)
    int rendezvous_port = 0;
  };
  // The facts of the moment a spec is made.
  struct Now {
    long generation = 0;
    int restarts = 0;
    const Plan* plan = nullptr;  // the running plan
    bool all_local = true;       // every discovered host launches locally
    bool preflight = true;       // the pre-flight checks are on
    // The member a worker launched on a host times its link with (its slot
    // and probe port), if any.
    std::function<std::optional<std::pair<SlotKey, uint32_t>>(const std::string& host)> probe_peer;
  };

  WorkerSpecs(const DriverOptions& o, Site site) : o_(o), site_(std::move(site)) {}

  // The launcher that starts `host`'s workers; `local`: the local one.
  Launcher& launcher_for(const std::string& host, bool* local) const;
  // launcher_for()'s `local` alone: `host` runs its agent on this machine.
  bool is_local(const std::string& host) const;
  // `a`'s worker: its program, directory, environment, secret.
  WorkerSpec make(const RankAssignment& a, const std::string& master_addr, int master_port, const Now& now) const;
  // MASTER_ADDR for `plan`: 127.0.0.1 when every rank is local, else rank 0's host.
  std::string master_address(const Plan& plan) const;
  // Where peers reach a worker on `host` (`all_local`: every discovered host is local).
  std::string advertise_address(const std::string& host, bool local, bool all_local) const;
  // Where a worker on `host` reaches the driver's rendezvous.
  std::string rendezvous_address(const std::string& host, bool local) const;
  // The host's ERUN_COMMIT_DIR: one directory per host, named after it.
  std::string host_commit_dir(const std::string& host) const;

 private:
  std::vector<std::pair<std::string, std::string>> env(const RankAssignment& a, const std::string& master_addr,
                                                       int master_port, const Now& now) const;
  // What torchrun sets beyond the topology: node numbers and thread count.
  void torchrun_env(std::vector<std::pair<std::string, std::string>>& env, const RankAssignment& a,
                    const Plan& plan) const;

  const DriverOptions& o_;
  Site site_;
  // The plan's hosts by index (torchrun's node numbers), for the plan of
  // generation node_index_gen_; made once per plan.
  mutable std::unordered_map<std::string, int> node_index_;
  mutable long node_index_gen_ = -1;
};

}  // namespace erun
