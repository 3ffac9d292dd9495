#include "state/reshard_plan.h"

#include <algorithm>
#include <limits>

namespace erun::state_internal {

RowRange split_rows(uint64_t rows, SplitRule rule, int rank, int size) {
  const auto r = static_cast<uint64_t>(rank);
  const auto n = static_cast<uint64_t>(size);
  if (size <= 0 || rank < 0 || rank >= size) return {};
  if (rule == SplitRule::kChunk) {
    const uint64_t each = (rows + n - 1) / n;
    const uint64_t begin = std::min(rows, r * each);
    return {begin, std::min(rows, begin + each)};
  }
  const uint64_t base = rows / n;
  const uint64_t extra = rows % n;
  const uint64_t begin = r * base + std::min(r, extra);
  return {begin, begin + base + (r < extra ? 1 : 0)};
}

namespace {

// How dear reading from `s` is for `me` on `host`; -1: `me` cannot read it
// (another rank's memory, which that rank overwrites as it reshards).
int cost(const RowSource& s, int me, int host) {
  if (s.memory) return s.server == me ? 0 : -1;
  return s.host == host ? 1 : 2;
}

bool holds(const RowSource& s, uint64_t row) { return s.rows.begin <= row && row < s.rows.end; }

}  // namespace

RowPlan plan_rows(RowRange need, int me, int host, const std::vector<RowSource>& sources) {
  RowPlan plan;
  uint64_t at = need.begin;
  while (at < need.end) {
    // The cheapest sources holding row `at`; among them the one reaching furthest.
    size_t best = sources.size();
    int best_cost = std::numeric_limits<int>::max();
    for (size_t i = 0; i < sources.size(); ++i) {
      const RowSource& s = sources[i];
      const int c = cost(s, me, host);
      if (c < 0 || !holds(s, at)) continue;
      if (c < best_cost || (c == best_cost && s.rows.end > sources[best].rows.end)) {
        best = i;
        best_cost = c;
      }
    }
    if (best == sources.size()) {
      // A hole: up to the next row some source holds.
      uint64_t next = need.end;
      for (const RowSource& s : sources) {
        if (cost(s, me, host) >= 0 && s.rows.begin > at && s.rows.begin < next && s.rows.size() > 0) {
          next = s.rows.begin;
        }
      }
      if (!plan.missing.empty() && plan.missing.back().end == at) {
        plan.missing.back().end = next;
      } else {
        plan.missing.push_back({at, next});
      }
      at = next;
      continue;
    }
    // Read from it up to its end, or to where a cheaper source begins.
    uint64_t end = std::min(need.end, sources[best].rows.end);
    for (const RowSource& s : sources) {
      const int c = cost(s, me, host);
      if (c >= 0 && c < best_cost && s.rows.begin > at && s.rows.begin < end && s.rows.end > s.rows.begin) {
        end = s.rows.begin;
      }
    }
    if (!plan.transfers.empty() && plan.transfers.back().source == best && plan.transfers.back().rows.end == at) {
      plan.transfers.back().rows.end = end;
    } else {
      plan.transfers.push_back({{at, end}, best});
    }
    at = end;
  }
  return plan;
}

uint64_t remote_rows(const RowPlan& plan, int host, const std::vector<RowSource>& sources) {
  uint64_t n = 0;
  for (const RowTransfer& t : plan.transfers) {
    if (sources[t.source].host != host) n += t.rows.size();
  }
  return n;
}

}  // namespace erun::state_internal
