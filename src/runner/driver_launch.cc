// The driver's launch side: where each rank's worker runs and what it is
// given (environment, spec, addresses), and --dry-run, which prints all of it
// without launching anything.
#include <unistd.h>

#include <set>

#include <fmt/format.h>

#include "common/log.h"
#include "common/strings.h"
#include "runner/driver.h"

namespace erun {

Launcher& Driver::launcher_for(const std::string& host, bool* local) const {
  bool is_local = o_.launcher == LauncherKind::kLocal ||
                  (o_.launcher == LauncherKind::kAuto && is_local_host(host)) || !d_.remote_launcher;
  *local = is_local;
  return is_local ? *d_.local_launcher : *d_.remote_launcher;
}

std::string Driver::master_address() const {
  const std::string& host = plan_.ranks.front().slot.host;
  bool all_local = true;
  for (auto& r : plan_.ranks) {
    bool local;
    launcher_for(r.slot.host, &local);
    all_local = all_local && local;
  }
  if (all_local) return "127.0.0.1";
  if (is_local_host(host)) {
    char name[256] = {};
    ::gethostname(name, sizeof name - 1);
    return name;
  }
  return host;
}

std::string Driver::advertise_address(const std::string& host, bool local) const {
  if (!local) return host;
  // A "host" named by a loopback address (--launcher local with 127.0.0.2,
  // .3, ...) keeps it, so that its workers' cross-host traffic really uses
  // distinct addresses.
  if (starts_with(host, "127.")) return host;
  if (discovery_.all_local) return "127.0.0.1";
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return name;
}

std::string Driver::rendezvous_address(const std::string& host, bool local) const {
  if (local) return "127.0.0.1";
  if (!o_.driver_address.empty()) return o_.driver_address;
  if (starts_with(host, "127.")) return "127.0.0.1";
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return name;
}

WorkerSpec Driver::make_spec(const RankAssignment& a, const std::string& master_addr, int master_port) const {
  WorkerSpec s;
  s.generation = rec_.generation;
  s.rank = a.rank;
  s.host = a.slot.host;
  s.local_index = a.slot.local_index;
  s.command = o_.command;
  s.env = worker_env(a, master_addr, master_port);
  char cwd[4096];
  if (::getcwd(cwd, sizeof cwd)) s.cwd = cwd;
  if (!o_.output_dir.empty()) {
    // Relative to erun's directory, as the workers' own directory is.
    s.output_dir = o_.output_dir[0] == '/' || s.cwd.empty() ? o_.output_dir : s.cwd + "/" + o_.output_dir;
  }
  s.secret = d_.secret;
  s.term_grace = o_.term_grace;
  return s;
}

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
  auto spec = make_spec(a, master_addr, master_port);
  // A standby waits in its first join for as long as it takes (the driver stops it).
  if (standby) spec.env.emplace_back("ERUN_STANDBY", "1");
  auto& launcher = launcher_for(a.slot.host, &w.local);
  if (!d_.commit_dir.empty()) memory_.holds(a.slot.host);
  auto h = launcher.launch(spec);
  if (!h) {
    ERUN_LOG_ERROR("{}: launch failed: {}", who(rec_.generation, a.slot.host, a.rank), h.message());
    w.exit = ExitStatus{127, 0};
    if (standby) {
      standby_lost(w, "could not be launched: " + h.message());
      workers_.push_back(std::move(w));
      return false;
    }
    if (pending) {  // the survivors' generation does not include it
      replacement_failed(w, "could not be launched");
      workers_.push_back(std::move(w));
      return false;
    }
    crash_loop_.worker_failed(a.slot.host, *w.exit);
    fail_generation(Failure{rec_.generation, a.slot.host, a.rank, *w.exit, {h.message()}, 0});
    workers_.push_back(std::move(w));
    return false;
  }
  w.handle = std::move(h.value());
  ++launched_;
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
  set_plan(make_plan(1, usable, o_.max_np, nullptr));
  std::fprintf(out, "job %s, generation 1: %s\n", d_.job_id.c_str(), plan_.to_string().c_str());
  std::string master_addr = master_address();
  std::set<std::string> agents;
  for (auto& a : plan_.ranks) {
    bool local;
    auto& launcher = launcher_for(a.slot.host, &local);
    auto spec = make_spec(a, master_addr, 0);
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
