// Driver: the job's state machine; step() is one turn of its loop and never
// blocks (docs/design.md, "The driver's states", "Recovery policy"; the
// in-place decisions are in driver_in_place.cc). Driver thread only, but for
// request_stop(), which is async-signal-safe: main's signal handler calls it.
#pragma once

#include <signal.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "discovery/discovery.h"
#include "runner/policies/crash_loop.h"
#include "runner/policies/departed.h"
#include "runner/policies/drain.h"
#include "runner/policies/host_memory.h"
#include "runner/policies/peer_reports.h"
#include "runner/policies/policy.h"
#include "runner/policies/straggler_watch.h"
#include "runner/driver_record.h"
#include "runner/driver_states.h"
#include "runner/driver_workers.h"
#include "runner/hosts/discovered.h"
#include "runner/job_facts.h"
#include "runner/policies/rejoin.h"
#include "runner/stopping.h"
#include "runner/observe/event_log.h"
#include "runner/hosts/host_manager.h"
#include "runner/observe/job_account.h"
#include "runner/launch/launcher.h"
#include "runner/options.h"
#include "runner/launch/output.h"
#include "runner/launch/worker_specs.h"
#include "runner/hosts/plan_cache.h"
#include "runner/hosts/planner.h"
#include "runner/policies/replicas.h"
#include "runner/policies/standbys.h"
#include "rendezvous/membership.h"

namespace erun {

class Driver;

struct DriverDeps {
  HostDiscovery* discovery = nullptr;
  Launcher* local_launcher = nullptr;
  Launcher* remote_launcher = nullptr;  // may be null when every host is local
  Clock* clock = nullptr;
  OutputForwarder* output = nullptr;    // may be null (tests)
  // Where the job's events go; by default (or null) nowhere.
  EventSink* events = &no_events();
  // Fed what only the driver sees (commit ids as ranks report them); the
  // events reach it through the log's observer. May be null.
  JobAccount* account = nullptr;
  Membership* membership = nullptr;     // the started rendezvous; null: restart mode only
  int rendezvous_port = 0;              // where workers reach it
  // Runs discovery inside step() (every discovery_interval of `clock`) instead
  // of on the DiscoveryLoop's thread: deterministic unit tests.
  bool synchronous_discovery = false;
  std::string job_id;  // default: random
  std::string secret;  // default: random
  // Where each host keeps its workers' newest commits (ERUN_COMMIT_DIR is
  // this, "-", and the host's name; the host's agent removes it when the job
  // ends). Default: /dev/shm/erun-commits-<random>; "-": none (commits live
  // only in workers).
  std::string commit_dir;
  // A job taken over from a driver that is gone (docs/design.md, "A driver
  // that can be replaced"): main read its record and attached to its agents;
  // start() adopts their workers instead of starting a generation.
  struct Takeover {
    uint64_t term = 0;
    DriverRecord record;  // the job's, as its last driver left it
    std::vector<AdoptedWorker> workers;
  };
  Takeover* takeover = nullptr;
  // Called by run() after every step (main keeps the job record with it).
  std::function<void(const Driver&)> after_step;
  // The newer driver term the job record names, if any (main's
  // RecordKeeper reads it at each heartbeat): a driver replaced while it was
  // frozen or cut off learns it here even when no agent could tell it.
  std::function<uint64_t()> record_superseded;
};

class Driver {
 public:
  Driver(DriverOptions options, DriverDeps deps);
  ~Driver();

  // The whole job: start(), then step() until it returns an exit code.
  int run();
  // First discovery; a failure here fails the job (exit code 1).
  Status start();
  // One turn of the loop; the exit code once the job is over.
  std::optional<int> step();
  // Prints the plan and the exact launch commands (after start()); launches nothing.
  int dry_run(std::FILE* out);
  void request_stop(int signal);

  // For tests and the event log (the generation and the counts: record()).
  JobPhase phase() const;
  // Another driver took the job over (an agent said SUPERSEDED): this one
  // ended without touching the workers.
  uint64_t superseded_by() const;
  const Plan& plan() const;
  // The driver's state that a new driver would take the job over from (the
  // job record's part): where this one keeps it.
  const DriverRecord& record() const;
  const HostManager& host_manager() const;

 private:
  using Worker = DriverWorker;

  // ---- taking over (driver_takeover.cc) ----
  // start() of a job taken over: adopts its workers, or (none of the plan
  // left) starts it anew after the record's generation.
  void take_over(DriverDeps::Takeover& t);
  // An agent obeys a newer driver: leave the job to it.
  bool check_superseded();
  // ---- policies (driver_policies.cc): each reads a snapshot, returns actions ----
  // The job now, as the policies see it (`m`: the membership's waiting slots
  // too; without `workers`, for a policy that reads none: StragglerWatch).
  JobSnapshot snapshot(const MembershipSnapshot* m = nullptr, bool workers = true) const;
  // Applies what a policy returned, in order: the one place its actions
  // touch workers, the event log and the hosts.
  void apply(const Actions& actions);
  // ---- phases (driver.cc): step() calls the handler of the current one ----
  // step() but for keeping the record's in_place.
  std::optional<int> turn();
  // Checked against transition_allowed(); entering a waiting phase from
  // another phase restarts the --elastic-timeout clock.
  void set_phase(JobPhase next);
  void on_signal(int sig);
  void wait_for_hosts();             // kWaitingForHosts
  void supervise();                  // kRunning
  void finish();                     // kFinishing
  void continue_stop();              // kStopping
  // kRunning: the generation lost a worker: recover in place, restart, or end.
  void handle_generation_failure();
  // kRunning: would a fresh plan differ from the running one? Resize if so.
  void follow_membership();
  // follow_membership()'s plan `next` has fewer slots than --min-np: the
  // running workers stay (a draining host still leaves). True when it did.
  bool held_below_min_np(const Plan& next, int usable_slots, bool in_place);
  // -> kStopping (JobStop): sends `signal` (SIGTERM: terminate()) to every
  // live worker; once all are gone the job goes to `then`: it waits for
  // hosts, or ends (kDone) with what `exit_code` returns, called then.
  void stop(JobPhase then, int signal = SIGTERM, std::function<int()> exit_code = nullptr);
  void done(int code);

  // Every change of the discovered hosts goes through here: drains start
  // for the hosts listed as draining, then the usable hosts are derived.
  void set_discovered(HostSet hosts);
  void reap();
  // reap() found `w` ended with `s`: logs and records it, and decides what
  // the end is (a standby's or a replacement's loss, erun's own stop, a
  // success, or the generation's failure).
  void worker_ended(Worker& w, const ExitStatus& s);
  bool start_generation(const HostSet& usable);
  // `stage`: kSettled for a generation's own worker; any other launches it
  // into the running job (in place), and a pending stage as kPending.
  bool launch_worker(const RankAssignment& a, const std::string& master_addr, int master_port,
                     WorkerStage stage = WorkerStage::kSettled);
  // In place, a plan that only adds slots: launch their workers as pending
  // replacements (the survivors keep training until they joined).
  void grow_pending(const Plan& next);
  // ---- in place (driver_in_place.cc) ----
  // Plans the next generation over the survivors and new slots and publishes
  // it; below --min-np, keeps the survivors waiting in the rendezvous.
  // `after_failure`: the survivors' collectives broke, so each live one
  // re-joins within --collective-timeout (see RejoinDeadlines, policies/rejoin.h); and
  // when the survivors alone are at least --min-np, the generation is theirs
  // alone (published at once) and the free slots get pending replacements,
  // admitted later by admit_replacements(): survivors never wait for a new
  // worker's start-up (a Python worker spends seconds importing torch).
  void reconfigure(const char* reason, bool after_failure);
  // Moves each worker to its rank in `next`; with `full` (the survivors go on
  // alone), a pending one keeps its rank there. The rest retire, stopped at
  // once with `stop_retired` (their generation failed: nothing they do is
  // needed), else when they re-join. Returns how many retire.
  int reassign_workers(const Plan& next, const Plan* full, bool stop_retired);
  // Pending replacements (launched after a failure while the survivors went
  // on alone, or for new slots): one that does not join within --rendezvous-timeout is killed;
  // once all wait in the rendezvous and the survivors formed their
  // generation, the driver announces a membership change and publishes the
  // next generation with them. True when it did.
  bool admit_replacements(const MembershipSnapshot& m);
  // A pending replacement ended, or is killed, before it joined: a failure of
  // its host, not of the survivors' generation.
  void replacement_failed(Worker& w, const std::string& why);
  // kWaitingWithSurvivors (the survivors wait in the rendezvous): re-form
  // once --min-np slots are back, give up after --elastic-timeout.
  void wait_with_survivors();
  // Publishes plan_ as the generation (its facts start anew in gen_): `fresh`,
  // every worker was launched for it; `after_failure`, it re-forms after one.
  void publish(bool fresh, bool after_failure);

  DriverOptions o_;
  DriverDeps d_;
  WorkerSpecs specs_;  // what each worker is given, where it runs
  Clock& clock_;
  // What must outlive this driver, kept here (a job taken over: as its last
  // driver left it): the generation, counts and plan, the hosts' histories
  // (hosts_ keeps them there) and the keepers (replicas_).
  DriverRecord rec_;
  HostManager hosts_;
  std::unique_ptr<DiscoveryLoop> loop_;
  // The hosts as discovery gave them and as the plans use them.
  DiscoveredHosts discovery_;
  DrainPolicy drains_;
  StragglerWatch stragglers_;
  HostMemoryKeeper memory_;
  DepartedHosts departed_;  // hosts discovery dropped, whose agent goes once nothing of the job runs there
  StandbyPolicy standbys_;
  PlanCache plan_cache_;
  CrashLoopDetector crash_loop_;

  RejoinDeadlines rejoin_;

  JobPhase phase_ = JobPhase::kWaitingForHosts;
  GenerationFacts gen_;  // the current generation (publish() starts it anew)
  JobStop stop_;         // JobPhase::kStopping
  Finishing finishing_;  // JobPhase::kFinishing: a rank finished
  Outcome outcome_;      // how the job is doing, for its exit code
  long rolled_back_logged_ = -1;   // the generation whose rolled_back event was written
  PeerReports reports_;            // what survivors report of their lost peers
  Plan plan_;  // the running plan, rec_.plan's slots with their ranks (set_running_plan())
  std::vector<Worker> workers_;
  long next_key_ = 1;
  Waiting waiting_;  // for hosts, or below --min-np
  std::unique_ptr<CommitReplicas> replicas_;   // null: no host commits, or --commit-replicas 0
  std::optional<TimePoint> last_failure_at_;  // when the last generation failure was handled
  static constexpr Duration kFailureBurst = std::chrono::seconds(1);
  std::atomic<int> stop_signal_{0};
  uint64_t superseded_by_ = 0;
};

}  // namespace erun
