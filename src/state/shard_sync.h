// A sharded State's sync() among the ranks (state_shards.cc): what each
// rank offers (its commits, the pieces its host's files hold), where each
// row of each commit can be read, the buddy each rank pushes to, and the
// commit the ranks go on from. Pure functions of the offers, so every rank
// decides the same.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "state/reshard_plan.h"
#include "state/shard_exchange.h"

namespace erun::state_internal {

// What one rank tells the others at a sharded State's sync().
struct Offer {
  std::string host;
  std::string address;
  int port = 0;                     // its shard server (0: none)
  int buddy_port = 0;               // its BuddyKeeper (0: none)
  uint64_t memory_id = 0;           // the commit in its memory (0: none)
  uint64_t snapshot_size = 0;       // the world size that commit was made at (0: unknown)
  uint64_t rejoined_from = 0;       // the world size it re-joined from since the last sync (0: none)
  std::vector<uint64_t> whole;      // commits whose whole entries it can give (its memory, its files)
  std::vector<ShardPiece> memory;   // the pieces of its memory commit
  std::vector<FilePiece> files;     // the pieces its host's files hold
  std::string stem;                 // its own file pair's name in its host's directory (empty: none)
};
std::string encode_offer(const Offer& o);
// Throws erun::Error naming rank `rank` when the bytes are not an offer.
Offer decode_offer(const std::vector<char>& bytes, int rank);

// Every rank's offer, and where each row of each commit can be read.
struct Holdings {
  std::vector<Offer> offers;
  std::vector<int> host_of;     // per rank, its host's number (hosts numbered in rank order)
  std::vector<bool> publishes;  // per rank: it serves its host's files (the host's lowest rank that found some and
                                // serves them, else the lowest that found some)

  explicit Holdings(std::vector<Offer> all);
  // The copies of entry `e`'s rows at commit `id`, and per copy its file
  // (empty: a rank's memory). Throws erun::Error when a copy has another
  // shape than `e`.
  void sources(const ShardPiece& e, uint64_t id, std::vector<RowSource>* out, std::vector<std::string>* files) const;
  // The rows of entry `e` that no copy of commit `id` holds. With `rule`,
  // for the new world (a rank per offer) as it splits them: a row found only
  // in a rank's memory counts only where that rank keeps it, since memory
  // is read by its own rank alone (other ranks read files).
  std::vector<RowRange> holes(const ShardPiece& e, uint64_t id, std::optional<SplitRule> rule = std::nullopt) const;
};

// This rank's buddy for the generation: a worker of the next host (in rank
// order, around) that keeps copies, the one at this rank's place among its
// host's ranks (modulo their number). -1: none (one host).
int choose_buddy(const Holdings& held, int rank);

// The file pairs (names without .a/.b) that host `host`'s commit directory
// keeps for this generation: its ranks' own pairs, and the buddy pairs of
// the ranks that push to a rank of it. Once the generation's first commit
// shows every rank's rows in these, the others are stale (pairs of slots no
// worker uses now, copies for pushers that now push elsewhere).
std::set<std::string> pairs_to_keep(const Holdings& held, int host);

// The commit a sharded State goes on from: the newest that some rank can
// give whole and whose sharded rows (of `entries`, shapes only) the job
// holds in full.
struct CommitChoice {
  uint64_t target = 0;   // 0: none (nobody committed, or nothing is whole: see lost)
  uint64_t newest = 0;   // the newest commit some rank can give whole
  uint64_t seen = 0;     // the highest id anyone wrote: the next commit's id is above it
  uint64_t any_rejoin = 0;  // the largest world size a rank re-joined from
  std::string lost;      // what the newest commit lacks ("'w' rows 3..9 of 12; ..."), empty when whole
};
// `rules`: each entry's split, for the new world (empty: rows in any
// rank's memory count as held).
CommitChoice choose_commit(const Holdings& held, const std::vector<ShardPiece>& entries,
                           const std::vector<SplitRule>& rules = {});

// "row 3", "rows 4..9, row 12".
std::string rows_text(const std::vector<RowRange>& ranges);

}  // namespace erun::state_internal
