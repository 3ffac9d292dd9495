// Keeps a job's record (job_record.h) up to date from its driver, after
// every step: what a new erun takes the job over from, and the heartbeat a
// standby driver watches (standby_driver.h).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "common/log.h"
#include "runner/driver.h"
#include "runner/takeover/job_record.h"
#include "runner/launch/launcher.h"

namespace erun {

// The driver's heartbeat while it cannot step: the record touched every
// `every` on a thread of its own until this goes (a takeover attaching to
// agents that do not answer waits up to the attach timeout, longer than a
// standby's silence).
class RecordHeartbeat {
 public:
  RecordHeartbeat(JobStore& store, Duration every) : thread_([this, &store, every] {
    std::unique_lock<std::mutex> lock(mu_);
    do {
      store.touch();
    } while (!done_cv_.wait_for(lock, every, [this] { return done_; }));
  }) {}
  ~RecordHeartbeat() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    done_cv_.notify_all();
    thread_.join();
  }
  RecordHeartbeat(const RecordHeartbeat&) = delete;
  RecordHeartbeat& operator=(const RecordHeartbeat&) = delete;

 private:
  std::mutex mu_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::thread thread_;  // last: it starts once the rest is made
};

// Keeps the job record up to date from the driver: written whenever the
// driver's record or the agents changed, and touched once a second.
class RecordKeeper {
 public:
  RecordKeeper(JobStore& store, JobRecord base, std::vector<Launcher*> launchers)
      : store_(store), base_(std::move(base)), launchers_(std::move(launchers)) {}
  // Any change is written at once (a new erun must resume after the last
  // generation, and find every agent that runs workers); then each agent
  // the record names is told RECORDED, and only then keeps its workers
  // through the grace. Unchanged, the record is touched once a second (the
  // heartbeat).
  void operator()(const Driver& d) {
    auto now = std::chrono::steady_clock::now();
    uint64_t version = 0;
    for (Launcher* launcher : launchers_) version += launcher->attach_paths_version();
    const DriverRecord& now_kept = d.record();
    // A change of the record (a generation, a plan, a count, a host's
    // history, a keeper) or of the agents is written at once; the rest is the
    // heartbeat, once a second. The record holds no time left to change by
    // itself: a blacklisting's end is a time point (the text holds it as a
    // wall-clock time).
    const bool changed = version != version_ || now_kept != static_cast<const DriverRecord&>(last_);
    if (superseded_ != 0 || (!changed && now < next_)) return;
    next_ = now + std::chrono::seconds(1);
    // A newer driver holds the job (it took it over while this one was
    // frozen or cut off): its heartbeat is not this one's to keep, nor its
    // record to write; the driver reads superseded() and leaves.
    // (Read again only when another file was put there: a write renames one
    // over it; this driver's heartbeat changes only its time.)
    if (const uint64_t inode = store_.record_inode(); inode != seen_inode_) {
      seen_inode_ = inode;
      if (auto there = store_.read(); there && there->job_id == base_.job_id && there->term > base_.term) {
        superseded_ = there->term;
        return;
      }
    }
    // The heartbeat a standby driver watches (erun --watch --attach), and
    // the lock once a replaced driver let it go (a standby that took the job
    // from a silent one holds none at first).
    store_.touch();
    if (!store_.holds_lock()) (void)store_.try_lock();
    version_ = version;
    JobRecord r = base_;
    static_cast<DriverRecord&>(r) = now_kept;
    r.unlocked = !store_.holds_lock();
    for (Launcher* launcher : launchers_) {
      for (auto& [host, path] : launcher->attach_paths()) r.agents.push_back({host, path});
    }
    if (r == last_) return;
    if (auto s = store_.write(r); !s) {
      if (auto now_there = store_.read(); now_there && now_there->term > base_.term) {
        superseded_ = now_there->term;
        return;
      }
      if (!warned_) ERUN_LOG_WARN("{}: a new erun could not take this job over", s.message());
      warned_ = true;
      return;
    }
    seen_inode_ = store_.record_inode();
    std::vector<std::pair<std::string, std::string>> named;
    for (auto& a : r.agents) named.emplace_back(a.host, a.attach_path);
    for (Launcher* launcher : launchers_) launcher->recorded(named);
    last_ = std::move(r);
  }
  // The newer driver term found in the record (0: none): this driver was replaced.
  uint64_t superseded() const { return superseded_; }

 private:
  JobStore& store_;
  JobRecord base_;
  std::vector<Launcher*> launchers_;  // those that exist
  JobRecord last_;
  uint64_t version_ = 0;
  std::chrono::steady_clock::time_point next_{};
  bool warned_ = false;
  uint64_t superseded_ = 0;
  uint64_t seen_inode_ = 0;  // the record file last read or written
};

}  // namespace erun
