#include "runner/launch/worker_specs.h"

#include <unistd.h>

#include <cstdlib>

#include <fmt/format.h>

#include "common/log.h"
#include "common/strings.h"
#include "common/topology.h"

namespace erun {

Launcher& WorkerSpecs::launcher_for(const std::string& host, bool* local) const {
  bool is_local = o_.launcher == LauncherKind::kLocal ||
                  (o_.launcher == LauncherKind::kAuto && is_local_host(host)) || !site_.remote;
  *local = is_local;
  return is_local ? *site_.local : *site_.remote;
}

bool WorkerSpecs::is_local(const std::string& host) const {
  bool local;
  launcher_for(host, &local);
  return local;
}

std::string WorkerSpecs::master_address(const Plan& plan) const {
  const std::string& host = plan.ranks.front().slot.host;
  bool all_local = true;
  for (auto& r : plan.ranks) {
    bool local;
    launcher_for(r.slot.host, &local);
    all_local = all_local && local;
  }
  if (all_local) return "127.0.0.1";
  if (is_local_host(host)) return this_host_name();
  return host;
}

std::string WorkerSpecs::advertise_address(const std::string& host, bool local, bool all_local) const {
  if (!local) return host;
  // A "host" named by a loopback address (--launcher local with 127.0.0.2,
  // .3, ...) keeps it, so that its workers' cross-host traffic really uses
  // distinct addresses.
  if (starts_with(host, "127.")) return host;
  if (all_local) return "127.0.0.1";
  return this_host_name();
}

std::string WorkerSpecs::rendezvous_address(const std::string& host, bool local) const {
  if (local) return "127.0.0.1";
  if (!o_.driver_address.empty()) return o_.driver_address;
  if (starts_with(host, "127.")) return "127.0.0.1";
  return this_host_name();
}

std::string WorkerSpecs::host_commit_dir(const std::string& host) const {
  // One directory per host, named after it: simulated hosts of one machine
  // (--launcher local, the tests' sshd on 127.0.0.N) keep apart what
  // separate machines would.
  return site_.commit_dir + "-" + host_file_name(host);
}

WorkerSpec WorkerSpecs::make(const RankAssignment& a, const std::string& master_addr, int master_port,
                             const Now& now) const {
  WorkerSpec s;
  s.generation = now.generation;
  s.rank = a.rank;
  s.host = a.slot.host;
  s.local_index = a.slot.local_index;
  s.command = o_.command;
  s.env = env(a, master_addr, master_port, now);
  char cwd[4096];
  if (::getcwd(cwd, sizeof cwd)) s.cwd = cwd;
  if (!o_.output_dir.empty()) {
    // Relative to erun's directory, as the workers' own directory is.
    s.output_dir = o_.output_dir[0] == '/' || s.cwd.empty() ? o_.output_dir : s.cwd + "/" + o_.output_dir;
  }
  s.secret = site_.secret;
  s.term_grace = o_.term_grace;
  return s;
}

// GROUP_RANK is the host's index among the plan's hosts and GROUP_WORLD_SIZE
// their number (not the cross rank, which differs from the host's index
// where hosts have unequal slots: on a:2,b:4, b's local ranks 2 and 3 are
// cross rank 0). OMP_NUM_THREADS=1 where a host runs several workers and
// neither erun's environment nor -x sets it, as torchrun does, so that each
// torch worker does not start one thread per core.
void WorkerSpecs::torchrun_env(std::vector<std::pair<std::string, std::string>>& env, const RankAssignment& a,
                               const Plan& plan) const {
  if (node_index_gen_ != plan.generation) {  // once per plan: this runs for every rank
    node_index_.clear();
    for (const std::string& h : plan.hosts()) node_index_.emplace(h, static_cast<int>(node_index_.size()));
    node_index_gen_ = plan.generation;
  }
  auto at = node_index_.find(a.slot.host);
  env.emplace_back("GROUP_RANK", std::to_string(at != node_index_.end() ? at->second : a.cross_rank));
  env.emplace_back("GROUP_WORLD_SIZE", std::to_string(node_index_.empty() ? a.cross_size : node_index_.size()));
  env.emplace_back("ROLE_NAME", "default");
  bool user_set = std::getenv("OMP_NUM_THREADS") != nullptr;
  for (auto& e : o_.env) user_set = user_set || e.rfind("OMP_NUM_THREADS=", 0) == 0;
  if (a.local_size > 1 && !user_set) env.emplace_back("OMP_NUM_THREADS", "1");
}

std::vector<std::pair<std::string, std::string>> WorkerSpecs::env(const RankAssignment& a,
                                                                  const std::string& master_addr, int master_port,
                                                                  const Now& now) const {
  std::vector<std::pair<std::string, std::string>> env;
  auto put = [&](const char* k, auto v) { env.emplace_back(k, fmt::format("{}", v)); };
  Topology t = a;
  t.generation = now.generation;
  env = topology_env(t);
  torchrun_env(env, a, *now.plan);
  put("ERUN_HOSTNAME", a.slot.host);
  put("ERUN_LOCAL_INDEX", a.slot.local_index);
  put("ERUN_JOB_ID", site_.job_id);
  put("MASTER_ADDR", master_addr);
  put("MASTER_PORT", master_port);
  put("TORCHELASTIC_RESTART_COUNT", now.restarts);
  put("TORCHELASTIC_MAX_RESTARTS", o_.reset_limit < 0 ? 1000000000 : o_.reset_limit);
  put("TORCHELASTIC_RUN_ID", site_.job_id);
  if (!o_.checkpoint_dir.empty()) put("ERUN_CHECKPOINT_DIR", o_.checkpoint_dir);
  if (!site_.commit_dir.empty() && site_.rendezvous) {
    put("ERUN_COMMIT_DIR", host_commit_dir(a.slot.host));
    // 0: a sharded State pushes no buddy copies either (docs/state.md).
    put("ERUN_COMMIT_REPLICAS", o_.commit_replicas);
    // Read by the agent, which then writes the durable files; a worker given
    // both ERUN_CHECKPOINT_DIR and ERUN_COMMIT_DIR leaves them to it.
    if (!o_.checkpoint_dir.empty()) {
      put("ERUN_PERSIST_INTERVAL_MS", std::chrono::duration_cast<std::chrono::milliseconds>(o_.persist_interval).count());
    }
  }
  put("ERUN_COLLECTIVE_TIMEOUT", seconds(o_.collective_timeout));
  put("ERUN_RENDEZVOUS_TIMEOUT", seconds(o_.rendezvous_timeout));
  put("ERUN_ELASTIC_TIMEOUT", seconds(o_.elastic_timeout));
  if (o_.driver_grace > Duration::zero()) put("ERUN_DRIVER_GRACE", seconds(o_.driver_grace));
  if (!now.preflight) put("ERUN_PREFLIGHT", 0);
  // The workers' library says what erun says (--log-level).
  put("ERUN_LOG_LEVEL", log_level_name(o_.log_level));
  if (site_.rendezvous) {
    bool local;
    launcher_for(a.slot.host, &local);
    put("ERUN_RDZV_ADDR", rendezvous_address(a.slot.host, local));
    put("ERUN_RDZV_PORT", site_.rendezvous_port);
    put("ERUN_ADVERTISE_ADDR", advertise_address(a.slot.host, local, now.all_local));
    if (auto peer = now.probe_peer ? now.probe_peer(a.slot.host) : std::nullopt) {
      bool peer_local = false;
      launcher_for(peer->first.host, &peer_local);
      put("ERUN_PROBE_PEER",
          fmt::format("{}:{}", advertise_address(peer->first.host, peer_local, now.all_local), peer->second));
    }
  }
  for (auto& e : o_.env) {
    auto eq = e.find('=');
    if (eq != std::string::npos) env.emplace_back(e.substr(0, eq), e.substr(eq + 1));
  }
  return env;
}

}  // namespace erun
