#include "runner/takeover/standby_driver.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

#include <fmt/format.h>

#include "common/log.h"

namespace erun {

std::optional<TakeoverForm> parse_takeover_form(const std::vector<std::string>& args) {
  TakeoverForm f;
  std::string record_file;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--watch" || args[i] == "--standby") {  // --standby: the older name (--standby N is workers)
      f.standby = true;
    } else if ((args[i] == "--attach" || args[i] == "--job-record") && i + 1 < args.size()) {
      (args[i] == "--attach" ? f.name : record_file) = args[i + 1];
      ++i;
    } else if (args[i] == "--driver-address" && i + 1 < args.size()) {
      f.driver_address = args[++i];
    } else {
      return std::nullopt;
    }
  }
  if (f.name.empty() && record_file.empty()) return std::nullopt;
  if (!record_file.empty()) {
    // FILE is JOBS_DIR/NAME/record.
    std::filesystem::path p = std::filesystem::absolute(record_file).lexically_normal();
    const std::string name = p.parent_path().filename().string();
    if (p.filename() != "record" || name.empty()) {
      f.error = fmt::format("--job-record {}: not a job record (a job's record is JOBS_DIR/NAME/record, where the "
                            "driver said it keeps it)",
                            record_file);
      return f;
    }
    if (!f.name.empty() && f.name != name) {
      f.error = fmt::format("--job-record {} is job {}'s record, not {}'s", record_file, name, f.name);
      return f;
    }
    f.name = name;
    f.jobs_dir = p.parent_path().parent_path().string();
  }
  return f;
}

namespace {

// Lets go of this standby's marker: its file goes while still held, when it
// is still the one named there (the job's directory may have been removed
// and made again), so that one standby per job holds after it too.
void release_marker(const std::string& marker, int& fd) {
  if (fd < 0) return;
  struct stat held {}, named {};
  if (::fstat(fd, &held) == 0 && ::lstat(marker.c_str(), &named) == 0 && held.st_ino == named.st_ino &&
      held.st_dev == named.st_dev) {
    ::unlink(marker.c_str());
  }
  ::close(fd);
  fd = -1;
}

// Takes the job's standby marker (one standby per job): its descriptor,
// held locked, or -1 after saying why not.
int take_marker(const std::string& marker, const std::string& name) {
  const int fd = ::open(marker.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    std::fprintf(stderr, "erun --standby: job %s: cannot create %s: %s (did the job just end?)\n", name.c_str(),
                 marker.c_str(), std::strerror(errno));
    return -1;
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    std::fprintf(stderr, "erun --standby: job %s has a standby driver already (%s): one is enough\n", name.c_str(),
                 marker.c_str());
    ::close(fd);
    return -1;
  }
  return fd;
}

// The job of a driver that went silent, without its lock (that driver
// holds it); 0 when the job ended meanwhile (the driver was slow, not gone,
// and removed its directory, or is removing it): nothing to take over.
std::variant<std::unique_ptr<JobStore>, int> take_from_silent(const std::string& jobs_dir, const std::string& name) {
  auto store = JobStore::open_unlocked(jobs_dir, name);
  if (store && store.value()->read()) return std::move(store).value();
  if (!store && ::access((jobs_dir + "/" + name).c_str(), F_OK) == 0) {
    std::fprintf(stderr, "erun --standby: %s\n", store.message().c_str());
    return 2;
  }
  ERUN_LOG_INFO("job {}: it ended (its record is gone): the standby has nothing to take over", name);
  return 0;
}

// Takes the job's lock into `mine` unless another erun holds it; false
// after saying why when it cannot be taken for another reason.
bool take_job_lock(const std::string& jobs_dir, const std::string& name, std::unique_ptr<JobStore>& mine) {
  bool held = false;
  auto locked = JobStore::lock(jobs_dir, name, &held);
  if (locked) {
    mine = std::move(locked).value();
  } else if (!held) {
    std::fprintf(stderr, "erun --standby: %s\n", locked.message().c_str());
    return false;
  }
  return true;
}

}  // namespace

std::variant<std::unique_ptr<JobStore>, int> stand_by(const std::string& jobs_dir, const std::string& name,
                                                      Duration silence) {
  using Steady = std::chrono::steady_clock;
  // One standby per job.
  const std::string marker = jobs_dir + "/" + name + "/standby";
  static int standby_fd = -1;  // held while it stands by (release_marker())
  standby_fd = take_marker(marker, name);
  if (standby_fd < 0) return 2;
  std::string stamp = record_stamp(jobs_dir, name);
  auto changed_at = Steady::now();
  uint64_t term = 0;
  // The job's lock once this standby has it while a driver that took the job
  // over without it still beats (JobRecord::unlocked): kept for the takeover.
  std::unique_ptr<JobStore> mine;
  while (true) {
    if (!mine) {
      if (!take_job_lock(jobs_dir, name, mine)) return 2;
      if (auto record = mine ? mine->read() : std::nullopt) {
        if (!(record->unlocked && Steady::now() - changed_at <= silence)) {
          ERUN_LOG_WARN("job {}: its driver is gone: the standby takes the job over", name);
          release_marker(marker, standby_fd);  // a driver now: another erun --standby may stand by for it
          return std::move(mine);
        }
        ERUN_LOG_INFO("job {}: its driver (erun pid {} on {}) took it over without the job's lock, which this standby "
                      "holds now: standing by until that one is silent",
                      name, record->driver_pid, record->driver_host);
      }
    }
    const auto now = Steady::now();
    if (std::string s = record_stamp(jobs_dir, name); s != stamp) {
      stamp = s;
      changed_at = now;
    }
    auto record = peek_record(jobs_dir, name);
    if (!record && mine) {
      ERUN_LOG_INFO("job {}: it ended (its record is gone): the standby has nothing to take over", name);
      // Nothing of the job is left: its marker, its lock, its directory.
      release_marker(marker, standby_fd);
      mine->remove();
      return 0;
    }
    if (record && record->term != term) {
      term = record->term;
      ERUN_LOG_INFO("job {}: standing by for its driver (erun pid {} on {}, term {}): taking the job over when it is "
                    "gone or silent for {:.0f} s (--heartbeat-timeout)",
                    name, record->driver_pid, record->driver_host, term, std::chrono::duration<double>(silence).count());
    }
    if (record && now - changed_at > silence) {
      ERUN_LOG_WARN("job {}: its driver (erun pid {} on {}, term {}) has been silent for {:.1f} s: the standby takes "
                    "the job over; should that erun come back, it finds itself replaced and leaves",
                    name, record->driver_pid, record->driver_host, term,
                    std::chrono::duration<double>(now - changed_at).count());
      release_marker(marker, standby_fd);
      if (mine) return std::move(mine);
      return take_from_silent(jobs_dir, name);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

}  // namespace erun
