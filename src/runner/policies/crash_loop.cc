#include "runner/policies/crash_loop.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/strings.h"

namespace erun {
namespace {

bool same(const ExitStatus& a, const ExitStatus& b) { return a.code == b.code && a.signal == b.signal; }

std::string hint_for(const ExitStatus& s) {
  if (s.oom_killed) return " (out of memory: lower the program's memory use, e.g. its batch size, or raise the limit)";
  if (s.signal) return "";
  if (s.code == 127) return " (127: command not found: check the program's path and PATH on the hosts)";
  if (s.code == 126) return " (126: not executable: check chmod +x and its #! line)";
  return "";
}

std::string host_list(const std::set<std::string>& hosts) {
  std::vector<std::string> v(hosts.begin(), hosts.end());
  if (v.size() > 8) {
    size_t n = v.size();
    v.resize(8);
    return join(v, ",") + fmt::format(",... ({} hosts)", n);
  }
  return join(v, ",");
}

}  // namespace

void CrashLoopDetector::reset() {
  streak_ = 0;
  status_.reset();
  hosts_.clear();
  failed_hosts_.clear();
}

void CrashLoopDetector::generation_started(long generation, const std::vector<std::string>& hosts) {
  generation_ = generation;
  gen_hosts_ = std::set<std::string>(hosts.begin(), hosts.end());
  gen_failed_hosts_.clear();
  gen_status_.reset();
  gen_mixed_ = false;
}

void CrashLoopDetector::worker_failed(const std::string& host, const ExitStatus& status) {
  gen_failed_hosts_.insert(host);
  if (!gen_status_) gen_status_ = status;
  else if (!same(*gen_status_, status)) gen_mixed_ = true;
}

void CrashLoopDetector::progress() { reset(); }

void CrashLoopDetector::commit_seen(unsigned long long commit_id) {
  if (commit_id > max_commit_) {
    max_commit_ = commit_id;
    reset();
  }
}

std::optional<std::string> CrashLoopDetector::generation_failed(Duration ran) {
  if (limit_ <= 0) return std::nullopt;
  if (!gen_status_ || gen_mixed_ || ran >= progress_after_) {
    // Different failures, or one after real work: not a loop; start over.
    reset();
    return std::nullopt;
  }
  if (!status_ || !same(*status_, *gen_status_)) {
    reset();
    status_ = gen_status_;
    first_generation_ = generation_;
  }
  ++streak_;
  hosts_.insert(gen_hosts_.begin(), gen_hosts_.end());
  failed_hosts_.insert(gen_failed_hosts_.begin(), gen_failed_hosts_.end());
  bool everywhere = std::includes(failed_hosts_.begin(), failed_hosts_.end(), hosts_.begin(), hosts_.end());
  if (streak_ < limit_ || !everywhere) return std::nullopt;
  return fmt::format(
      "crash loop: generations {}-{} ({} in a row) all failed with {}{} on every host that ran them ({}), "
      "each within {:.0f} s and with no commit or finished worker in between; ending the job instead of "
      "restarting it again. Fix the program (see the root cause below), or raise --crash-loop-limit "
      "(0 turns this check off)",
      first_generation_, generation_, streak_, status_->describe(), hint_for(*status_), host_list(hosts_),
      seconds(progress_after_));
}

}  // namespace erun
