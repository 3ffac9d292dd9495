// StragglerDetector: finds a rank that holds the job back (docs/design.md,
// "Stragglers"). Pure logic over the ranks' commit-interval reports
// (RankTiming: interval length, time inside collectives, per commit
// interval): a rank's compute time is its interval less its waiting. In
// synchronous training every rank waits for the slowest, so a straggler
// computes longest and waits least. Ranks report at most every 100 ms, each
// covering as many commits as passed, so the detector compares times per
// commit: a round is judged once every member of the generation reported
// since the last one, with each member's latest report, and a rank whose
// compute time is above `factor` times the median of the others' in
// `window` rounds in a row is a straggler. A job that is slow everywhere
// alike has none.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "rendezvous/membership.h"

namespace erun {

struct StragglerOptions {
  double factor = 1.5;  // --straggler-factor
  int window = 3;       // --straggler-window: intervals in a row
};

struct Straggler {
  SlotKey slot;
  long generation = 0;
  double factor = 0;       // its compute time over the others' median, in the last interval
  double interval_s = 0;   // the job's interval (median over the ranks)
  double without_s = 0;    // the estimated interval without it
  // The share of the interval the job would save without it (0..1): the
  // eviction rule needs at least 0.2.
  double gain() const { return interval_s > 0 ? 1.0 - without_s / interval_s : 0; }
};

class StragglerDetector {
 public:
  explicit StragglerDetector(StragglerOptions o) : o_(o) {}

  // A new generation with these members: reports of older ones are dropped,
  // and every rank's streak starts again.
  void start_generation(long generation, const std::vector<SlotKey>& members);
  // One report; judges a round once every member reported since the last.
  void add(const RankTiming& t);
  // Stragglers found since the last call, each once until its streak ends.
  std::vector<Straggler> take_found() { return std::exchange(found_, {}); }
  // Judged rounds of the current generation (for tests and logs).
  int judged() const { return judged_; }

 private:
  struct Sample {
    double interval_s = 0, wait_s = 0;  // per commit interval
    bool fresh = false;                 // reported since the last round
  };
  void judge(const std::map<SlotKey, Sample>& by_slot);

  StragglerOptions o_;
  long generation_ = -1;
  std::set<SlotKey> members_;
  std::map<SlotKey, Sample> latest_;
  std::map<SlotKey, int> streak_;
  std::set<SlotKey> reported_;  // found in the current streak
  std::vector<Straggler> found_;
  int judged_ = 0;
};

}  // namespace erun
