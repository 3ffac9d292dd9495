// --slurm-grow PARTITION (docs/slurm.md, "Growing onto idle nodes"): the job
// grows onto nodes Slurm lends it and gives them back by Slurm's priorities.
// erun keeps placeholder jobs (one node each, exclusive, requeueable) pending
// in PARTITION, as many as --max-np leaves room for beyond the allocation.
// When Slurm starts one (the node is idle), its node joins the discovered
// hosts, and the node's agent runs as a step of the placeholder (srun
// --jobid). When Slurm preempts it for a job of a higher priority tier, the
// step's processes get SIGTERM, which drains the host in place (erun's
// agent and worker library); a requeued placeholder is made eligible again
// at once (Slurm would wait two minutes) and runs when the node is idle
// again. Every priority decision is Slurm's. The placeholders are cancelled
// when erun ends; one whose allocation ended without erun ends by itself.
#pragma once
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "discovery/discovery.h"
#include "discovery/host_set.h"

namespace erun {

class SlurmGrow {
 public:
  struct Options {
    std::string partition;
    std::string allocation;  // erun's own job (SLURM_JOB_ID): a placeholder ends with it
    int slots_per_node = 1;
  };
  // Runs a Slurm command: its stdout, or an error naming it (exit status,
  // stderr). Tests give their own.
  using Runner = std::function<Result<std::string>(const std::vector<std::string>&)>;

  SlurmGrow(Options options, Runner runner);
  ~SlurmGrow();  // cancel_all()
  SlurmGrow(const SlurmGrow&) = delete;
  SlurmGrow& operator=(const SlurmGrow&) = delete;

  // One round (from discovery's thread): reads the placeholders' states,
  // submits new ones until `wanted` exist, cancels pending ones beyond it,
  // and makes requeued ones eligible now.
  void tick(int wanted);
  // The nodes of the running placeholders, `slots_per_node` each.
  HostSet hosts() const;
  // The placeholder a node runs under ("" when none): its agent's step joins that job.
  std::string job_of(const std::string& node) const;
  // scancel every placeholder of this job (idempotent).
  void cancel_all();
  // The placeholders' job name: erun-grow-<allocation>.
  const std::string& name() const { return name_; }

  // The placeholder's batch script: it ignores SIGTERM (a preemption's
  // notice is for the agent's step), ends the job itself once it is
  // preempted and the agent's step is gone, and ends when the allocation has.
  static std::string script(const std::string& allocation);

 private:
  struct Placeholder {
    std::string state;   // squeue's %T: PENDING, RUNNING, ...
    std::string node;    // when RUNNING
    std::string reason;  // squeue's %r
  };
  using Placeholders = std::map<std::string, Placeholder>;  // by job id
  std::optional<Placeholders> list();
  void follow(const Placeholders& before, const Placeholders& now);
  void resize(int wanted, Placeholders& now);

  Options o_;
  Runner run_;
  std::string name_;
  mutable std::mutex mu_;
  Placeholders jobs_;
  bool cancelled_ = false;
  bool warned_ = false;  // a failed squeue was logged (once until one works)
  // After a failed sbatch (a wrong partition, a submit limit): no other
  // before this, so that a tick a second does not repeat it.
  std::chrono::steady_clock::time_point next_submit_{};
};

// Runs argv with a time limit: its stdout, or an error with its exit status
// and stderr. For SlurmGrow's commands.
Result<std::string> run_slurm_command(const std::vector<std::string>& argv);

// `base` (the allocation, or a discovery script) plus the nodes of running
// placeholders; each discover() is one SlurmGrow::tick(), wanting as many
// nodes as --max-np leaves room for beyond `base`.
class SlurmGrowDiscovery final : public HostDiscovery {
 public:
  SlurmGrowDiscovery(std::unique_ptr<HostDiscovery> base, std::shared_ptr<SlurmGrow> grow, int max_np,
                     int slots_per_node);
  Result<HostSet> discover() override;
  std::string describe() const override;

 private:
  std::unique_ptr<HostDiscovery> base_;
  std::shared_ptr<SlurmGrow> grow_;
  int max_np_;
  int slots_per_node_;
};

}  // namespace erun
