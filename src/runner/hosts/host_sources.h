// Where a job's hosts come from, as the command line says (a discovery
// script, --slurm's allocation, -H, --hostfile, or this machine), and
// whether they are all this machine's.
#pragma once

#include <memory>

#include "common/status.h"
#include "discovery/discovery.h"
#include "runner/options.h"

namespace erun {

// The job's host discovery; an error naming the flag or variable at fault.
Result<std::unique_ptr<HostDiscovery>> make_discovery(const DriverOptions& o);
// True when every worker of the job runs on this machine: --launcher local,
// or a fixed host set (no discovery script) of local or loopback hosts.
bool loopback_only(const DriverOptions& o, HostDiscovery& discovery);

}  // namespace erun
