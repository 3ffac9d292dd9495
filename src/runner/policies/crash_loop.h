// CrashLoopDetector: ends a job whose generations keep failing the same way on
// every host without progress (docs/design.md, "Recovery policy"). Driver
// thread only; pure logic, no clock and no I/O.
#pragma once

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/subprocess.h"

namespace erun {

class CrashLoopDetector {
 public:
  // limit 0 disables the detector.
  CrashLoopDetector(int limit, Duration progress_after) : limit_(limit), progress_after_(progress_after) {}

  // A generation started (or was re-formed in place) with workers on `hosts`.
  void generation_started(long generation, const std::vector<std::string>& hosts);
  // A worker of the current generation failed on its own (not stopped by erun).
  void worker_failed(const std::string& host, const ExitStatus& status);
  // Something made progress: a worker finished, or a commit newer than any before.
  void progress();
  // Commit ids reported by workers: a higher one than seen before is progress.
  void commit_seen(unsigned long long commit_id);
  // The current generation failed after running `ran` (publish to failure).
  // Returns the explanation when this completes a crash loop: the job ends.
  std::optional<std::string> generation_failed(Duration ran);

  int streak() const { return streak_; }
  // The current generation had a failure counted by worker_failed().
  bool failures_seen() const { return gen_status_.has_value(); }

 private:
  void reset();
  int limit_;
  Duration progress_after_;
  // The current generation.
  long generation_ = 0;
  std::set<std::string> gen_hosts_;
  std::set<std::string> gen_failed_hosts_;
  std::optional<ExitStatus> gen_status_;
  bool gen_mixed_ = false;
  // The streak of same-status generations.
  int streak_ = 0;
  long first_generation_ = 0;
  std::optional<ExitStatus> status_;
  std::set<std::string> hosts_;
  std::set<std::string> failed_hosts_;
  unsigned long long max_commit_ = 0;
};

}  // namespace erun
