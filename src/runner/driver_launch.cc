// The driver's launch side: launching a rank's worker (what it is given and
// where it runs: launch/worker_specs.h), and --dry-run, which prints all of
// it without launching anything.
#include <set>

#include <fmt/format.h>

#include "common/log.h"
#include "common/strings.h"
#include "runner/driver.h"

namespace erun {

namespace {

// What a worker's spec takes from the running job.
WorkerSpecs::Now spec_now(const DriverRecord& rec, const Plan& plan, bool all_local, const StragglerWatch& stragglers) {
  WorkerSpecs::Now now;
  now.generation = rec.generation;
  now.restarts = rec.restarts;
  now.plan = &plan;
  now.all_local = all_local;
  now.preflight = stragglers.preflight_on();
  now.probe_peer = [&stragglers, &plan](const std::string& host) { return stragglers.probe_peer_for(host, plan); };
  return now;
}

}  // namespace

bool Driver::launch_worker(const RankAssignment& a, const std::string& master_addr, int master_port,
                           WorkerStage stage) {
  const bool pending = is_pending_stage(stage);
  const bool standby = is_standby(stage);
  Worker w;
  w.key = next_key_++;
  w.assignment = a;
  w.state = pending ? WorkerState::kPending : WorkerState::kMember;
  w.stage = stage;
  w.joined = stage != WorkerStage::kSettled;  // launched into a running elastic job: it runs the same program
  w.launched_generation = rec_.generation;
  w.started = clock_.now();
  auto spec = specs_.make(a, master_addr, master_port, spec_now(rec_, plan_, discovery_.all_local, stragglers_));
  // A standby waits in its first join for as long as it takes (the driver stops it).
  if (standby) spec.env.emplace_back("ERUN_STANDBY", "1");
  auto& launcher = specs_.launcher_for(a.slot.host, &w.local);
  if (!d_.commit_dir.empty()) memory_.holds(a.slot.host);
  auto h = launcher.launch(spec);
  if (!h) {
    ERUN_LOG_ERROR("{}: launch failed: {}", who(rec_.generation, a.slot.host, a.rank), h.message());
    w.exit = ExitStatus{127, 0};
    if (standby) {
      standbys_.lost(a.slot, clock_.now(), "could not be launched: " + h.message());
      w.set_state(WorkerState::kExcluded);
      workers_.push_back(std::move(w));
      return false;
    }
    if (pending) {  // the survivors' generation does not include it
      replacement_failed(w, "could not be launched");
      workers_.push_back(std::move(w));
      return false;
    }
    crash_loop_.worker_failed(a.slot.host, *w.exit);
    gen_.fail(Failure{rec_.generation, a.slot.host, a.rank, *w.exit, {h.message()}, 0});
    workers_.push_back(std::move(w));
    return false;
  }
  w.handle = std::move(h.value());
  ++rec_.launched;
  if (d_.output) d_.output->add(w.key, a.rank, w.handle->take_stdout(), w.handle->take_stderr());
  ERUN_LOG_DEBUG("{}: launched (pid {})", who(rec_.generation, a.slot.host, a.rank), w.handle->pid());
  workers_.push_back(std::move(w));
  return true;
}

int Driver::dry_run(std::FILE* out) {
  HostSet usable = hosts_.usable(discovery_.hosts);
  if (usable.total_slots() < std::max(o_.min_np, 1)) {
    std::fprintf(out, "hosts offer %d slots, fewer than --min-np %d: erun would wait for more\n",
                 usable.total_slots(), o_.min_np);
    return 1;
  }
  rec_.generation = 1;
  set_running_plan(make_plan(1, usable, o_.max_np, nullptr), plan_, rec_);
  std::fprintf(out, "job %s, generation 1: %s\n", d_.job_id.c_str(), plan_.to_string().c_str());
  std::string master_addr = specs_.master_address(plan_);
  std::set<std::string> agents;
  for (auto& a : plan_.ranks) {
    bool local;
    auto& launcher = specs_.launcher_for(a.slot.host, &local);
    auto spec = specs_.make(a, master_addr, 0, spec_now(rec_, plan_, discovery_.all_local, stragglers_));
    if (agents.insert(a.slot.host).second) {
      std::vector<std::string> quoted;
      for (auto& w : launcher.command_line(spec)) quoted.push_back(shell_quote(w));
      std::fprintf(out, "agent on %s (%s): %s\n", a.slot.host.c_str(), local ? "local" : "remote",
                   join(quoted, " ").c_str());
    }
    std::vector<std::string> program;
    for (auto& w : spec.command) program.push_back(shell_quote(w));
    std::fprintf(out, "rank %d on %s slot %d:\n  program: %s\n  directory: %s\n  environment:\n", a.rank,
                 a.slot.host.c_str(), a.slot.local_index, join(program, " ").c_str(), spec.cwd.c_str());
    if (!spec.output_dir.empty()) {
      std::fprintf(out, "  output files (on %s): %s/rank.%d/stdout, stderr\n", a.slot.host.c_str(),
                   spec.output_dir.c_str(), a.rank);
    }
    for (auto& [name, value] : spec.env) std::fprintf(out, "    %s=%s\n", name.c_str(), shell_quote(value).c_str());
    std::fprintf(out, "    ERUN_SECRET=<redacted: sent on the agent's stdin>\n");
  }
  std::fprintf(out, "MASTER_PORT is chosen at launch; workers travel over each host's agent channel, not argv.\n");
  return 0;
}

}  // namespace erun
