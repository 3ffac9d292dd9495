// The driver's launchers, made once from the options: the local one for
// this machine's agents, and srun or ssh for the others' (docs/design.md,
// "Launchers").
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "runner/launch/launcher.h"
#include "runner/options.h"

namespace erun {

class SlurmGrow;

// The launchers: the local one for this machine's workers, srun or ssh for
// the others.
struct Launchers {
  std::unique_ptr<Launcher> local;
  std::unique_ptr<Launcher> remote;
  std::vector<Launcher*> all() const {
    std::vector<Launcher*> out;
    for (auto* l : {local.get(), remote.get()}) {
      if (l) out.push_back(l);
    }
    return out;
  }
};

// The launchers the options ask for; an error naming what is missing.
// `slurm_grow`: the nodes lent by placeholder jobs (null: none).
Result<Launchers> make_launchers(const DriverOptions& options, const std::shared_ptr<SlurmGrow>& slurm_grow);

// The launcher of `host`'s agent, as the driver picks it.
Launcher& launcher_of(const DriverOptions& o, Launchers& l, const std::string& host);

}  // namespace erun
