#include "runner/takeover/job_claim.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <thread>

#include "common/log.h"
#include "runner/cli.h"
#include "runner/takeover/record_keeper.h"
#include "runner/takeover/standby_driver.h"

namespace erun {

namespace {

// A job whose driver is gone: attaches to every agent its record names
// (term one above the record's) and collects their workers. Agents that are
// gone are logged and left out.
void take_over(const DriverOptions& o, Launchers& l, const JobRecord& record, int rdzv_port,
               DriverDeps::Takeover& t) {
  t.term = record.term + 1;
  t.record = static_cast<const DriverRecord&>(record);
  AttachRequest req;
  req.secret = record.secret;
  req.term = t.term;
  // The agents' relays reconnect to the address their workers were given
  // (port 0: the same port too), unless this driver runs elsewhere than the
  // record's: a standby on another machine (another host name, or an
  // address of its own given) is reached by remote hosts at its own
  // address. Local agents (this machine's) are sent 127.0.0.1 then: they
  // may have followed a driver elsewhere before this one (X, then Y, then
  // X again).
  const bool moved = record.driver_host != this_host_name() || !o.driver_address.empty();
  req.rdzv_port = rdzv_port == record.rendezvous_port ? 0 : rdzv_port;
  AttachRequest remote_req = req;
  if (moved) {
    req.rdzv_host = "127.0.0.1";
    req.rdzv_port = rdzv_port;
    remote_req.rdzv_host = o.driver_address.empty() ? this_host_name() : o.driver_address;
    remote_req.rdzv_port = rdzv_port;
    if (record.driver_host != this_host_name()) {
      ERUN_LOG_INFO("job {}: its last driver ran on {}: remote agents' relays reconnect to {}:{}", record.name,
                    record.driver_host, remote_req.rdzv_host, rdzv_port);
    }
  }
  req.timeout = remote_req.timeout = std::max<Duration>(o.heartbeat_timeout, std::chrono::seconds(10));
  // Each launcher attaches to its agents all at once.
  std::map<Launcher*, std::vector<std::pair<std::string, std::string>>> by_launcher;
  for (auto& a : record.agents) by_launcher[&launcher_of(o, l, a.host)].emplace_back(a.host, a.attach_path);
  for (auto& [launcher, agents] : by_launcher) {
    for (auto& got : launcher->attach(agents, launcher == l.local.get() ? req : remote_req)) {
      if (!got.status) {
        ERUN_LOG_WARN("job {}: cannot take over the agent on {}: {}", record.name, got.host, got.status.message());
        continue;
      }
      for (auto& w : got.workers) t.workers.push_back(std::move(w));
    }
  }
}

}  // namespace

std::variant<JobClaim, int> claim_job(const DriverOptions& options, const std::string& name,
                                      std::unique_ptr<JobStore> standby_store) {
  JobClaim c;
  c.store = std::move(standby_store);
  if (c.store) {
    c.previous = c.store->read();
    if (!c.previous) {  // it ended after the standby chose to take it over: never run it again
      ERUN_LOG_INFO("job {}: it ended (its record is gone): the standby has nothing to take over", name);
      return 0;
    }
  } else if (!options.dry_run && options.driver_grace > Duration::zero()) {
    bool held = false;
    auto locked = JobStore::lock(jobs_directory(), name, &held);
    if (!locked && held) {
      std::fprintf(stderr, "erun: %s\n", locked.message().c_str());
      return 2;
    }
    if (locked) {
      c.store = std::move(locked).value();
      c.previous = c.store->read();
      if (c.previous && c.previous->unlocked && c.store->record_age() &&
          *c.store->record_age() < options.heartbeat_timeout) {
        // The lock was the silent driver's; the job's driver now beats
        // without it (it took the job over from that one).
        std::fprintf(stderr,
                     "erun: job %s is driven by erun pid %ld on %s, which took it over from a silent driver and "
                     "does not hold the job's lock yet: to run a separate job beside it, give this one --job-name "
                     "OTHER; to take this one over, end that erun first and run the same command again\n",
                     name.c_str(), c.previous->driver_pid, c.previous->driver_host.c_str());
        return 2;
      }
    } else {
      ERUN_LOG_WARN("{}: this job runs without a record, so no new erun can take it over should this one die",
                    locked.message());
    }
  }
  return c;
}

bool claim_takeover(const DriverOptions& options, Launchers& launchers, JobStore& store,
                    const JobRecord& previous, const std::string& name, int rdzv_port,
                    DriverDeps::Takeover& takeover) {
  ERUN_LOG_WARN("job {}: its driver (erun pid {} on {}) is gone: taking the job over", name, previous.driver_pid,
                previous.driver_host);
  JobRecord claimed = previous;
  claimed.term = previous.term + 1;
  claimed.driver_pid = ::getpid();
  claimed.driver_host = this_host_name();
  claimed.unlocked = !store.holds_lock();
  if (auto s = store.write(claimed); !s) {
    auto there = store.read();
    if (!there || there->job_id != claimed.job_id || there->term < claimed.term) {
      ERUN_LOG_WARN("job {}: {}: a new erun could not take this job over", name, s.message());
      return true;  // no other claim there: go on without a record
    }
    ERUN_LOG_ERROR("job {}: another erun took it over first ({}): this one leaves it to that one", name, s.message());
    return false;
  }
  {
    // Attaching waits up to its timeout for agents that do not answer: the
    // record beats meanwhile, so that a standby does not take this driver
    // for a silent one.
    RecordHeartbeat beat(store, std::chrono::seconds(1));
    take_over(options, launchers, previous, rdzv_port, takeover);
  }
  if (takeover.workers.empty()) {
    ERUN_LOG_WARN("job {}: no worker of it is left (its agents ended, or their --driver-grace ran out): starting it "
                  "anew; it resumes from what host memory or --checkpoint-dir still hold",
                  name);
  }
  return true;
}

std::optional<int> resolve_takeover(std::vector<std::string>& args, Attach& attach) {
  auto takeover = parse_takeover_form(args);
  if (!takeover) return std::nullopt;
  if (!takeover->error.empty()) {
    std::fprintf(stderr, "erun: %s\n", takeover->error.c_str());
    return 2;
  }
  attach = Attach{takeover->name, takeover->driver_address, takeover->standby};
  if (!takeover->jobs_dir.empty()) ::setenv("ERUN_JOB_DIR", takeover->jobs_dir.c_str(), 1);
  const bool valid = valid_job_name(attach.name);
  auto record = valid ? peek_record(jobs_directory(), attach.name) : std::nullopt;
  // A standby started with the job may come before its first record.
  for (int i = 0; attach.standby && !record && i < 150 && valid; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    record = peek_record(jobs_directory(), attach.name);
  }
  if (!record) {
    std::fprintf(stderr, "erun --attach %s: no such job in %s (a job has a record only while it runs with "
                         "--driver-grace; its name is in erun's log)\n",
                 attach.name.c_str(), jobs_directory().c_str());
    return 2;
  }
  if (!record->cwd.empty() && ::chdir(record->cwd.c_str()) != 0) {
    std::fprintf(stderr, "erun --attach %s: cannot enter the job's directory %s: %s\n", attach.name.c_str(),
                 record->cwd.c_str(), std::strerror(errno));
    return 2;
  }
  args = record->args;
  return std::nullopt;
}

}  // namespace erun
