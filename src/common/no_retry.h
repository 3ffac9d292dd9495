// The mark of an error that a restart would only repeat (a bug in the
// program, e.g. a collective mismatch). erun::run() logs the error with this
// mark on the worker's stderr before letting it through; the driver looks
// for it in a failed worker's last stderr lines and ends the job instead of
// resetting it (which would fail the same way, forever when elastic).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace erun {

inline constexpr std::string_view kNoRetryMark = "erun: not retried: ";

inline bool has_no_retry_mark(const std::vector<std::string>& lines) {
  for (const std::string& l : lines) {
    if (l.find(kNoRetryMark) != std::string::npos) return true;
  }
  return false;
}

}  // namespace erun
