// How a driver comes by its job (docs/design.md, "Takeover"): the job's
// record and lock, the claim on a job whose driver is gone (a newer term in
// its record, then its agents and their workers), and the forms that name a
// job to take over (`erun --attach NAME`, `--watch`).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "runner/driver.h"
#include "runner/launch/launchers.h"
#include "runner/options.h"
#include "runner/takeover/job_record.h"

namespace erun {

// The job's record and lock (with --driver-grace, or a standby's job): the
// store (null: no record) and what it held (a job to take over); or the exit
// code when another erun holds the job.
struct JobClaim {
  std::unique_ptr<JobStore> store;
  std::optional<JobRecord> previous;
};
std::variant<JobClaim, int> claim_job(const DriverOptions& options, const std::string& name,
                                      std::unique_ptr<JobStore> standby_store);

// Claims a job whose driver is gone: a newer term in its record (before any
// agent hears of it), then its agents and their workers. False when another
// erun claimed it first (its term is in the record): this one leaves it.
bool claim_takeover(const DriverOptions& options, Launchers& launchers, JobStore& store, const JobRecord& previous,
                    const std::string& name, int rdzv_port, DriverDeps::Takeover& takeover);

// `erun --attach NAME` or `erun --watch --attach NAME` (--job-record FILE):
// the job taken over, by its name.
struct Attach {
  std::string name, address;
  bool standby = false;
};

// For the takeover forms: fills `attach`, enters the job's directory and
// puts the job's own command line into `args`. An exit code when erun
// stops here (a wrong form, no such job).
std::optional<int> resolve_takeover(std::vector<std::string>& args, Attach& attach);

}  // namespace erun
