// Driver: the job's state machine; step() is one turn of its loop and never
// blocks (docs/design.md, "The driver's states", "Recovery policy"; the
// in-place decisions are in driver_in_place.cc). Driver thread only, but for
// request_stop(), which is async-signal-safe: main's signal handler calls it.
#pragma once

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
#include "runner/policies/drain.h"
#include "runner/policies/host_memory.h"
#include "runner/policies/peer_reports.h"
#include "runner/policies/policy.h"
#include "runner/policies/straggler_watch.h"
#include "runner/driver_record.h"
#include "runner/driver_states.h"
#include "runner/driver_workers.h"
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

  // For tests and the event log.
  long generation() const;
  JobPhase phase() const;
  int resets() const;
  int restarts() const;
  // Some member of the running plan joined the rendezvous (the job's workers
  // use erun's library: a takeover keeps them in place).
  bool members_joined() const;
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
  struct Failure {
    long generation = 0;
    std::string host;
    int rank = 0;
    ExitStatus status;
    std::vector<std::string> stderr_tail;
    double after_s = 0;
    bool unreachable = false;  // its host could not be reached at all (WorkerHandle::host_unreachable())
  };

  // ---- taking over (driver_takeover.cc) ----
  // start() of a job taken over: adopts its workers, or (none of the plan
  // left) starts it anew after the record's generation.
  void take_over(DriverDeps::Takeover& t);
  // Makes the taken-over job's workers this driver's.
  void adopt(DriverDeps::Takeover& t);
  // An agent obeys a newer driver: leave the job to it.
  bool check_superseded();
  // ---- policies (driver_policies.cc): each reads a snapshot, returns actions ----
  // The job now, as the policies see it (`m`: the membership's waiting slots
  // too; without `workers`, for a policy that reads none: StragglerWatch).
  JobSnapshot snapshot(const MembershipSnapshot* m = nullptr, bool workers = true) const;
  // Applies what a policy returned, in order: the one place its actions
  // touch workers, the event log and the hosts.
  void apply(const Actions& actions);
  // apply() of an action that names the worker `w`.
  void apply_to(Worker& w, const Action& action);
  // DRAINING notices the launchers' agents sent since the last tick.
  void take_drains();
  // discovery_.hosts: discovery_.listed less the draining hosts.
  void derive_usable_hosts();
  // A live member of the running plan is on a draining host, or on a slot
  // that rests (a straggler's): it leaves at the next commit.
  bool draining_members() const;
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
  bool held_below_min_np(const Plan& next, const HostSet& usable, bool in_place);
  // One more reset (--reset-limit counts them), with its event-log line.
  void count_reset(const char* reason);
  // kRunning -> kFinishing once a rank finished.
  void begin_finishing();
  // -> kStopping: sends `signal` (SIGTERM: terminate()) to every live worker;
  // once all are gone the job waits for hosts (stop_then_wait) or ends with
  // what `exit_code` returns, called then (stop_then_end).
  void stop_then_wait();
  void stop_then_end(int signal, std::function<int()> exit_code);
  void begin_stop(int signal);
  void done(int code);

  void refresh_hosts();
  // Every change of the discovered hosts goes through here (keeps discovery_.all_local).
  void set_discovered(HostSet hosts);
  void reap();
  // Forgets the workers (ended_only: those whose exit is known), their
  // output's pipes and stderr lines with them (bench/long_run.py found them
  // held for the job's life otherwise).
  void drop_workers(bool ended_only);
  // reap() found `w` ended with `s`: logs and records it, and decides what
  // the end is (a standby's or a replacement's loss, erun's own stop, a
  // success, or the generation's failure).
  void worker_ended(Worker& w, const ExitStatus& s);
  // A failed worker's last stderr lines for its Failure: its agent's exit
  // report, else (no report) the lines forwarded through d_.output.
  std::vector<std::string> stderr_tail(const Worker& w) const;
  bool start_generation(const HostSet& usable);
  // `stage`: kSettled for a generation's own worker; any other launches it
  // into the running job (in place), and a pending stage as kPending.
  bool launch_worker(const RankAssignment& a, const std::string& master_addr, int master_port,
                     WorkerStage stage = WorkerStage::kSettled);
  // In place, a plan that only adds slots: launch their workers as pending
  // replacements (the survivors keep training until they joined).
  void grow_pending(const Plan& next);
  // ---- in place (driver_in_place.cc) ----
  // The membership's state this tick (empty without a rendezvous).
  MembershipSnapshot take_snapshot();
  // Members of the current generation that ended or were left out, not yet
  // reported: Membership::notify_peers_lost() tells the survivors at once.
  void tell_survivors_of_losses();
  // Plans the next generation over the survivors and new slots and publishes
  // it; below --min-np, keeps the survivors waiting in the rendezvous.
  // `after_failure`: the survivors' collectives broke, so each live one
  // re-joins within --collective-timeout (see enforce_rejoin_deadline()); and
  // when the survivors alone are at least --min-np, the generation is theirs
  // alone (published at once) and the free slots get pending replacements,
  // admitted later by admit_replacements(): survivors never wait for a new
  // worker's start-up (a Python worker spends seconds importing torch).
  void reconfigure(const char* reason, bool after_failure);
  // After a failure, survivors that alone meet --min-np go on at once in a
  // generation of their own (`next`, over their slots and ready standbys'),
  // and the free slots of `full` get pending replacements: true then.
  bool survivors_alone(const Plan& full, Plan& next);
  // reconfigure() below --min-np: the survivors wait in the rendezvous
  // (kWaitingWithSurvivors), or, with none, every worker stops.
  void wait_below_min_np(const HostSet& usable);
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
  // Counts a failure against the host (`unreachable`: it could not be
  // reached at all); logs and records it when that blacklists the host.
  // Returns whether it did.
  bool record_host_failure(const std::string& host, bool unreachable);
  // Training is over for a rank: stops the workers launched into the running
  // job that were never a member of a complete generation (pending ones,
  // and ones assigned to a generation the finished ranks never joined): they
  // hold nothing to finish, and would wait for their peers forever.
  void drop_fresh_workers();
  // Discovered hosts that may carry the next plan: the usable ones, and
  // blacklisted ones where survivors still run (their progress is kept).
  HostSet plannable_hosts() const;
  // kWaitingWithSurvivors (the survivors wait in the rendezvous): re-form
  // once --min-np slots are back, give up after --elastic-timeout.
  void wait_with_survivors();
  void update_joined(const MembershipSnapshot& m);
  // A generation of workers that all started in it joined: logs the commit
  // its members' hosts kept, where training resumes (the event log's
  // commit_restored).
  void log_resumed_commit(const MembershipSnapshot& m);
  void enforce_rejoin_deadline(const MembershipSnapshot& m);
  void retire_workers(const MembershipSnapshot& m);
  // The running plan is `p`: its slots go in the record, the plan itself
  // in plan_ (a takeover plans it from the record's slots: adopt()).
  void set_plan(Plan p);
  // Publishes plan_ as the generation (its facts start anew in gen_): `fresh`,
  // every worker was launched for it; `after_failure`, it re-forms after one.
  void publish(bool fresh, bool after_failure);
  WorkerSpec make_spec(const RankAssignment& a, const std::string& master_addr, int master_port) const;
  // kRunning, after follow_membership() brought plan_cache_ up to date:
  // spare hosts keep replicas of the commits (--commit-replicas).
  void tend_replicas();
  // The current generation failed: the first failure noted stands (its
  // report and exit code), later ones of the same generation add nothing.
  void fail_generation(Failure f);
  // Stops every worker, then ends the job with the failure's exit code.
  void finish_with_failure(const Failure& f);
  int job_exit_code();
  // The exit code when the job gives up waiting (after --elastic-timeout).
  int give_up_code();
  void report_failure(const Failure& f);
  void log_waiting(const HostSet& usable);

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
  // The hosts as discovery gave them (refresh_hosts()) and as the plans
  // use them (apply_drains(), set_discovered()).
  struct Discovered {
    HostSet listed;           // as discovery lists them (draining marks included)
    HostSet hosts;            // listed less the draining hosts: what the plans use
    bool all_local = true;    // every discovered host launches locally
    long version = -1;        // the discovery loop's snapshot they came from
    long epoch = 0;           // bumps whenever the usable slots may change (the plan cache and standbys look again)
    TimePoint last_at{};      // the last discovery (start(); then in step() with synchronous_discovery)
    std::string last_error;   // the last failure logged
  };
  Discovered discovery_;
  DrainPolicy drains_;
  StragglerWatch stragglers_;
  HostMemoryKeeper memory_;
  StandbyPolicy standbys_;
  PlanCache plan_cache_;
  CrashLoopDetector crash_loop_;

  JobPhase phase_ = JobPhase::kWaitingForHosts;
  // The current generation, as the driver learns of it; publish() starts it
  // anew (a takeover: adopt()).
  struct GenerationFacts {
    TimePoint published_at{};
    bool after_failure = false;      // published after a failure: its re-join deadline is the collective timeout's
    bool fresh = false;              // every worker of it was launched for it
    bool complete = false;           // every rank of the plan joined it
    bool burst_losses = false;       // it lost workers to the last failure's burst
    std::optional<Failure> failure;  // its first failure (fail_generation())
  };
  GenerationFacts gen_;
  // JobPhase::kStopping (begin_stop()).
  struct Stopping {
    JobPhase then = JobPhase::kDone;  // where the job goes once every worker is gone
    std::function<int()> exit_code;   // with kDone
    TimePoint kill_at{};              // SIGKILL to those still running
    TimePoint give_up_at{};           // after the SIGKILL: report the ones still not gone
    bool killed = false;              // the SIGKILL went out
    bool kill_requested = false;      // a SIGKILL was asked for: no grace
  };
  Stopping stop_;
  // JobPhase::kFinishing (begin_finishing()): a rank finished.
  struct Finishing {
    std::string first;       // who() of the first worker that finished successfully
    TimePoint first_at{};
    std::string because;     // why the job ends, for its log line
    bool failed = false;     // a failure came while finishing: the job ends now
    TimePoint deadline{};    // --finish-timeout after the first finished
  };
  Finishing finishing_;
  // How the job is doing, for its exit code.
  struct Outcome {
    int exit_code = 0;                    // in JobPhase::kDone
    std::optional<Failure> first_failure;  // the job's first failure
    bool any_success = false;             // a worker finished successfully
  };
  Outcome outcome_;
  long rolled_back_logged_ = -1;   // the generation whose rolled_back event was written
  PeerReports reports_;            // what survivors report of their lost peers
  Plan plan_;  // the running plan, rec_.plan's slots with their ranks (set_plan())
  std::vector<Worker> workers_;
  long next_key_ = 1;
  // Waiting for hosts: the phases that do (kWaitingForHosts,
  // kWaitingWithSurvivors), and a running job below --min-np.
  struct Waiting {
    TimePoint since{};              // the --elastic-timeout clock (set_phase())
    TimePoint last_log{};           // its last "waiting" line
    bool below_min_logged = false;  // said once that the job is below --min-np (follow_membership())
  };
  Waiting waiting_;
  std::unique_ptr<CommitReplicas> replicas_;   // null: no host commits, or --commit-replicas 0
  long replicas_planned_at_ = -1;              // plan_cache_.recomputations() at the last replicas_->plan()
  std::optional<TimePoint> last_failure_at_;  // when the last generation failure was handled
  static constexpr Duration kFailureBurst = std::chrono::seconds(1);
  std::atomic<int> stop_signal_{0};
  uint64_t superseded_by_ = 0;
};

}  // namespace erun
