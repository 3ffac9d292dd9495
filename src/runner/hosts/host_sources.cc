#include "runner/hosts/host_sources.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <fmt/format.h>

#include "common/strings.h"
#include "discovery/host_set.h"
#include "runner/launch/launcher.h"

namespace erun {
namespace {

std::string env_text(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

// The allocation's hosts: names from SLURM_JOB_NODELIST, slots from
// --slots-per-host, SLURM_TASKS_PER_NODE or SLURM_JOB_CPUS_PER_NODE.
Result<HostSet> slurm_allocation(const DriverOptions& o) {
  std::string nodelist = env_text("SLURM_JOB_NODELIST");
  if (nodelist.empty()) nodelist = env_text("SLURM_NODELIST");
  if (nodelist.empty()) {
    return Result<HostSet>::error(
        "--slurm: SLURM_JOB_NODELIST is not set; run erun inside an allocation (salloc, sbatch) or give -H/--hostfile");
  }
  std::string counts = o.slots_per_host > 0 ? std::to_string(o.slots_per_host) : env_text("SLURM_TASKS_PER_NODE");
  const char* counts_from = o.slots_per_host > 0 ? "--slots-per-host" : "SLURM_TASKS_PER_NODE";
  if (counts.empty()) {
    counts = env_text("SLURM_JOB_CPUS_PER_NODE");
    counts_from = "SLURM_JOB_CPUS_PER_NODE";
  }
  auto hs = slurm_hosts(nodelist, counts);
  if (!hs) {
    return Result<HostSet>::error(fmt::format("--slurm: SLURM_JOB_NODELIST={} with {}={}: {}", nodelist,
                                                          counts_from, counts, hs.message()));
  }
  return hs;
}

}  // namespace

bool loopback_only(const DriverOptions& o, HostDiscovery& discovery) {
  if (o.launcher == LauncherKind::kLocal) return true;
  if (!o.discovery_script.empty() || o.launcher == LauncherKind::kSrun || o.slurm) return false;
  if (!o.driver_address.empty()) return false;
  auto hosts = discovery.discover();  // a StaticDiscovery: no I/O
  if (!hosts || hosts->empty()) return false;
  for (auto& h : hosts->hosts()) {
    bool loopback = is_local_host(h.name) || starts_with(h.name, "127.") || h.name == "::1";
    if (!loopback) return false;
  }
  return true;
}

Result<std::unique_ptr<HostDiscovery>> make_discovery(const DriverOptions& o) {
  using R = Result<std::unique_ptr<HostDiscovery>>;
  int default_slots = o.slots_per_host > 0 ? o.slots_per_host : 1;
  // With --slurm, a discovery script stays the source (it may drop drained nodes).
  if (o.slurm && o.discovery_script.empty()) {
    auto hs = slurm_allocation(o);
    if (!hs) return R::error(hs.message());
    return R(std::unique_ptr<HostDiscovery>(
        std::make_unique<StaticDiscovery>(*hs, "the Slurm allocation " + hs->to_string())));
  }
  if (!o.discovery_script.empty()) {
    return R(std::unique_ptr<HostDiscovery>(
        std::make_unique<ScriptDiscovery>(o.discovery_script, o.discovery_timeout, default_slots)));
  }
  if (!o.hosts.empty()) {
    auto hs = parse_hosts_flag(o.hosts, default_slots);
    if (!hs) return R::error(fmt::format("-H {}: {}", o.hosts, hs.message()));
    return R(std::unique_ptr<HostDiscovery>(std::make_unique<StaticDiscovery>(*hs, "-H")));
  }
  if (!o.hostfile.empty()) {
    std::ifstream in(o.hostfile);
    if (!in) return R::error(fmt::format("--hostfile {}: cannot read the file", o.hostfile));
    std::stringstream text;
    text << in.rdbuf();
    auto hs = parse_hostfile(text.str(), default_slots);
    if (!hs) return R::error(fmt::format("--hostfile {}: {}", o.hostfile, hs.message()));
    return R(std::unique_ptr<HostDiscovery>(std::make_unique<StaticDiscovery>(*hs, "--hostfile")));
  }
  int slots = o.slots_per_host > 0 ? o.slots_per_host : std::max(o.np, o.max_np);
  return R(std::unique_ptr<HostDiscovery>(std::make_unique<StaticDiscovery>(
      HostSet({Host{"localhost", slots}}), "this machine")));
}

}  // namespace erun
