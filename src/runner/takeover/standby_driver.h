// The takeover forms of erun's command line (`erun --attach NAME`,
// `erun --watch --attach NAME`, `--job-record FILE`) and the standby
// driver's watch over a job's driver (docs/protocol.md, "Taking a job over").
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "common/clock.h"
#include "runner/takeover/job_record.h"

namespace erun {

// erun's arguments when they are only --attach NAME, --standby,
// --job-record FILE and --driver-address ADDR (in any order, --attach or
// --job-record given): a takeover, not a job's command line (where
// --standby N counts standby workers). nullopt: a job's command line.
// `error` set: a malformed one; `jobs_dir` set: the record's directory given
// by --job-record; `driver_address`: where the hosts reach this erun, in
// place of the job's own --driver-address (a standby on another machine).
struct TakeoverForm {
  std::string name, jobs_dir, driver_address, error;
  bool standby = false;
};
std::optional<TakeoverForm> parse_takeover_form(const std::vector<std::string>& args);

// `erun --watch --attach NAME`: watches job NAME's driver through its
// record and takes the job over by itself when that driver is gone (the
// job's lock is free) or has been silent for `silence` (its heartbeat, the
// record's modification time, stands still: frozen, or its machine cut
// off). Returns the job's store to drive it with, or the exit code when
// there is nothing to take over. One standby per job.
std::variant<std::unique_ptr<JobStore>, int> stand_by(const std::string& jobs_dir, const std::string& name,
                                                      Duration silence);

}  // namespace erun
