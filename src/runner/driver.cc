#include "runner/driver.h"

#include <netinet/in.h>
#include <openssl/rand.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "common/log.h"
#include "common/no_retry.h"
#include "common/strings.h"
#include "erun/errors.hpp"

namespace erun {
namespace {

constexpr auto kTick = std::chrono::milliseconds(5);

std::string random_hex(size_t bytes) {
  std::vector<unsigned char> buf(bytes);
  if (RAND_bytes(buf.data(), static_cast<int>(buf.size())) != 1) {
    std::random_device rd;
    for (auto& b : buf) b = static_cast<unsigned char>(rd());
  }
  std::string out;
  for (auto b : buf) out += fmt::format("{:02x}", b);
  return out;
}

// `d` with what it leaves unset filled in: no events, a random job id and
// secret, a host commit directory unless --host-commits off ("" then).
DriverDeps with_defaults(DriverDeps d, const DriverOptions& o) {
  ERUN_CHECK(d.discovery && d.local_launcher && d.clock);
  if (!d.events) d.events = &no_events();
  if (d.job_id.empty()) d.job_id = "erun-" + random_hex(6);
  if (d.secret.empty()) d.secret = random_hex(32);
  if (!o.host_commits) d.commit_dir = "-";
  if (d.commit_dir.empty()) d.commit_dir = "/dev/shm/erun-commits-" + random_hex(12);
  if (d.commit_dir == "-") d.commit_dir.clear();
  return d;
}

}  // namespace

Driver::Driver(DriverOptions options, DriverDeps deps)
    : o_(std::move(options)),
      d_(with_defaults(std::move(deps), o_)),
      specs_(o_, WorkerSpecs::Site{d_.local_launcher, d_.remote_launcher, d_.job_id, d_.secret, d_.commit_dir,
                                   d_.membership != nullptr, d_.rendezvous_port}),
      clock_(*d_.clock),
      rec_(d_.takeover ? d_.takeover->record : DriverRecord{}),
      hosts_(*d_.clock,
             BlacklistPolicy{o_.blacklist_after, from_seconds(o_.cooldown_min_s), from_seconds(o_.cooldown_max_s)},
             rec_.hosts),
      drains_(o_.drain_timeout),
      stragglers_(o_),
      standbys_(o_),
      crash_loop_(o_.crash_loop_limit, o_.crash_loop_progress),
      rejoin_(o_) {
  if (!d_.commit_dir.empty() && d_.membership && o_.commit_replicas > 0) {
    replicas_ = std::make_unique<CommitReplicas>(
        o_.commit_replicas, d_.secret, [this](const std::string& host) { return specs_.host_commit_dir(host); },
        [this](const std::string& host) {
          bool local;
          specs_.launcher_for(host, &local);
          return specs_.advertise_address(host, local, discovery_.all_local);
        },
        [this](const std::string& host) -> Launcher& {
          bool local;
          return specs_.launcher_for(host, &local);
        },
        clock_, rec_.keepers);
  } else {
    rec_.keepers.clear();  // no replicas: no keeper to go on with
  }
}

Driver::~Driver() {
  if (loop_) loop_->stop();
  for (auto& w : workers_) {
    if (!w.exit && w.handle) w.handle->kill();
  }
}

Status Driver::start() {
  loop_ = std::make_unique<DiscoveryLoop>(*d_.discovery, o_.discovery_interval);
  Status s = loop_->first();
  // A job taken over runs on the hosts its record names: a discovery that
  // fails now (an inventory service down for a moment) keeps them, as a
  // running driver keeps its last hosts, instead of leaving the workers
  // without a driver.
  HostSet kept = s || !d_.takeover ? HostSet() : hosts_of_plan(d_.takeover->record.plan);
  if (!s && kept.empty()) {
    return Status::error(fmt::format("host discovery ({}) failed at start: {}; nothing was launched: run the script by hand "
                                     "and fix it until it prints one host[:slots] per line",
                                     d_.discovery->describe(), s.message()));
  }
  auto snap = loop_->snapshot();
  if (s) {
    set_discovered(snap.hosts);
  } else {
    ERUN_LOG_WARN("job {}: host discovery ({}) failed: {}; the job goes on with the {} host(s) of its record ({}) and "
                  "runs the script again every {:.0f} s",
                  d_.job_id, d_.discovery->describe(), s.message(), kept.size(), kept.summary(),
                  seconds(o_.discovery_interval));
    discovery_.last_error = s.message();
    set_discovered(kept);
  }
  discovery_.version = snap.version;
  discovery_.last_at = clock_.now();
  ERUN_LOG_INFO("job {}: {} found {} host{} with {} slot{}: {}", d_.job_id, d_.discovery->describe(),
                discovery_.hosts.size(), discovery_.hosts.size() == 1 ? "" : "s", discovery_.hosts.total_slots(),
                discovery_.hosts.total_slots() == 1 ? "" : "s", discovery_.hosts.summary());
  d_.events->emit(ev::JobStarted{
      .job_id = d_.job_id, .hosts = discovery_.hosts.to_string(), .min_np = o_.min_np, .max_np = o_.max_np});
  if (!d_.synchronous_discovery && o_.elastic) loop_->start();
  waiting_.since = clock_.now();
  if (d_.takeover) take_over(*d_.takeover);
  return Status::ok();
}

void Driver::set_discovered(HostSet hosts) {
  departed_.listed(discovery_.listed, hosts);
  discovery_.listed = std::move(hosts);
  if (discovery_.listed.any_draining()) {
    for (auto& h : discovery_.listed.hosts()) {
      if (h.draining && !drains_.draining(h.name)) {
        apply(drains_.start(snapshot(), h.name, "discovery lists it draining", /*from_discovery=*/true));
      }
    }
  }
  discovery_.derive(drains_.usable(discovery_.listed), [this](const std::string& h) { return specs_.is_local(h); });
}

void Driver::publish(bool fresh, bool after_failure) {
  gen_ = GenerationFacts{};
  gen_.published_at = clock_.now();
  gen_.fresh = fresh;
  gen_.after_failure = after_failure;
  reports_.published(plan_);
  if (d_.membership) d_.membership->publish(rec_.generation, plan_.ranks);
  d_.events->emit(
      ev::GenerationStarted{.generation = rec_.generation, .size = plan_.size(), .plan = plan_.to_string()});
}

bool Driver::start_generation(const HostSet& usable) {
  ++rec_.generation;
  set_running_plan(stragglers_.without_resting(make_plan(rec_.generation, usable, o_.max_np, plan_.empty() ? nullptr : &plan_)),
                   plan_, rec_);
  if (rec_.generation > 1) ++rec_.restarts;
  crash_loop_.generation_started(rec_.generation, plan_.hosts());
  std::string master_addr = specs_.master_address(plan_);
  bool rank0_local;
  const std::string& rank0_host = plan_.ranks.front().slot.host;
  int master_port = specs_.launcher_for(rank0_host, &rank0_local).free_port(rank0_host, d_.secret, o_.ssh_connect_timeout);
  ERUN_LOG_INFO("{}: starting {} (MASTER_ADDR={} MASTER_PORT={})", who(rec_.generation), plan_.to_string(),
                master_addr, master_port);
  drop_workers(workers_, d_.output, /*ended_only=*/false);
  publish(/*fresh=*/true, /*after_failure=*/false);
  for (auto& a : plan_.ranks) launch_worker(a, master_addr, master_port);
  set_phase(JobPhase::kRunning);
  return true;
}

void Driver::reap() {
  // The ends found at this look, in the order the launcher learned of them:
  // when a lost agent's workers and, moments later, their peers on another
  // host all ended, the lost host's is the generation's failure, whatever
  // the ranks.
  struct Ended {
    size_t index;
    ExitStatus status;
    TimePoint at;
  };
  std::vector<Ended> ended;
  for (size_t i = 0; i < workers_.size(); ++i) {
    auto& w = workers_[i];
    if (w.exit || !w.handle) continue;
    if (auto s = w.handle->poll()) ended.push_back(Ended{i, *s, w.handle->exited_at()});
  }
  std::stable_sort(ended.begin(), ended.end(), [](const Ended& x, const Ended& y) { return x.at < y.at; });
  for (const Ended& e : ended) worker_ended(workers_[e.index], e.status);
}

void Driver::worker_ended(Worker& w, const ExitStatus& s) {
  w.exit = s;
  const auto& a = w.assignment;
  double after = seconds(clock_.now() - w.started);
  if (d_.output) d_.output->drain(w.key, 200);
  d_.events->emit(ev::WorkerExited{.generation = rec_.generation,
                                   .host = a.slot.host,
                                   .rank = a.rank,
                                   .exit_code = s.shell_code(),
                                   .oom_killed = s.oom_killed,
                                   .stopped_by_erun = is_stopping(w.state),
                                   .standby = w.standby()});
  if (w.standby()) {
    if (!is_stopping(w.state)) {
      standbys_.lost(w.assignment.slot, clock_.now(), fmt::format("ended with {} after {:.1f} s", s.describe(), after));
      w.set_state(WorkerState::kExcluded);
    }
    return;
  }
  if (w.pending()) {
    // Never part of a generation: its end fails its host, not the job's generation.
    replacement_failed(w, fmt::format("ended with {} after {:.1f} s", s.describe(), after));
    return;
  }
  if (is_stopping(w.state)) {
    if (w.state == WorkerState::kExcluded && !s.ok()) {
      // Left out already on a survivor's report; say how it ended too.
      ERUN_LOG_WARN("{}: failed with {} after {:.1f} s (already left out of the job)",
                    who(rec_.generation, a.slot.host, a.rank), s.describe(), after);
    }
    return;
  }
  if (s.ok()) {
    ERUN_LOG_INFO("{}: finished successfully after {:.1f} s", who(rec_.generation, a.slot.host, a.rank), after);
    outcome_.any_success = true;
    stop_fresh_workers(workers_, rec_.generation);
    if (finishing_.first.empty()) {
      finishing_.first = who(-1, a.slot.host, a.rank);
      finishing_.first_at = clock_.now();
    }
    crash_loop_.progress();
    return;
  }
  // A worker that outlived earlier generations and dies within a moment of
  // the last failure is part of that failure (every worker killed at once
  // is reaped over several ticks, each re-forming the generation), not
  // another crash of the program.
  const bool same_burst = w.launched_generation < rec_.generation && last_failure_at_ &&
                          clock_.now() - *last_failure_at_ < kFailureBurst;
  if (same_burst) {
    gen_.burst_losses = true;
  } else {
    crash_loop_.worker_failed(a.slot.host, s);
  }
  ERUN_LOG_WARN("{}: failed with {} after {:.1f} s", who(rec_.generation, a.slot.host, a.rank), s.describe(), after);
  gen_.fail(Failure{rec_.generation, a.slot.host, a.rank, s, stderr_tail(w, d_.output), after, w.handle->host_unreachable()});
}

void Driver::set_phase(JobPhase next) {
  ERUN_CHECK(transition_allowed(phase_, next));
  if (next == phase_) return;
  const bool waiting = next == JobPhase::kWaitingForHosts || next == JobPhase::kWaitingWithSurvivors;
  const bool was_waiting = phase_ == JobPhase::kWaitingForHosts || phase_ == JobPhase::kWaitingWithSurvivors;
  if (waiting && !was_waiting) {
    waiting_.since = clock_.now();
    waiting_.last_log = {};
  }
  ERUN_LOG_DEBUG("job phase: {} -> {}", to_string(phase_), to_string(next));
  phase_ = next;
}

void Driver::request_stop(int signal) { stop_signal_.store(signal); }
JobPhase Driver::phase() const { return phase_; }
uint64_t Driver::superseded_by() const { return superseded_by_; }
const Plan& Driver::plan() const { return plan_; }
const DriverRecord& Driver::record() const { return rec_; }
const HostManager& Driver::host_manager() const { return hosts_; }

void Driver::done(int code) {
  outcome_.exit_code = code;
  set_phase(JobPhase::kDone);
}

void Driver::stop(JobPhase then, int signal, std::function<int()> exit_code) {
  stop_.begin(workers_, signal, then, std::move(exit_code), clock_.now(), o_.term_grace);
  set_phase(JobPhase::kStopping);
  continue_stop();  // workers that are gone already end it at once
}

void Driver::continue_stop() {
  reap();
  if (!stop_.settled(workers_, clock_.now(), o_.term_grace, rec_.generation)) return;
  for (auto& w : workers_) {
    if (d_.output && w.handle) d_.output->drain(w.key, 200);
  }
  if (stop_.then() == JobPhase::kWaitingForHosts) {
    set_phase(JobPhase::kWaitingForHosts);
    return;
  }
  done(stop_.exit_code());
}

std::optional<int> Driver::step() {
  auto code = turn();
  rec_.in_place = members_joined(workers_);
  return code;
}

std::optional<int> Driver::turn() {
  if (phase_ != JobPhase::kDone && check_superseded()) return outcome_.exit_code;
  if (int sig = stop_signal_.exchange(0)) on_signal(sig);
  if (phase_ == JobPhase::kDone) return outcome_.exit_code;
  if (o_.elastic) {  // a static host set never changes
    auto listed = discovery_.refresh(*loop_, *d_.discovery, d_.synchronous_discovery, o_.discovery_interval,
                                     clock_.now(), *d_.events);
    if (listed) set_discovered(std::move(*listed));
  }
  // DRAINING notices the launchers' agents sent since the last turn.
  for (Launcher* l : {d_.local_launcher, d_.remote_launcher != d_.local_launcher ? d_.remote_launcher : nullptr}) {
    if (!l) continue;
    for (auto& [host, why] : l->take_drains()) apply(drains_.start(snapshot(), host, why, /*from_discovery=*/false));
  }
  reap();
  if (memory_.due(clock_.now()) && phase_ != JobPhase::kStopping && phase_ != JobPhase::kFinishing &&
      phase_ != JobPhase::kDone) {
    apply(memory_.tend(
        snapshot(), [&](const std::string& host) { bool local; return specs_.launcher_for(host, &local).agent_alive(host); },
        [&](const std::string& host) { return hosts_.is_blacklisted(host); }));
  }
  if (departed_.due(clock_.now()) && phase_ != JobPhase::kDone) {
    apply(departed_.tend(snapshot(), [&](const std::string& host) {
      return replicas_ && replicas_->keepers().count(host) > 0;
    }));
  }
  switch (phase_) {
    case JobPhase::kWaitingForHosts: wait_for_hosts(); break;
    case JobPhase::kWaitingWithSurvivors: wait_with_survivors(); break;
    case JobPhase::kRunning: supervise(); break;
    case JobPhase::kFinishing: finish(); break;
    case JobPhase::kStopping: continue_stop(); break;
    case JobPhase::kDone: break;
  }
  if (phase_ == JobPhase::kDone) return outcome_.exit_code;
  return std::nullopt;
}

void Driver::on_signal(int sig) {
  if (phase_ == JobPhase::kDone) return;
  ERUN_LOG_WARN("received signal {} ({}): stopping all workers", sig, strsignal(sig));
  d_.events->emit(ev::Signal{.signal = sig});
  if (sig == SIGKILL) stop_.kill_now();
  const int forward = sig == SIGHUP ? SIGTERM : sig;
  if (phase_ != JobPhase::kStopping) {
    stop(JobPhase::kDone, forward, [sig] { return 128 + sig; });
    return;
  }
  stop_.again(workers_, sig, forward);
  continue_stop();
}

void Driver::wait_for_hosts() {
  plan_cache_.update(discovery_.epoch, discovery_.hosts, hosts_, rec_.generation, plan_, o_.max_np);
  const HostSet& usable = plan_cache_.usable();
  if (usable.total_slots() >= std::max(o_.min_np, 1)) {
    start_generation(HostSet(usable));
    return;
  }
  if (clock_.now() - waiting_.since > o_.elastic_timeout) {
    ERUN_LOG_ERROR("gave up after --elastic-timeout {:.0f} s: {} usable slot{}, --min-np is {}; add hosts "
                   "or lower --min-np",
                   seconds(o_.elastic_timeout), usable.total_slots(), usable.total_slots() == 1 ? "" : "s",
                   o_.min_np);
    done(give_up_code(outcome_.first_failure));
    return;
  }
  waiting_.log(usable.total_slots(), hosts_, o_.min_np, o_.elastic_timeout, clock_.now());
}

void Driver::supervise() {
  MembershipSnapshot m = stragglers_.look(d_.membership);
  if (d_.membership && !gen_.complete && note_joins(workers_, m, plan_, crash_loop_)) {
    gen_.joined(rec_.generation, plan_.size(), m, clock_.now(), *d_.events);
  }
  if (reports_.pending(m.rejoined)) apply(reports_.take(snapshot(), m.rejoined));
  if (std::any_of(workers_.begin(), workers_.end(), [](const Worker& w) { return w.state == WorkerState::kRetiring && !w.exit; })) {
    apply(retire_due(snapshot(&m)));
  }
  if (drains_.any()) apply(drains_.tend(snapshot(&m)));
  if (d_.account) {
    const double now = realtime_seconds();
    for (auto& t : m.timings) d_.account->commit_seen(t.commit_id, now);
  }
  if (stragglers_.watching(m.timings)) {
    apply(stragglers_.watch(snapshot(nullptr, /*workers=*/false), m.timings));  // timings come from a rendezvous only
  }
  if (d_.membership && !gen_.complete && rejoin_.due(gen_.published_at, gen_.after_failure, clock_.now())) {
    apply(rejoin_.watch(snapshot(&m), m));
  }
  if (gen_.failure) {
    handle_generation_failure();
    return;
  }
  if (all_exited(workers_)) {
    done(finished_code(gen_.failure, d_.job_id, rec_, *d_.events));
    return;
  }
  if (!outcome_.any_success && in_place_possible(o_.mode, d_.membership != nullptr, workers_)) {
    if (auto why = rejoin_requested(workers_, m)) {
      reconfigure(fmt::format("re-forming ({})", to_string(*why)).c_str(), *why != JoinReason::kHostsUpdated);
      return;
    }
    if (std::any_of(workers_.begin(), workers_.end(), [](const Worker& w) { return w.standby_ready(); })) {
      apply(standbys_.overtake(snapshot(&m)));
    }
    if (admit_replacements(m)) return;
  }
  if (outcome_.any_success) {
    finishing_.begin(rec_.generation, o_.finish_timeout, clock_.now());
    set_phase(JobPhase::kFinishing);
    return;
  }
  follow_membership();
  // The plan cache's hosts (follow_membership() brought them up to date this turn).
  StandbyPolicy::Turn turn;
  turn.usable = &plan_cache_.usable();
  // Bumps with the hosts and with the blacklist (a cooldown that ends frees
  // a slot without changing the hosts or, under --max-np, the plan).
  turn.hosts_epoch = plan_cache_.recomputations();
  turn.starts = gen_.complete && phase_ == JobPhase::kRunning;
  turn.finishing = outcome_.any_success;
  turn.resting = [&](const SlotKey& slot) { return stragglers_.resting(slot); };
  apply(standbys_.tend(snapshot(&m), turn));
  // Spare hosts keep replicas of the commits (--commit-replicas).
  if (replicas_) replicas_->tend(plan_, plan_cache_.usable(), discovery_.hosts, hosts_, plan_cache_.recomputations());
}

void Driver::handle_generation_failure() {
  if (d_.membership && in_place_possible(o_.mode, true, workers_)) {
    tell_survivors_of_losses(workers_, plan_, rec_.generation, *d_.membership, *d_.events);
  }
  Failure f = *gen_.failure;
  if (!outcome_.first_failure) outcome_.first_failure = f;
  const bool fatal_code = f.status.signal == 0 && f.status.code == kFatalExitCode;
  if (fatal_code || has_no_retry_mark(f.stderr_tail)) {
    ERUN_LOG_ERROR("{}: {} stopped for an error in the program that a restart would repeat ({}); "
                   "ending the job without a retry: fix the program and start the job again",
                   who(rec_.generation), who(-1, f.host, f.rank),
                   fatal_code ? fmt::format("exit code {}", kFatalExitCode) : std::string("marked not retried"));
    stop(JobPhase::kDone, SIGTERM, [this, f] { return failed_code(f, rec_, *d_.events); });
    return;
  }
  hosts_.count_failure(f.host, f.unreachable, *d_.events);
  for (auto& h : plan_.hosts()) {
    if (h != f.host) hosts_.record_success(h);
  }
  if (outcome_.any_success) {
    // Training is over for at least one rank: no restart; kFinishing explains
    // and stops the others.
    set_phase(JobPhase::kFinishing);
    return;
  }
  last_failure_at_ = clock_.now();
  if (gen_.burst_losses && !crash_loop_.failures_seen()) {
    // Only the rest of an earlier failure: no step of a crash loop.
  } else if (auto loop = crash_loop_.generation_failed(clock_.now() - gen_.published_at)) {
    ERUN_LOG_ERROR("{}: {}", who(rec_.generation), *loop);
    d_.events->emit(ev::CrashLoop{.generations = crash_loop_.streak()});
    stop(JobPhase::kDone, SIGTERM, [this, f] { return failed_code(f, rec_, *d_.events); });
    return;
  }
  if (o_.reset_limit >= 0 && rec_.resets >= o_.reset_limit) {
    ERUN_LOG_ERROR("{}: --reset-limit {} reached, so this failure ends the job (raise --reset-limit to "
                   "allow more restarts)",
                   who(rec_.generation), o_.reset_limit);
    stop(JobPhase::kDone, SIGTERM, [this, f] { return failed_code(f, rec_, *d_.events); });
    return;
  }
  count_reset(rec_, *d_.events, "worker failed");
  const bool in_place = in_place_possible(o_.mode, d_.membership != nullptr, workers_);
  ERUN_LOG_WARN("{}: {} failed; {} (reset {}{})", who(rec_.generation), who(-1, f.host, f.rank),
                in_place ? "survivors re-join in place" : "restarting all workers", rec_.resets,
                o_.reset_limit >= 0 ? fmt::format(" of {}", o_.reset_limit) : "");
  if (in_place) {
    reconfigure("recovering", /*after_failure=*/true);
  } else {
    stop(JobPhase::kWaitingForHosts);
  }
}

bool Driver::held_below_min_np(const Plan& next, int usable_slots, bool in_place) {
  if (next.size() >= std::max(o_.min_np, 1)) {
    waiting_.below_min_logged = false;
    return false;
  }
  if (in_place && draining_members(workers_, drains_, stragglers_)) {
    // A host leaves on notice whatever the plan: its workers leave at the
    // commit, and the survivors wait in the rendezvous for --min-np.
    count_reset(rec_, *d_.events, "membership changed");
    reconfigure("a host drains", /*after_failure=*/false);
    return true;
  }
  // Fewer slots than --min-np: a shrink would stop the job. The running
  // workers go on (failures still count) until the hosts come back.
  if (!waiting_.below_min_logged) {
    ERUN_LOG_WARN("{}: discovery offers {} usable slot{}, fewer than --min-np {}; keeping the {} running "
                  "workers until hosts return",
                  who(rec_.generation), usable_slots, usable_slots == 1 ? "" : "s", o_.min_np, plan_.size());
    waiting_.below_min_logged = true;
  }
  return true;
}

void Driver::follow_membership() {
  // Recomputed only when the hosts, the blacklist, the plan or the
  // blacklisted hosts kept for their survivors changed.
  const bool in_place = in_place_possible(o_.mode, d_.membership != nullptr, workers_);
  Plan scratch;
  plan_cache_.update(discovery_.epoch, discovery_.hosts, hosts_, rec_.generation, plan_with_pending(workers_, plan_, scratch), o_.max_np,
                     in_place ? blacklisted_with_survivors(workers_, hosts_) : std::vector<SlotKey>{});
  // The cached plan, unless a straggler's slot sits out (no copy per tick).
  const bool resting_slots = stragglers_.any_resting();
  Plan filtered;
  if (resting_slots) filtered = stragglers_.without_resting(plan_cache_.next());
  const Plan& next = resting_slots ? filtered : plan_cache_.next();
  if (replacements_cover(workers_, plan_, next)) return;  // they join first (admit_replacements())
  if (next.same_layout(plan_)) {
    waiting_.below_min_logged = false;
    return;
  }
  if (held_below_min_np(next, plan_cache_.usable_slots(), in_place)) return;
  const bool keeps_every_slot = std::all_of(plan_.ranks.begin(), plan_.ranks.end(),
                                            [&](const RankAssignment& r) { return next.contains(r.slot); });
  if (o_.reset_limit >= 0 && rec_.resets >= o_.reset_limit) {
    if (keeps_every_slot) return;  // could grow, but may not reset any more: keep running
    ERUN_LOG_ERROR("{}: hosts of the job were removed and --reset-limit {} is reached, so the job ends "
                   "(raise --reset-limit to let it resize)",
                   who(rec_.generation), o_.reset_limit);
    stop(JobPhase::kDone, SIGTERM, [] { return 1; });
    return;
  }
  if (in_place && next.size() > plan_.size() && keeps_every_slot) {
    grow_pending(next);  // announced once the new workers joined (admit_replacements())
    return;
  }
  count_reset(rec_, *d_.events, "membership changed");
  ERUN_LOG_INFO("{}: membership changes ({} -> {}); {} (reset {})", who(rec_.generation), plan_.to_string(),
                next.to_string(), in_place ? "notifying workers" : "restarting all workers", rec_.resets);
  if (in_place) {
    reconfigure("membership changes", /*after_failure=*/false);
  } else {
    stop(JobPhase::kWaitingForHosts);
  }
}

void Driver::finish() {
  auto now = clock_.now();
  if (gen_.failure && !finishing_.failed) {
    // A worker failed after another finished: no restart is possible.
    const Failure& f = *gen_.failure;
    finishing_.failed = true;
    finishing_.because = fmt::format(
        "{} finished successfully {:.1f} s ago and then {} failed with {}; a job cannot restart once "
        "a worker has finished, so erun ends it with the failure's exit code (see the root cause below)",
        finishing_.first, seconds(now - finishing_.first_at), who(-1, f.host, f.rank), f.status.describe());
    ERUN_LOG_ERROR("{}: {}", who(rec_.generation), finishing_.because);
    finishing_.deadline = now;
  }
  if (all_exited(workers_)) {
    done(finished_code(gen_.failure, d_.job_id, rec_, *d_.events));
    return;
  }
  if (now < finishing_.deadline) return;
  std::vector<const Worker*> stragglers;
  std::vector<std::string> names;
  for (auto& w : workers_) {
    if (w.exit) continue;
    stragglers.push_back(&w);
    if (names.size() < 8) names.push_back(fmt::format("rank {} on {}", w.assignment.rank, w.assignment.slot.host));
  }
  ERUN_LOG_ERROR("{}: stopping {} worker{} still running ({}{}): {}", who(rec_.generation), stragglers.size(),
                 stragglers.size() == 1 ? "" : "s", join(names, ", "), stragglers.size() > names.size() ? ", ..." : "",
                 finishing_.because);
  if (!stragglers.empty()) {
    const Worker& w = *stragglers.front();
    gen_.fail(Failure{rec_.generation, w.assignment.slot.host, w.assignment.rank, ExitStatus{1, 0},
                            {"still running --finish-timeout after another rank finished"}, seconds(now - w.started)});
  }
  stop(JobPhase::kDone, SIGTERM, [this] { return finished_code(gen_.failure, d_.job_id, rec_, *d_.events); });
}

int Driver::run() {
  if (Status s = start(); !s) {
    ERUN_LOG_ERROR("{}", s.message());
    return 1;
  }
  while (true) {
    auto code = step();
    if (d_.after_step) d_.after_step(*this);
    if (code) return *code;
    clock_.sleep_for(kTick);
  }
}

}  // namespace erun
