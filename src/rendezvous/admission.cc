#include "rendezvous/admission.h"

#include <fmt/format.h>

namespace erun {

void Admission::accepted(uint64_t id, TimePoint now) {
  order_.emplace_back(id, now);
  where_[id] = std::prev(order_.end());
}

void Admission::done(uint64_t id) {
  auto it = where_.find(id);
  if (it == where_.end()) return;
  order_.erase(it->second);
  where_.erase(it);
}

std::optional<uint64_t> Admission::evictable(TimePoint now) const {
  if (order_.empty() || now - order_.front().second < min_age_) return std::nullopt;
  return order_.front().first;
}

bool Admission::refused(TimePoint now, std::string summary) {
  latest_ = std::move(summary);
  last_refusal_ = now;
  if (!in_burst_) {
    in_burst_ = true;
    suppressed_ = 0;
    burst_start_ = last_line_ = now;
    return true;
  }
  ++suppressed_;
  return false;
}

std::optional<std::string> Admission::burst_line(TimePoint now) {
  if (!in_burst_) return std::nullopt;
  bool over = now - last_refusal_ >= quiet_;
  bool long_running = now - last_line_ >= 15 * quiet_;
  if (!over && !long_running) return std::nullopt;
  std::optional<std::string> line;
  if (suppressed_ > 0) {
    line = fmt::format("{} more connection{} dropped in {:.1f} s (the latest: {})", suppressed_,
                       suppressed_ == 1 ? "" : "s", seconds(last_refusal_ - burst_start_), latest_);
  }
  suppressed_ = 0;
  last_line_ = now;
  if (over) in_burst_ = false;
  return line;
}

TimePoint Admission::next_burst_check() const {
  if (!in_burst_) return TimePoint::max();
  return std::min(last_refusal_ + quiet_, last_line_ + 15 * quiet_);
}

}  // namespace erun
