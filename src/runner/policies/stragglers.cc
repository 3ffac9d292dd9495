#include "runner/policies/stragglers.h"

#include <algorithm>
#include <utility>

namespace erun {

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

void StragglerDetector::start_generation(long generation, const std::vector<SlotKey>& members) {
  generation_ = generation;
  members_ = std::set<SlotKey>(members.begin(), members.end());
  latest_.clear();
  streak_.clear();
  reported_.clear();
  judged_ = 0;
}

void StragglerDetector::add(const RankTiming& t) {
  if (t.generation != generation_ || !members_.count(t.slot) || members_.size() < 2) return;
  const double n = static_cast<double>(std::max<uint64_t>(t.commits, 1));
  latest_[t.slot] = Sample{t.interval_s / n, std::min(t.wait_s, t.interval_s) / n, true};
  if (latest_.size() < members_.size()) return;
  for (auto& [slot, s] : latest_) {
    if (!s.fresh) return;
  }
  judge(latest_);
  for (auto& [slot, s] : latest_) s.fresh = false;
}

void StragglerDetector::judge(const std::map<SlotKey, Sample>& by_slot) {
  ++judged_;
  std::vector<double> intervals;
  for (auto& [slot, s] : by_slot) intervals.push_back(s.interval_s);
  const double interval = median(intervals);
  for (auto& [slot, s] : by_slot) {
    const double compute = s.interval_s - s.wait_s;
    std::vector<double> others;
    double slowest_other = 0, least_wait = s.wait_s;
    for (auto& [other, o] : by_slot) {
      if (other == slot) continue;
      others.push_back(o.interval_s - o.wait_s);
      slowest_other = std::max(slowest_other, o.interval_s - o.wait_s);
      least_wait = std::min(least_wait, o.wait_s);
    }
    const double typical = median(others);
    const double ratio = typical > 0 ? compute / typical : 0;
    if (typical <= 0 || ratio <= o_.factor) {
      streak_.erase(slot);
      reported_.erase(slot);
      continue;
    }
    if (++streak_[slot] < o_.window || reported_.count(slot)) continue;
    reported_.insert(slot);
    // Without it the interval is the slowest other rank's compute plus the
    // collectives' own time (the least any rank waited).
    found_.push_back(Straggler{slot, generation_, ratio, interval, std::min(interval, slowest_other + least_wait)});
  }
}

}  // namespace erun
