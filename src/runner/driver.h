// Driver: the job's state machine. It takes host sets from discovery, plans
// generations, launches workers through the Launchers, supervises them, and
// decides the job's end and exit code.
//
// Restart mode (any program): on a failure or a membership change every worker
// is stopped and the next generation starts them all again with torchrun-style
// variables. In-place mode (workers that joined the rendezvous through
// erun::init()): survivors keep running; the driver launches only new slots,
// publishes the next generation, tells every worker of a membership change,
// retires workers whose slots left the plan, and kills a worker that does not
// re-join within the rendezvous timeout.
//
// The driver runs on one thread: run() loops over step() until it
// returns an exit code. request_stop() is async-signal-safe and may be called
// from a signal handler; the next step stops all workers and ends the job.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "discovery/discovery.h"
#include "runner/crash_loop.h"
#include "runner/event_log.h"
#include "runner/host_manager.h"
#include "runner/launcher.h"
#include "runner/options.h"
#include "runner/output.h"
#include "runner/plan_cache.h"
#include "runner/planner.h"

namespace erun {

struct DriverDeps {
  HostDiscovery* discovery = nullptr;
  Launcher* local_launcher = nullptr;
  Launcher* remote_launcher = nullptr;  // may be null when every host is local
  Clock* clock = nullptr;
  OutputForwarder* output = nullptr;    // may be null (tests)
  EventLog* events = nullptr;           // may be null
  RendezvousServer* rendezvous = nullptr;  // started; null: restart mode only
  // Runs discovery inside step() (every discovery_interval of `clock`) instead
  // of on the DiscoveryLoop's thread: deterministic unit tests.
  bool synchronous_discovery = false;
  // Picks MASTER_PORT on a host; default: a free port found on that host.
  std::function<int(const std::string& host, bool local)> free_port;
  std::string job_id;  // default: random
  std::string secret;  // default: random
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
  void request_stop(int signal) { stop_signal_.store(signal); }

  // For tests and the event log.
  long generation() const { return generation_; }
  int resets() const { return resets_; }
  const Plan& plan() const { return plan_; }
  const HostManager& host_manager() const { return hosts_; }

 private:
  enum class Phase { kWaiting, kRunning, kFinishing };
  struct Worker {
    long key = 0;
    RankAssignment assignment;
    std::unique_ptr<WorkerHandle> handle;
    bool local = false;
    bool stopping = false;  // erun asked it to stop: its exit is not a failure
    bool joined = false;    // it joined the rendezvous at least once (in-place capable)
    bool retiring = false;  // its slot left the plan: stop it once it re-joins
    TimePoint retire_by{};
    std::optional<ExitStatus> exit;
    TimePoint started{};
  };
  struct Failure {
    long generation = 0;
    std::string host;
    int rank = 0;
    ExitStatus status;
    std::vector<std::string> stderr_tail;
    double after_s = 0;
  };

  void refresh_hosts();
  // Every change of the discovered hosts goes through here (keeps all_hosts_local_).
  void set_discovered(HostSet hosts);
  void reap();
  bool start_generation(const HostSet& usable);
  bool launch_worker(const RankAssignment& a, const std::string& master_addr, int master_port,
                     bool in_place = false);
  // In-place: a member of the current generation asks for a newer one (its
  // communicator failed): the generation is broken.
  bool members_want_new_generation();
  // In-place: plan the next generation over the survivors and new slots.
  void reconfigure(const char* reason);
  bool in_place_possible();
  void update_joined();
  void enforce_rejoin_deadline();
  void retire_workers();
  void publish();
  std::vector<std::pair<std::string, std::string>> worker_env(const RankAssignment& a,
                                                               const std::string& master_addr,
                                                               int master_port) const;
  WorkerSpec make_spec(const RankAssignment& a, const std::string& master_addr, int master_port) const;
  Launcher& launcher_for(const std::string& host, bool* local) const;
  void stop_all(int signal);
  int finish_with_failure(const Failure& f);
  int job_exit_code();
  void report_failure(const Failure& f);
  std::string master_address() const;
  std::string advertise_address(const std::string& host, bool local) const;
  std::string rendezvous_address(const std::string& host, bool local) const;
  void log_waiting(const HostSet& usable);

  DriverOptions o_;
  DriverDeps d_;
  Clock& clock_;
  HostManager hosts_;
  std::unique_ptr<DiscoveryLoop> loop_;
  HostSet discovered_;
  bool all_hosts_local_ = true;  // every discovered host launches locally
  long discovered_version_ = -1;
  long discovered_epoch_ = 0;  // bumps in set_discovered
  PlanCache plan_cache_;
  CrashLoopDetector crash_loop_;
  TimePoint last_discovery_{};
  std::string last_discovery_error_;

  Phase phase_ = Phase::kWaiting;
  long generation_ = 0;
  int resets_ = 0;
  int restarts_ = 0;  // generations started after the first (TORCHELASTIC_RESTART_COUNT)
  Plan plan_;
  std::vector<Worker> workers_;
  long next_key_ = 1;
  TimePoint waiting_since_{};
  TimePoint last_wait_log_{};
  TimePoint finish_deadline_{};
  std::optional<Failure> generation_failure_;  // first failure of the current generation
  std::optional<Failure> first_failure_;       // first failure of the job
  bool any_success_ = false;
  std::string first_finished_;     // who() of the first worker that finished successfully
  TimePoint first_finished_at_{};
  std::string finishing_because_;  // why the job ends in Phase::kFinishing, for its log line
  bool failure_while_finishing_ = false;
  bool below_min_logged_ = false;
  TimePoint published_at_{};
  bool generation_complete_ = false;  // every rank of the plan joined the current generation
  std::atomic<int> stop_signal_{0};
};

// A free TCP port on this machine (bind to port 0).
int find_free_local_port();

}  // namespace erun
