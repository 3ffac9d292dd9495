// The job record: what a new erun needs to take a running job over (the
// secret, the rendezvous port, the agents' attach sockets, the running plan,
// the generation and the counts), in a private file the driver rewrites
// atomically whenever it changes, beside the lock that lets one driver at a
// time hold the job (docs/design.md, "A driver that can be replaced").
// JobStore: one per driver, from its thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "common/fd.h"
#include "common/status.h"
#include "rendezvous/membership.h"
#include "runner/driver_record.h"
#include "runner/hosts/host_manager.h"

namespace erun {

// The driver's part (DriverRecord) and how to reach the job.
struct JobRecord : DriverRecord {
  std::string name;
  uint64_t term = 1;        // raised by every takeover; agents obey the highest they saw
  long driver_pid = 0;      // the driver that holds the job now
  std::string driver_host;
  std::string job_id;
  std::string secret;
  int rendezvous_port = 0;
  std::string commit_dir;   // the job's host-memory commit directories' prefix ("" : none)
  std::string cwd;          // the directory erun ran in
  std::vector<std::string> args;  // erun's arguments (argv[1..])
  struct Agent {
    std::string host;
    std::string attach_path;  // the agent's attach socket on its host
    bool operator==(const Agent&) const = default;
  };
  std::vector<Agent> agents;
  // Its driver does not hold the job's lock: it took the job over from a
  // silent driver, which held it (the lock comes once that one is gone). A
  // lock taken meanwhile by another erun is no sign that this driver is gone.
  bool unlocked = false;
  bool operator==(const JobRecord&) const = default;
};

// One instant on the driver's clock (steady) and on the wall clock: the
// record's time points are on the driver's clock, its text holds them as
// wall-clock times, and a driver on another machine, or started later,
// reads them back onto its own clock.
struct RecordClock {
  TimePoint steady;
  std::chrono::system_clock::time_point wall;
  static RecordClock now();
};

// Text, one field a line ("key value", bytes outside '!'..'~' and '%' as
// %XX), the first line naming the format; decode refuses anything else.
std::string encode_record(const JobRecord& r, const RecordClock& at = RecordClock::now());
Result<JobRecord> decode_record(std::string_view text, const RecordClock& at = RecordClock::now());

// The name of a job run without --job-name: "job-" and 12 hex digits of a
// hash of the user, the directory and erun's arguments, so the same command
// run again from the same directory by the same user finds the same job.
std::string default_job_name(const std::string& cwd, const std::vector<std::string>& args);
// Where job records live: $ERUN_JOB_DIR when set, else $HOME/.erun/jobs.
std::string jobs_directory();
// A job name is a file name: letters, digits, '.', '_', '-', not starting with '.'.
bool valid_job_name(const std::string& name);

class JobStore {
 public:
  // Makes `jobs_dir`/`name` (0700, this user's, no links) and takes its
  // lock without waiting. When another live erun holds it: an error that
  // names that erun and says what to do, and *held (when given) is set.
  static Result<std::unique_ptr<JobStore>> lock(const std::string& jobs_dir, const std::string& name,
                                                bool* held = nullptr);
  // A standby driver's way in while the job's driver is alive but silent
  // (frozen, or on a machine cut off): the job's directory without its lock,
  // which try_lock() takes once that driver is gone.
  static Result<std::unique_ptr<JobStore>> open_unlocked(const std::string& jobs_dir, const std::string& name);
  bool holds_lock() const { return static_cast<bool>(lock_); }
  bool try_lock();
  // The driver's heartbeat: the record's modification time, set to now.
  void touch();
  // The record, when one is there; a damaged one is reported and ignored.
  std::optional<JobRecord> read() const;
  // How long ago the record was written or touched (the wall clock), when
  // there is one.
  std::optional<Duration> record_age() const;
  // The record file's inode (0: none): it changes with every write().
  uint64_t record_inode() const;
  // Replaces the record atomically (a private temporary file, fsync, rename);
  // refused when the record there names a newer driver term of the job.
  Status write(const JobRecord& r);
  // The job ended: its record and events go, and with this store's lock its
  // lock file and its directory (when nothing else is left in it); the
  // lock itself is held until this store goes. Nothing goes when the record
  // there names a newer driver term than this store wrote (a driver replaced
  // while frozen or cut off, ending without having heard of it): false.
  bool remove();
  std::string record_path() const { return dir_ + "/record"; }
  // The job's events when erun has no --event-log (a private file of the
  // job's directory): a taking-over erun reads its account back from them.
  std::string events_path() const { return dir_ + "/events"; }

 private:
  JobStore(std::string dir, Fd dir_fd, Fd lock) : dir_(std::move(dir)), dir_fd_(std::move(dir_fd)), lock_(std::move(lock)) {}
  std::string dir_;
  Fd dir_fd_;
  Fd lock_;
  std::string written_job_;  // the job id and driver term this store last wrote
  uint64_t written_term_ = 0;
};

// Reads the record of job `name` under `jobs_dir` without taking its lock
// (erun --attach NAME, before it locks).
std::optional<JobRecord> peek_record(const std::string& jobs_dir, const std::string& name);

// What changes whenever the job's driver beats (JobStore::touch()) or
// rewrites the record: its inode, size and modification time, read through
// a fresh open (so that NFS revalidates it); "" when there is no record.
std::string record_stamp(const std::string& jobs_dir, const std::string& name);

}  // namespace erun
