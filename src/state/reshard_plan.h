// The reshard plan (docs/state.md, "Sharded entries"): which committed rows
// of a sharded entry a rank of the new generation reads from where. A pure
// function of the rows the rank needs and the copies the job holds, so every
// rank can plan for every other and tests need no world.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace erun::state_internal {

// Rows [begin, end) of dimension 0.
struct RowRange {
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t size() const { return end > begin ? end - begin : 0; }
  bool operator==(const RowRange& o) const { return begin == o.begin && end == o.end; }
};

// Where the layout rule puts rank `rank` of `size` over `rows` rows.
// kChunk (torch.chunk, FSDP2's Shard(0)): ceil(rows / size) rows each, in
// order, so the last ranks' pieces may be short or empty. kEven: rows / size
// each, the first rows % size ranks one more.
enum class SplitRule { kChunk, kEven };
RowRange split_rows(uint64_t rows, SplitRule rule, int rank, int size);

// A copy of committed rows that the new generation can read.
struct RowSource {
  RowRange rows;
  int host = 0;        // the host it lies on (an index the caller chose)
  int server = 0;      // the rank that reads it for others (on `host`)
  bool memory = false; // in `server`'s own memory (its last commit), not a file: only `server` reads it
  uint64_t offset = 0; // in its file: where row `rows.begin` starts
  int file = 0;        // which file (an index the caller chose)
};

// One piece of the plan: rows of the needed range and the source they come from.
struct RowTransfer {
  RowRange rows;
  size_t source = 0;  // index into the sources
};

struct RowPlan {
  std::vector<RowTransfer> transfers;  // in row order, covering the need but for `missing`
  std::vector<RowRange> missing;       // rows no source holds
};

// The rows `need` of rank `me`, on host `host`, from `sources`. Each row is
// read from the cheapest source that holds it: `me`'s own memory, then a
// file on its host (shared memory), then another host (over the network),
// the one of these that covers the longest run, then the lowest index.
// Consecutive rows from one source are one transfer.
RowPlan plan_rows(RowRange need, int me, int host, const std::vector<RowSource>& sources);

// Rows of a plan that cross hosts (bytes over the network = rows x row bytes).
uint64_t remote_rows(const RowPlan& plan, int host, const std::vector<RowSource>& sources);

}  // namespace erun::state_internal
