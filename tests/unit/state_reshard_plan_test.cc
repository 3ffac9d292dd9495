// The reshard plan (state/reshard_plan.h): layout rules, and which rows a
// rank of the new generation reads from where; and the commit a sharded
// sync goes on from (state/shard_sync.h). With no world.
#include <gtest/gtest.h>

#include "erun/errors.hpp"
#include "state/reshard_plan.h"
#include "state/shard_sync.h"

namespace erun::state_internal {
namespace {

std::vector<RowRange> layout(uint64_t rows, SplitRule rule, int size) {
  std::vector<RowRange> out;
  for (int r = 0; r < size; ++r) out.push_back(split_rows(rows, rule, r, size));
  return out;
}

// Every rank's rows, from files of the old layout: rank r's piece on host
// hosts[r], served by rank r of the new generation when it is on that host.
std::vector<RowSource> files_of(const std::vector<RowRange>& old, const std::vector<int>& hosts) {
  std::vector<RowSource> s;
  for (size_t r = 0; r < old.size(); ++r) {
    RowSource src;
    src.rows = old[r];
    src.host = hosts[r];
    src.server = static_cast<int>(r);
    src.file = static_cast<int>(r);
    s.push_back(src);
  }
  return s;
}

// The plan covers exactly `need`, in order, from sources that hold each row.
void expect_covers(const RowPlan& p, RowRange need, const std::vector<RowSource>& sources) {
  uint64_t at = need.begin;
  for (const RowTransfer& t : p.transfers) {
    EXPECT_EQ(t.rows.begin, at);
    EXPECT_LT(t.rows.begin, t.rows.end);
    EXPECT_LE(sources[t.source].rows.begin, t.rows.begin);
    EXPECT_GE(sources[t.source].rows.end, t.rows.end);
    at = t.rows.end;
  }
  EXPECT_EQ(at, need.end);
  EXPECT_TRUE(p.missing.empty());
}

TEST(ReshardPlan, ChunkRuleIsTorchChunkWithShortAndEmptyTails) {
  // torch.chunk(10 rows, 4) -> 3, 3, 3, 1; (5 rows, 4) -> 2, 2, 1, 0.
  EXPECT_EQ(layout(10, SplitRule::kChunk, 4),
            (std::vector<RowRange>{{0, 3}, {3, 6}, {6, 9}, {9, 10}}));
  EXPECT_EQ(layout(5, SplitRule::kChunk, 4), (std::vector<RowRange>{{0, 2}, {2, 4}, {4, 5}, {5, 5}}));
  // 2 rows over 4 ranks: the last two hold nothing.
  EXPECT_EQ(layout(2, SplitRule::kChunk, 4), (std::vector<RowRange>{{0, 1}, {1, 2}, {2, 2}, {2, 2}}));
  EXPECT_EQ(layout(0, SplitRule::kChunk, 3), (std::vector<RowRange>{{0, 0}, {0, 0}, {0, 0}}));
}

TEST(ReshardPlan, EvenRuleGivesTheFirstRanksOneMore) {
  EXPECT_EQ(layout(10, SplitRule::kEven, 4), (std::vector<RowRange>{{0, 3}, {3, 6}, {6, 8}, {8, 10}}));
  EXPECT_EQ(layout(3, SplitRule::kEven, 5), (std::vector<RowRange>{{0, 1}, {1, 2}, {2, 3}, {3, 3}, {3, 3}}));
  EXPECT_EQ(split_rows(10, SplitRule::kEven, 4, 4), RowRange{});  // no such rank
}

TEST(ReshardPlan, UnchangedLayoutReadsOnlyItsOwnMemory) {
  const auto old = layout(1000, SplitRule::kChunk, 4);
  auto sources = files_of(old, {0, 0, 1, 1});
  for (int r = 0; r < 4; ++r) {
    RowSource mem;
    mem.rows = old[static_cast<size_t>(r)];
    mem.host = r / 2;
    mem.server = r;
    mem.memory = true;
    sources.push_back(mem);
  }
  for (int r = 0; r < 4; ++r) {
    const RowPlan p = plan_rows(old[static_cast<size_t>(r)], r, r / 2, sources);
    expect_covers(p, old[static_cast<size_t>(r)], sources);
    ASSERT_EQ(p.transfers.size(), 1u);
    EXPECT_TRUE(sources[p.transfers[0].source].memory);
    EXPECT_EQ(sources[p.transfers[0].source].server, r);
  }
}

TEST(ReshardPlan, FourToThreeUnevenReadsOwnHostFirstAndMovesOnlyWhatChangesHost) {
  // 10 rows: 3,3,3,1 on hosts 0,0,1,1 -> 4,4,2 over ranks on hosts 0,0,1.
  const auto old = layout(10, SplitRule::kChunk, 4);
  const auto sources = files_of(old, {0, 0, 1, 1});
  const auto now = layout(10, SplitRule::kChunk, 3);
  const int hosts[3] = {0, 0, 1};
  uint64_t over_network = 0;
  for (int r = 0; r < 3; ++r) {
    const RowPlan p = plan_rows(now[static_cast<size_t>(r)], r, hosts[r], sources);
    expect_covers(p, now[static_cast<size_t>(r)], sources);
    over_network += remote_rows(p, hosts[r], sources);
  }
  // Rank 1 (host 0) needs rows 4..8: 4,5 from host 0, 6,7 from host 1.
  // Rank 2 (host 1) needs rows 8..10, all on host 1. Rank 0 needs 0..4: row 3 on host 0.
  EXPECT_EQ(over_network, 2u);
}

TEST(ReshardPlan, OneToManyAndManyToOne) {
  const auto one = layout(7, SplitRule::kChunk, 1);
  const auto from_one = files_of(one, {0});
  for (int r = 0; r < 5; ++r) {
    RowRange need = split_rows(7, SplitRule::kChunk, r, 5);
    const RowPlan p = plan_rows(need, r, r, from_one);
    expect_covers(p, need, from_one);
    EXPECT_EQ(remote_rows(p, r, from_one), r == 0 ? 0u : need.size());
  }
  const auto five = layout(7, SplitRule::kChunk, 5);  // 2,2,2,1,0
  const auto from_five = files_of(five, {0, 1, 2, 3, 4});
  const RowPlan p = plan_rows({0, 7}, 0, 0, from_five);
  expect_covers(p, {0, 7}, from_five);
  EXPECT_EQ(p.transfers.size(), 4u);  // rank 4 holds nothing: no transfer from it
  EXPECT_EQ(remote_rows(p, 0, from_five), 5u);
}

TEST(ReshardPlan, ARankThatHoldsNothingNeedsNoTransfer) {
  const auto sources = files_of(layout(2, SplitRule::kChunk, 2), {0, 1});
  const RowPlan p = plan_rows(split_rows(2, SplitRule::kChunk, 3, 4), 3, 1, sources);
  EXPECT_TRUE(p.transfers.empty());
  EXPECT_TRUE(p.missing.empty());
}

TEST(ReshardPlan, ABuddyCopyOnAnotherHostFillsALostHostsRows) {
  // Host 1 (ranks 2, 3) is gone; its rows are on host 0 as a buddy copy.
  const auto old = layout(12, SplitRule::kEven, 4);
  auto sources = files_of({old[0], old[1]}, {0, 0});
  RowSource buddy;
  buddy.rows = {old[2].begin, old[3].end};
  buddy.host = 0;
  buddy.server = 0;
  buddy.file = 7;
  sources.push_back(buddy);
  const auto now = layout(12, SplitRule::kEven, 2);
  for (int r = 0; r < 2; ++r) {
    const RowPlan p = plan_rows(now[static_cast<size_t>(r)], r, 0, sources);
    expect_covers(p, now[static_cast<size_t>(r)], sources);
    EXPECT_EQ(remote_rows(p, 0, sources), 0u);
  }
}

TEST(ReshardPlan, RowsNoSourceHoldsAreNamedAsMissing) {
  const auto old = layout(12, SplitRule::kEven, 4);  // 3 each
  const auto sources = files_of({old[0], old[3]}, {0, 1});  // ranks 1 and 2 lost with no copy
  const RowPlan p = plan_rows({0, 12}, 0, 0, sources);
  ASSERT_EQ(p.missing.size(), 1u);
  EXPECT_EQ(p.missing[0], (RowRange{3, 9}));
  ASSERT_EQ(p.transfers.size(), 2u);
  EXPECT_EQ(p.transfers[0].rows, (RowRange{0, 3}));
  EXPECT_EQ(p.transfers[1].rows, (RowRange{9, 12}));
}

TEST(ReshardPlan, AnotherRanksMemoryIsNeverASource) {
  RowSource mem;
  mem.rows = {0, 4};
  mem.server = 1;
  mem.memory = true;
  const RowPlan p = plan_rows({0, 4}, 0, 0, {mem});
  EXPECT_TRUE(p.transfers.empty());
  ASSERT_EQ(p.missing.size(), 1u);
  EXPECT_EQ(p.missing[0], (RowRange{0, 4}));
}

TEST(ReshardPlan, ACheaperSourceTakesOverWhereItBegins) {
  // A remote file holds 0..10, a file on this host 4..6: rows 4, 5 stay on the host.
  RowSource far;
  far.rows = {0, 10};
  far.host = 1;
  far.server = 1;
  RowSource near;
  near.rows = {4, 6};
  near.host = 0;
  near.server = 0;
  const std::vector<RowSource> sources{far, near};
  const RowPlan p = plan_rows({0, 10}, 0, 0, sources);
  expect_covers(p, {0, 10}, sources);
  ASSERT_EQ(p.transfers.size(), 3u);
  EXPECT_EQ(p.transfers[1].source, 1u);
  EXPECT_EQ(remote_rows(p, 0, sources), 8u);
}

}  // namespace
}  // namespace erun::state_internal

namespace erun::state_internal {
namespace {

// Rank r of `pieces` offers commit `id` in memory holding `pieces[r]` of 'w' (12 rows of 8 bytes).
Holdings offering(uint64_t id, const std::vector<RowRange>& pieces, std::vector<uint64_t> also_whole = {}) {
  std::vector<Offer> offers;
  for (size_t r = 0; r < pieces.size(); ++r) {
    Offer o;
    o.host = "h" + std::to_string(r);
    o.memory_id = id;
    o.whole = {id};
    o.whole.insert(o.whole.end(), also_whole.begin(), also_whole.end());
    o.memory.push_back({"w", 12, 8, pieces[r]});
    offers.push_back(o);
  }
  return Holdings(std::move(offers));
}

TEST(CommitChoice, TheNewestWholeCommitIsChosenAndTheHighestIdIsSeen) {
  const ShardPiece w{"w", 12, 8, {}};
  Holdings whole = offering(5, {{0, 6}, {6, 12}});
  CommitChoice c = choose_commit(whole, {w});
  EXPECT_EQ(c.target, 5u);
  EXPECT_EQ(c.seen, 5u);
  EXPECT_TRUE(c.lost.empty());
  // Commit 6 lacks rows 6..11; 5 is on a file of rank 0's host (and whole there).
  Holdings partial = offering(6, {{0, 6}}, {5});
  partial.offers[0].files.push_back({"slot-a.b", 5, {"w", 12, 8, {0, 12}}, 64});
  partial.publishes[0] = true;
  c = choose_commit(partial, {w});
  EXPECT_EQ(c.newest, 6u);
  EXPECT_EQ(c.target, 5u);
  EXPECT_EQ(c.seen, 6u);
  EXPECT_EQ(c.lost, "'w' rows 6..11 of 12");
}

TEST(CommitChoice, NothingWholeLeavesNoTargetAndSaysWhatTheNewestLacks) {
  Holdings h = offering(3, {{0, 4}, {8, 12}});
  const CommitChoice c = choose_commit(h, {{"w", 12, 8, {}}});
  EXPECT_EQ(c.target, 0u);
  EXPECT_EQ(c.newest, 3u);
  EXPECT_EQ(c.lost, "'w' rows 4..7 of 12");
  EXPECT_THROW(choose_commit(h, {{"w", 13, 8, {}}}), Error);  // another shape than the pieces'
}

// A commit whose rows lie in the ranks' memory only (its host-memory writes
// failed: /dev/shm full) is whole for the world that keeps each rank's rows
// where they are, not for one that moves rows between ranks (memory is read
// by its own rank alone): the job then goes back to the commit the files
// hold, instead of choosing one it cannot put together.
TEST(CommitChoice, RowsOnlyInAnotherRanksMemoryDoNotMakeACommitWholeForANewLayout) {
  const ShardPiece w{"w", 12, 8, {}};
  Holdings same = offering(5, {{0, 6}, {6, 12}}, {4});
  same.offers[0].files.push_back({"slot-a.a", 4, {"w", 12, 8, {0, 6}}, 64});
  same.offers[1].files.push_back({"slot-b.a", 4, {"w", 12, 8, {6, 12}}, 64});
  same.publishes = {true, true};
  EXPECT_EQ(choose_commit(same, {w}, {SplitRule::kEven}).target, 5u) << "each rank keeps its rows";
  EXPECT_TRUE(same.holes(w, 5, SplitRule::kEven).empty());

  // A third rank joins: the layout 0..3, 4..7, 8..11 moves rows 4..5 from
  // rank 0's memory to rank 1, and 8..11 from rank 1's to rank 2.
  Offer joiner;
  joiner.host = "h2";
  same.offers.push_back(joiner);
  Holdings grown(same.offers);
  grown.publishes = {true, true, false};
  EXPECT_EQ(grown.holes(w, 5).size(), 0u) << "without the new layout every row counts";
  EXPECT_EQ(rows_text(grown.holes(w, 5, SplitRule::kEven)), "rows 4..5, rows 8..11");
  const CommitChoice c = choose_commit(grown, {w}, {SplitRule::kEven});
  EXPECT_EQ(c.newest, 5u);
  EXPECT_EQ(c.target, 4u) << "the commit the files hold whole";
  EXPECT_EQ(c.lost, "'w' rows 4..5, rows 8..11 of 12");
}

// A host's files are offered by one rank: the lowest that found some and
// serves them, not one whose shard server could not listen (port 0: readers
// on other hosts could not reach them through it).
TEST(Holdings, AHostsFilesAreOfferedByItsLowestRankThatServesThem) {
  std::vector<Offer> offers(4);
  offers[0].host = offers[1].host = offers[2].host = "a";
  offers[3].host = "b";
  FilePiece f{"slot-a-0.a", 1, {"w", 12, 8, {0, 6}}, 64};
  for (Offer& o : offers) o.files = {f};
  offers[0].port = 0;  // it could not listen
  offers[1].port = 4001;
  offers[2].port = 4002;
  offers[3].port = 0;  // b's only rank: none serves, its own host still reads
  Holdings h(offers);
  EXPECT_EQ(h.host_of, (std::vector<int>{0, 0, 0, 1}));
  EXPECT_EQ(h.publishes, (std::vector<bool>{false, true, false, true}));
}

// Hosts a (ranks 0, 1) and b (rank 2), each rank with a keeper: a's ranks
// push to b's rank, b's rank to a's first. A host keeps its ranks' own pairs
// and the buddy pairs of the ranks that push to it, nothing of a rank
// without files.
TEST(Holdings, AHostKeepsItsRanksPairsAndThoseOfTheRanksThatPushToIt) {
  std::vector<Offer> offers(4);
  offers[0].host = offers[1].host = "a";
  offers[2].host = offers[3].host = "b";
  const char* stems[] = {"slot-a-0", "slot-a-1", "slot-b-0", ""};  // rank 3 has no host-memory files
  for (size_t r = 0; r < offers.size(); ++r) {
    offers[r].stem = stems[r];
    offers[r].buddy_port = r == 3 ? 0 : 4000 + static_cast<int>(r);
  }
  const Holdings h(offers);
  EXPECT_EQ(pairs_to_keep(h, 0), (std::set<std::string>{"buddy-slot-b-0", "slot-a-0", "slot-a-1"}));
  EXPECT_EQ(pairs_to_keep(h, 1), (std::set<std::string>{"buddy-slot-a-0", "buddy-slot-a-1", "slot-b-0"}));
  // One host: no buddies.
  offers.resize(2);
  EXPECT_EQ(pairs_to_keep(Holdings(offers), 0), (std::set<std::string>{"slot-a-0", "slot-a-1"}));
  // The stem goes through the offer's encoding.
  EXPECT_EQ(decode_offer([&] {
              const std::string e = encode_offer(offers[1]);
              return std::vector<char>(e.begin(), e.end());
            }(), 1).stem,
            "slot-a-1");
}

}  // namespace
}  // namespace erun::state_internal
