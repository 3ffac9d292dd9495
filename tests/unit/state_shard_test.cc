// Sharded entries over a fake world of threads with real host-memory files
// (one directory per fake host) and the real ShardServer on 127.0.0.1: a
// rank dies and the job shrinks, a rank joins and it grows, a host's every
// copy is lost. The rows of the global array a rank holds must always be
// those of the uninterrupted run.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <regex>
#include <set>
#include <thread>

#include "commits/host_commits.h"
#include "common/net.h"
#include "erun/erun.hpp"
#include "state/shard_exchange.h"
#include "state_fake_world.h"

namespace erun {
namespace {

using testing::FakeContext;
using testing::FakeHub;
using testing::run_threads;

constexpr uint64_t kRows = 37;  // uneven over 2, 3 and 4 ranks
constexpr uint64_t kCols = 5;

// The value of element (row, col) after `steps` steps, by any layout.
double expected(uint64_t row, uint64_t col, int64_t steps) {
  double v = static_cast<double>(row * kCols + col);
  for (int64_t s = 0; s < steps; ++s) v = v * 0.5 + static_cast<double>(s) + 0.25 * static_cast<double>(row);
  return v;
}

std::vector<double> initial_piece(const State::ShardSpec& spec, int rank, int size) {
  auto [b, e] = State::shard_rows(spec, rank, size);
  std::vector<double> p;
  for (uint64_t r = b; r < e; ++r) {
    for (uint64_t c = 0; c < kCols; ++c) p.push_back(expected(r, c, 0));
  }
  return p;
}

// One step of this rank's rows, as expected() computes it.
void take_step(std::vector<double>& piece, const State::ShardSpec& spec, Context& c, int64_t step) {
  auto [b, e] = State::shard_rows(spec, c.rank(), c.size());
  ASSERT_EQ(piece.size(), (e - b) * kCols);
  for (uint64_t r = b; r < e; ++r) {
    for (uint64_t k = 0; k < kCols; ++k) {
      double& v = piece[(r - b) * kCols + k];
      v = v * 0.5 + static_cast<double>(step) + 0.25 * static_cast<double>(r);
    }
  }
}

struct Died {};

struct Outcome {
  int rank = -1;
  int size = 0;
  int64_t step = 0;
  uint64_t id = 0;
  std::vector<double> piece;
  std::vector<std::pair<int, int>> resets;
};

class ShardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/erun-shard-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  // A worker on `host`, with that host's commit directory.
  void place(FakeContext& ctx, const std::string& host, int slot) {
    ctx.set_host(host);
    std::filesystem::create_directories(dir_ + "/" + host);
    ctx.set_host_commit_stem(dir_ + "/" + host + "/slot-" + std::to_string(slot));
  }
  // Runs `slot` as a worker of `hub` on host A (slots 0, 1) or B, training
  // its rows for 10 steps in erun::run(); `newcomer`: it joins the next
  // generation first. `before(c, step)` runs before each step, `after(c,
  // step)` after it, before its commit; either throws Died to die. What it
  // ends with goes to `o` (nothing when it died).
  using Hook = std::function<void(Context&, int64_t)>;
  void train(FakeHub& hub, int slot, bool newcomer, const State::ShardSpec& spec, Outcome& o, const Hook& before,
             const Hook& after) {
    FakeContext ctx(hub, slot);
    place(ctx, slot < 2 ? "A" : "B", slot);
    if (newcomer) ctx.rejoin(0);
    State st(ctx);
    int64_t step = 0;
    std::vector<double> piece = initial_piece(spec, ctx.rank(), ctx.size());
    st.register_value("step", &step);
    st.register_shard("w", &piece, spec);
    st.on_reset([&](int a, int b) { o.resets.emplace_back(a, b); });
    try {
      erun::run(st, [&](State& s) {
        Context& c = s.context();
        while (step < 10) {
          if (before) before(c, step);
          ASSERT_NO_FATAL_FAILURE(take_step(piece, spec, c, step));
          c.comm().allreduce_value<int64_t>(1, ReduceOp::kSum);
          ++step;
          if (after) after(c, step);
          s.commit();
        }
      });
    } catch (const Died&) {
      return;
    }
    o.rank = ctx.rank();
    o.size = ctx.size();
    o.step = step;
    o.piece = piece;
    o.id = st.commit_id();
  }
  std::string dir_;
};


// Each rank's rows must be exactly the uninterrupted run's at `steps`.
void expect_exact(const Outcome& o, const State::ShardSpec& spec, int64_t steps) {
  ASSERT_EQ(o.step, steps);
  auto [b, e] = State::shard_rows(spec, o.rank, o.size);
  ASSERT_EQ(o.piece.size(), (e - b) * kCols) << "rank " << o.rank;
  for (uint64_t r = b; r < e; ++r) {
    for (uint64_t c = 0; c < kCols; ++c) {
      ASSERT_EQ(o.piece[(r - b) * kCols + c], expected(r, c, steps)) << "rank " << o.rank << " row " << r;
    }
  }
}

// 4 ranks on hosts A, A, B, B; slot 3 dies at step 3 (3 ranks go on, slot
// 3's rows read from its file on host B); slot 4 joins host B at step 6.
TEST_F(ShardTest, ShrinkAfterADeathAndGrowAfterAJoinKeepEveryRowExact) {
  const State::ShardSpec spec{kRows, kCols, State::ShardSplit::kChunk};
  FakeHub hub(4);
  const int newcomer = 4;
  std::atomic<bool> at_five{false};
  std::atomic<bool> added{false};
  std::vector<Outcome> out(5);
  run_threads(5, [&](int slot) {
    if (slot == newcomer) {
      // Joins once the job runs at 3: the next generation takes it.
      while (!at_five.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      ASSERT_EQ(hub.add_slot(), newcomer);
      added = true;
    }
    train(hub, slot, slot == newcomer, spec, out[static_cast<size_t>(slot)], [&](Context& c, int64_t step) {
      if (slot == 3 && step == 3) {
        hub.kill(3);
        throw Died{};
      }
      if (slot == 0 && step == 5) at_five = true;
      if (slot == 0 && step == 6 && c.size() == 3) {
        while (!added.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        hub.set_host_update(0);
      }
    }, {});
  });
  std::vector<bool> ranks(4, false);
  for (int slot : {0, 1, 2, 4}) {
    const Outcome& o = out[static_cast<size_t>(slot)];
    ASSERT_EQ(o.size, 4) << "slot " << slot;
    ranks[static_cast<size_t>(o.rank)] = true;
    expect_exact(o, spec, 10);
  }
  EXPECT_EQ(ranks, std::vector<bool>(4, true));
  EXPECT_EQ(out[0].resets, (std::vector<std::pair<int, int>>{{4, 3}, {3, 4}}));
}

// A worker that joins by a grow gets its rows at the sync, which keeps
// them in its host's memory and pushes them to its buddy before its first
// commit: both copies must be readable as pieces (their table with them),
// else a loss of that worker in the window before its first commit is whole
// leaves its rows nowhere (the Python sharded test found it under load).
TEST_F(ShardTest, AJoinersRowsAreReadableAsPiecesBeforeItsFirstCommit) {
  const State::ShardSpec spec{kRows, kCols, State::ShardSplit::kChunk};
  FakeHub hub(2);
  const int newcomer = 2;  // on host B; slots 0 and 1 on host A
  std::atomic<bool> added{false};
  std::vector<Outcome> out(3);
  std::vector<std::string> own, buddy;  // what host B's and host A's files held for the joiner
  run_threads(3, [&](int slot) {
    if (slot == newcomer) {
      while (!added.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    bool looked = false;
    train(hub, slot, slot == newcomer, spec, out[static_cast<size_t>(slot)], [&](Context& c, int64_t step) {
      if (slot == 0 && step == 3 && c.size() == 2) {
        ASSERT_EQ(hub.add_slot(), newcomer);
        added = true;
        hub.set_host_update(0);
      }
      if (slot != newcomer || looked) return;
      looked = true;  // its first step after the sync, before any commit of its own
      auto [b, e] = State::shard_rows(spec, c.rank(), c.size());
      auto holds = [&](const std::string& host, const std::string& file_prefix, std::vector<std::string>& seen) {
        for (const auto& f : state_internal::list_pieces(dir_ + "/" + host, 0)) {
          seen.push_back(f.file + " " + std::to_string(f.piece.held.begin) + ".." + std::to_string(f.piece.held.end));
          if (f.file.rfind(file_prefix, 0) == 0 && f.piece.name == "w" && f.piece.held.begin == b &&
              f.piece.held.end == e) {
            return true;
          }
        }
        return false;
      };
      EXPECT_TRUE(holds("B", "slot-2", own)) << "rows " << b << ".." << e << "; host B's pieces: "
                                             << ::testing::PrintToString(own);
      // The push runs beside training: give it a few seconds.
      bool pushed = false;
      for (int i = 0; i < 500 && !pushed; ++i) {
        buddy.clear();
        pushed = holds("A", "buddy-slot-2", buddy);
        if (!pushed) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      EXPECT_TRUE(pushed) << "rows " << b << ".." << e << "; host A's pieces: " << ::testing::PrintToString(buddy);
    }, {});
  });
  for (int slot : {0, 1, 2}) {
    const Outcome& o = out[static_cast<size_t>(slot)];
    ASSERT_EQ(o.size, 3) << "slot " << slot;
    expect_exact(o, spec, 10);
  }
}

// Slot 3 dies after the step's collectives and before its commit 4: the
// others' commit barrier fails, so none of them makes commit 4 either, and
// the job goes on from commit 3 (whole entries from the survivors' files)
// and redoes step 3. A replacement on host B starts at once and joins.
TEST_F(ShardTest, AWorkerThatDiesBeforeItsCommitSendsTheJobBackOneCommitExactly) {
  const State::ShardSpec spec{kRows, kCols, State::ShardSplit::kChunk};
  FakeHub hub(4);
  const int newcomer = 4;
  std::atomic<bool> added{false};
  std::vector<Outcome> out(5);
  run_threads(5, [&](int slot) {
    if (slot == newcomer) {
      while (!added.load()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    train(hub, slot, slot == newcomer, spec, out[static_cast<size_t>(slot)], {}, [&](Context&, int64_t step) {
      if (slot == 3 && step == 4) {
        ASSERT_EQ(hub.add_slot(), newcomer);  // its replacement, on host B
        added = true;
        hub.kill(3);
        throw Died{};
      }
    });
  });
  for (int slot : {0, 1, 2, 4}) {
    const Outcome& o = out[static_cast<size_t>(slot)];
    ASSERT_EQ(o.size, 4) << "slot " << slot;
    expect_exact(o, spec, 10);
    // The lost attempt's commit 4 was never made (the commit's barrier
    // failed before any rank took it): 3, then 4 again onward.
    EXPECT_EQ(o.id, 10u) << "slot " << slot;
  }
  EXPECT_EQ(out[0].resets, (std::vector<std::pair<int, int>>{{4, 4}}));
}

// Every rank reaches a commit whose barrier fails while all of them live (a
// push, or a rank, slower than the collective timeout): that commit was not
// made, on any rank, and the job goes on from the one before with its rows
// and its values together. (Taken into memory before the barrier, the
// values were the new commit's and the rows, in the host files, the old
// one's: the job went on a step ahead of its rows.)
TEST_F(ShardTest, ACommitWhoseBarrierFailsOnEveryRankIsNotMadeHalfway) {
  const State::ShardSpec spec{kRows, kCols, State::ShardSplit::kChunk};
  FakeHub hub(4);
  std::vector<Outcome> out(4);
  std::atomic<bool> broke{false};
  run_threads(4, [&](int slot) {
    train(hub, slot, false, spec, out[static_cast<size_t>(slot)], {}, [&](Context&, int64_t step) {
      // Every rank is past step 4's allreduce: each one's next collective is its commit's barrier.
      if (slot == 0 && step == 4 && !broke.exchange(true)) hub.break_generation();
    });
  });
  ASSERT_TRUE(broke.load());
  for (int slot = 0; slot < 4; ++slot) {
    const Outcome& o = out[static_cast<size_t>(slot)];
    ASSERT_EQ(o.size, 4) << "slot " << slot;
    expect_exact(o, spec, 10);
  }
}

// Both workers of host B die at once: their rows come back from the buddy
// copies they pushed to host A at each commit, and the job goes on in place
// at 2 ranks, exactly.
TEST_F(ShardTest, AHostLostWholeComesBackFromItsBuddyCopies) {
  const State::ShardSpec spec{kRows, kCols, State::ShardSplit::kEven};
  FakeHub hub(4);
  std::vector<Outcome> out(4);
  run_threads(4, [&](int slot) {
    train(hub, slot, false, spec, out[static_cast<size_t>(slot)], [&](Context&, int64_t step) {
      if (slot >= 2 && step == 3) {
        hub.kill(slot);
        throw Died{};
      }
    }, {});
  });
  for (int slot : {0, 1}) {
    const Outcome& o = out[static_cast<size_t>(slot)];
    ASSERT_EQ(o.size, 2) << "slot " << slot;
    expect_exact(o, spec, 10);
  }
  // B's rows came from the buddy files on host A (B's own files had no
  // living reader). With B gone nobody pushes to A: once the first commit at
  // 2 ranks is whole, they are stale and removed.
  size_t buddies = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir_ + "/A")) {
    buddies += e.path().filename().string().rfind("buddy-slot-", 0) == 0;
  }
  EXPECT_EQ(buddies, 0u);
}

// The names of the files in `dir`, sorted.
std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Lines of /proc/self/maps that map a removed file under `dir`.
std::vector<std::string> removed_mappings(const std::string& dir) {
  std::vector<std::string> out;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    if (line.find(dir) != std::string::npos && line.find("(deleted)") != std::string::npos) out.push_back(line);
  }
  return out;
}

// 4 ranks on hosts A (slots 0, 1) and B (2, 3); slot 3 dies at step 3 and
// the job goes on at 3. Its own pair on B and the buddy pair A kept for it
// are stale once the first commit at 3 is whole: removed, and no keeper
// still maps them, while every pair the job uses stays.
TEST_F(ShardTest, PairsTheNewGenerationDoesNotUseAreRemovedOnceItsFirstCommitIsWhole) {
  const State::ShardSpec spec{kRows, kCols, State::ShardSplit::kChunk};
  FakeHub hub(4);
  std::vector<Outcome> out(4);
  std::vector<std::string> on_a, on_b, mapped;
  run_threads(4, [&](int slot) {
    train(hub, slot, false, spec, out[static_cast<size_t>(slot)], [&](Context& c, int64_t step) {
      if (slot == 3 && step == 3) {
        hub.kill(3);
        throw Died{};
      }
      // Two commits after the shrink: the first one's barrier saw every
      // rank's rows in the pairs the generation uses.
      if (slot == 0 && step == 7 && c.size() == 3) {
        on_a = files_in(dir_ + "/A");
        on_b = files_in(dir_ + "/B");
        mapped = removed_mappings(dir_);
      }
    }, {});
  });
  for (int slot : {0, 1, 2}) expect_exact(out[static_cast<size_t>(slot)], spec, 10);
  // Ranks 0, 1 (A) push to rank 2 (B), and rank 2 to rank 0.
  EXPECT_EQ(on_a, (std::vector<std::string>{"buddy-slot-2.a", "buddy-slot-2.b", "slot-0.a", "slot-0.b", "slot-1.a",
                                             "slot-1.b"}));
  EXPECT_EQ(on_b, (std::vector<std::string>{"buddy-slot-0.a", "buddy-slot-0.b", "buddy-slot-1.a", "buddy-slot-1.b",
                                             "slot-2.a", "slot-2.b"}));
  EXPECT_TRUE(mapped.empty()) << ::testing::PrintToString(mapped);
}

// Hosts A, B, C (each buddy to the next, around): B and C are lost at once.
// B's rows had their copies on C only, so they are named and not trained
// on; C's rows were on A.
TEST_F(ShardTest, RowsWhoseEveryCopyIsLostAreNamedAndNotTrainedOn) {
  const State::ShardSpec spec{kRows, kCols, State::ShardSplit::kEven};
  FakeHub hub(6);
  std::vector<std::string> errors(6);
  std::vector<int64_t> steps(6, -1);
  run_threads(6, [&](int slot) {
    FakeContext ctx(hub, slot);
    place(ctx, std::string(1, static_cast<char>('A' + slot / 2)), slot);
    State st(ctx);
    int64_t step = 0;
    std::vector<double> piece = initial_piece(spec, ctx.rank(), ctx.size());
    st.register_value("step", &step);
    st.register_shard("w", &piece, spec);
    try {
      erun::run(st, [&](State& s) {
        while (step < 6) {
          if (slot >= 2 && step == 2) {
            hub.kill(slot);
            throw Died{};
          }
          s.context().comm().allreduce_value<int64_t>(1, ReduceOp::kSum);
          ++step;
          s.commit();
        }
      });
    } catch (const Died&) {
      return;
    } catch (const StateLost& e) {
      errors[static_cast<size_t>(slot)] = e.what();
    }
    steps[static_cast<size_t>(slot)] = step;
  });
  // kEven over 37 rows and 6 ranks: 7, 6, 6, 6, 6, 6; B's ranks 2, 3 held
  // rows 13..24. (C's rows 25..36 may be named too: the push of C's last
  // commit to A may not have ended when C died.)
  for (int slot : {0, 1}) {
    const std::string& e = errors[static_cast<size_t>(slot)];
    std::smatch m;
    ASSERT_TRUE(std::regex_search(e, m, std::regex("no living host holds 'w' rows 13\\.\\.([0-9]+)"))) << e;
    EXPECT_GE(std::stoi(m[1].str()), 24) << e;  // B's rows, and maybe C's after them
    EXPECT_EQ(e.find("rows 0.."), std::string::npos) << e;
    EXPECT_EQ(steps[static_cast<size_t>(slot)], 2);
  }
}

// A piece of the wrong size is refused at commit, naming the entry and
// its rows, and the previous commit stays.
TEST_F(ShardTest, APieceOfTheWrongSizeIsRefusedAtCommit) {
  FakeHub hub(1);
  FakeContext ctx(hub, 0);
  place(ctx, "A", 0);
  State st(ctx);
  std::vector<float> piece(10 * 3);
  st.register_shard("w", &piece, State::ShardSpec{10, 3, State::ShardSplit::kChunk});
  st.sync();
  st.commit();
  piece.push_back(1.0f);
  try {
    st.commit();
    FAIL() << "a piece of 31 floats was committed as 10 rows of 3";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sharded entry 'w' holds 124 bytes on rank 0 of 1"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(st.commit_id(), 1u);
  st.restore();
  EXPECT_EQ(piece.size(), 30u);
}

TEST_F(ShardTest, AShardRegisteredAfterTheCheckpointDirectoryIsRefusedByName) {
  FakeHub hub(1);
  FakeContext ctx(hub, 0);
  State st(ctx);
  st.set_checkpoint_dir(dir_ + "/ckpt");
  std::vector<double> piece(4);
  try {
    st.register_shard("w", &piece, State::ShardSpec{4, 1, State::ShardSplit::kChunk});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sharded entry 'w' registered after the checkpoint directory"),
              std::string::npos)
        << e.what();
  }
}

// With a checkpoint directory every rank writes its pieces of each commit
// there (rank 0 the whole entries once all have); a job of another size
// started from that directory alone (no host memory) resumes at the last
// commit, each rank with exactly its new rows.
// A worker of `hub` on `host` with the job's checkpoint directory `ckpt`,
// synced, then trained until `steps` steps, each committed. `garbage`: its
// steps write -1 everywhere instead (a commit that is never agreed on).
void train_durable(FakeHub& hub, int slot, const std::string& host, const std::string& ckpt, int64_t steps,
                   Outcome* o, bool garbage = false) {
  const State::ShardSpec spec{kRows, kCols, State::ShardSplit::kChunk};
  FakeContext ctx(hub, slot);
  ctx.set_host(host);
  const std::string memory = std::filesystem::path(ckpt).parent_path().string() + "/" + host;
  std::filesystem::create_directories(memory);
  ctx.set_host_commit_stem(memory + "/slot-" + std::to_string(slot));
  State st(ctx);
  int64_t step = 0;
  std::vector<double> piece = initial_piece(spec, ctx.rank(), ctx.size());
  st.register_value("step", &step);
  st.register_shard("w", &piece, spec);
  st.set_checkpoint_dir(ckpt);
  st.sync();
  while (step < steps) {
    take_step(piece, spec, ctx, step);
    if (garbage) std::fill(piece.begin(), piece.end(), -1.0);
    ++step;
    st.commit();
  }
  if (o != nullptr) *o = Outcome{ctx.rank(), ctx.size(), step, st.commit_id(), piece, {}};
}

TEST_F(ShardTest, ACheckpointDirectoryKeepsEveryPieceAndAnotherWorldResumesFromIt) {
  const State::ShardSpec spec{kRows, kCols, State::ShardSplit::kChunk};
  const std::string ckpt = dir_ + "/ckpt";
  {
    FakeHub hub(3);
    run_threads(3, [&](int slot) { train_durable(hub, slot, "A", ckpt, 4, nullptr); });
  }
  EXPECT_TRUE(std::filesystem::exists(ckpt + "/erun-state.bin"));
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(std::filesystem::exists(ckpt + "/erun-shards/rank-" + std::to_string(r) + ".a")) << r;
  }
  std::vector<Outcome> out(2);
  FakeHub hub(2);
  // On another host: its memory holds nothing of the job. No step: the
  // pieces are as the sync resumed them.
  run_threads(2, [&](int slot) { train_durable(hub, slot, "B", ckpt, 0, &out[static_cast<size_t>(slot)]); });
  for (const Outcome& o : out) {
    EXPECT_EQ(o.id, 4u);
    expect_exact(o, spec, 4);  // the step too: a whole entry of the file
  }
}

// A job crashes after every rank wrote its pieces of commit 5 but before
// erun-state.bin named it; it resumes from commit 4 on 2 ranks, commits,
// and crashes again; then 3 ranks resume. Had the second job numbered its
// commit 5 too, rank 2's file of the first job's commit 5 (never agreed on,
// here all -1) would pass for a piece of it.
TEST_F(ShardTest, AResumeFromDiskNeverReusesTheIdOfACommitLeftInThePiecesFiles) {
  const State::ShardSpec spec{kRows, kCols, State::ShardSplit::kChunk};
  const std::string ckpt = dir_ + "/ckpt";
  const std::string agreed = dir_ + "/erun-state.bin.4";
  {
    FakeHub hub(3);
    run_threads(3, [&](int slot) { train_durable(hub, slot, "A", ckpt, 4, nullptr); });
  }
  std::filesystem::copy_file(ckpt + "/erun-state.bin", agreed);
  {
    FakeHub hub(3);
    run_threads(3, [&](int slot) { train_durable(hub, slot, "A", ckpt, 5, nullptr, /*garbage=*/true); });
  }
  // The crash: the pieces hold commit 5, erun-state.bin still names 4.
  std::filesystem::copy_file(agreed, ckpt + "/erun-state.bin", std::filesystem::copy_options::overwrite_existing);
  std::vector<Outcome> second(2);
  {
    FakeHub hub(2);
    run_threads(2, [&](int slot) { train_durable(hub, slot, "B", ckpt, 5, &second[static_cast<size_t>(slot)]); });
  }
  for (const Outcome& o : second) {
    EXPECT_GT(o.id, 5u) << "commit 5 of the pieces files was never agreed on";
    expect_exact(o, spec, 5);
  }
  std::vector<Outcome> third(3);
  FakeHub hub(3);
  run_threads(3, [&](int slot) { train_durable(hub, slot, "C", ckpt, 5, &third[static_cast<size_t>(slot)]); });
  for (const Outcome& o : third) {
    EXPECT_EQ(o.id, second[0].id);
    expect_exact(o, spec, 5);
  }
}

}  // namespace
}  // namespace erun

namespace erun::state_internal {
namespace {

// A commit directory with one worker's file pair holding commit 3, whose
// entry "w" is 1 MiB + 3 bytes of a known pattern.
class ShardServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/erun-shard-server-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    bytes_.resize((1u << 20) + 3);
    for (size_t i = 0; i < bytes_.size(); ++i) bytes_[i] = static_cast<char>(i * 7 + 1);
    commits_ = std::make_unique<HostCommits>(dir_ + "/slot-a-0");
    const std::string name = "w";
    std::vector<const char*> placed;
    ASSERT_FALSE(commits_->write(3, {EntryRef::of(name, bytes_)}, &placed).has_value());
    auto fd = HostCommits::open_own(dir_ + "/slot-a-0.a");
    auto l = HostCommits::list(fd.get());
    ASSERT_TRUE(l.has_value());
    offset_ = l->offsets[0];
  }
  void TearDown() override {
    commits_.reset();
    std::filesystem::remove_all(dir_);
  }
  std::string dir_;
  std::vector<char> bytes_;
  std::unique_ptr<HostCommits> commits_;
  uint64_t offset_ = 0;
};

TEST_F(ShardServerTest, ARangeIsReadOverTcpAndStrangersAndBadRequestsGetNothing) {
  ShardServer server("127.0.0.1", dir_, "job", "secret", std::chrono::seconds(5));
  ASSERT_NE(server.port(), 0) << server.error();
  std::vector<char> a(5), b(1u << 20);
  const std::vector<ByteRange> ranges{{offset_ + 2, 5, a.data()}, {offset_ + 3, b.size(), b.data()}};
  Status ok = fetch_ranges("127.0.0.1", server.port(), "job", "secret", "slot-a-0.a", 3, ranges, std::chrono::seconds(5));
  ASSERT_TRUE(ok.is_ok()) << ok.message();
  EXPECT_TRUE(std::equal(a.begin(), a.end(), bytes_.begin() + 2));
  EXPECT_TRUE(std::equal(b.begin(), b.end(), bytes_.begin() + 3));

  auto refused = [&](const std::string& secret, const std::string& file, uint64_t id, uint64_t off, uint64_t n) {
    std::vector<char> out(static_cast<size_t>(std::min<uint64_t>(n, 1u << 20)));
    return fetch_ranges("127.0.0.1", server.port(), "job", secret, file, id, {{off, n, out.data()}},
                        std::chrono::seconds(5));
  };
  Status s = refused("another secret", "slot-a-0.a", 3, offset_, 4);
  EXPECT_NE(s.message().find("failed the job secret's proof"), std::string::npos) << s.message();
  s = refused("secret", "../slot-a-0.a", 3, offset_, 4);
  EXPECT_NE(s.message().find("not a file of the commit directory"), std::string::npos) << s.message();
  s = refused("secret", "slot-a-0.a", 4, offset_, 4);
  EXPECT_NE(s.message().find("does not hold commit 4"), std::string::npos) << s.message();
  s = refused("secret", "slot-a-0.a", 3, offset_ + bytes_.size() + 1000000, 4);
  EXPECT_NE(s.message().find("outside"), std::string::npos) << s.message();
  s = refused("secret", "nope.a", 3, 0, 4);
  EXPECT_NE(s.message().find("no file nope.a here"), std::string::npos) << s.message();
  // The server still serves after all that.
  ok = fetch_ranges("127.0.0.1", server.port(), "job", "secret", "slot-a-0.a", 3, ranges, std::chrono::seconds(5));
  EXPECT_TRUE(ok.is_ok()) << ok.message();
}

TEST_F(ShardServerTest, AStrangerThatSaysNothingHoldsTheServerOnlyForTheHandshakeTime) {
  ShardServer server("127.0.0.1", dir_, "job", "secret", std::chrono::seconds(30));
  ASSERT_NE(server.port(), 0) << server.error();
  auto addrs = net::resolve("127.0.0.1", std::to_string(server.port()));
  ASSERT_TRUE(addrs.is_ok());
  net::Socket silent = net::connect(addrs.value().front(), std::chrono::steady_clock::now() + std::chrono::seconds(5));
  ASSERT_TRUE(silent.ok());
  std::vector<char> a(5);
  const auto t0 = std::chrono::steady_clock::now();
  Status ok = fetch_ranges("127.0.0.1", server.port(), "job", "secret", "slot-a-0.a", 3, {{offset_, 5, a.data()}},
                           std::chrono::seconds(20));
  EXPECT_TRUE(ok.is_ok()) << ok.message();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(15));
}

// Readers are answered side by side: one that connects and says nothing
// (or reads slowly) does not hold another past its own timeout.
TEST_F(ShardServerTest, AReaderIsAnsweredBesideOneThatHangs) {
  ShardServer server("127.0.0.1", dir_, "job", "secret", std::chrono::seconds(30));
  ASSERT_NE(server.port(), 0) << server.error();
  auto addrs = net::resolve("127.0.0.1", std::to_string(server.port()));
  ASSERT_TRUE(addrs.is_ok());
  net::Socket silent = net::connect(addrs.value().front(), std::chrono::steady_clock::now() + std::chrono::seconds(5));
  ASSERT_TRUE(silent.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the server took it first
  std::vector<char> a(5);
  Status ok = fetch_ranges("127.0.0.1", server.port(), "job", "secret", "slot-a-0.a", 3, {{offset_, 5, a.data()}},
                           std::chrono::seconds(2));
  EXPECT_TRUE(ok.is_ok()) << ok.message();
  EXPECT_TRUE(std::equal(a.begin(), a.end(), bytes_.begin()));
}

// A BuddyKeeper in a child process of its own (its server threads, as in a
// worker), to be frozen with SIGSTOP, and pushes to it of 32 MiB pieces whose
// every byte is the commit's id.
class BuddyPush : public ::testing::Test {
 protected:
  static constexpr Duration kTimeout = std::chrono::seconds(2);
  void SetUp() override {
    char tmpl[] = "/tmp/erun-buddy-push-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    int port_pipe[2];
    ASSERT_EQ(::pipe(port_pipe), 0);
    keeper_ = ::fork();  // before this process has any thread of its own
    ASSERT_GE(keeper_, 0);
    if (keeper_ == 0) {
      ::close(port_pipe[0]);
      // The keeper's I/O bound, as a worker's (its collective timeout): far
      // longer than a pusher's here, so that a push it is stuck on shows.
      BuddyKeeper k("127.0.0.1", dir_, "job", "secret", std::chrono::seconds(30));
      const int port = k.port();
      if (::write(port_pipe[1], &port, sizeof port) != sizeof port) ::_exit(3);
      for (;;) ::pause();
    }
    ::close(port_pipe[1]);
    ASSERT_EQ(::read(port_pipe[0], &port_, sizeof port_), static_cast<ssize_t>(sizeof port_));
    ::close(port_pipe[0]);
    ASSERT_GT(port_, 0);
  }
  void TearDown() override {
    for (pid_t pid : {keeper_, pusher_}) {
      if (pid <= 0) continue;
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    std::filesystem::remove_all(dir_);
  }
  Status push(const std::string& name, uint64_t id, Duration timeout = kTimeout) {
    std::vector<char> piece(32u << 20, static_cast<char>(id));
    return push_to_buddy("127.0.0.1", port_, "job", "secret", name, id, id - 1, {EntryRef::of("w", piece)}, timeout);
  }
  // True once the keeper has written byte `id` at the first MiB of the piece
  // of buddy file pair `name` (either file), which a push of `id` to it
  // completed before gave the layout of.
  bool landed(const std::string& name, uint64_t id) {
    const std::string stem = dir_ + "/" + name;
    if (probe_ == 0) {
      auto listing = HostCommits::list(HostCommits::open_own(stem + ".a").get());
      if (!listing) return false;
      probe_ = listing->offsets[0] + (1u << 20);
    }
    for (const char* ab : {".a", ".b"}) {
      Fd fd(::open((stem + ab).c_str(), O_RDONLY | O_CLOEXEC));
      char c = 0;
      if (fd.get() >= 0 && ::pread(fd.get(), &c, 1, static_cast<off_t>(probe_)) == 1 && c == static_cast<char>(id)) {
        return true;
      }
    }
    return false;
  }
  // Waits (up to 20 s) for the first MiB of `id` to land in pair `name`, then freezes `pid`.
  void freeze_once_landed(pid_t pid, const std::string& name, uint64_t id) {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!landed(name, id) && std::chrono::steady_clock::now() < give_up) std::this_thread::yield();
    ::kill(pid, SIGSTOP);
  }
  std::string dir_;
  pid_t keeper_ = -1;
  pid_t pusher_ = -1;
  int port_ = 0;
  uint64_t probe_ = 0;
};

// A frozen buddy: the keeper is SIGSTOPped before a push and in the middle
// of one (once its first MiB has landed). Its listening socket still takes
// the connection, so only the pusher's timeout ends the push: it fails
// within it, saying which commit has no copy, and the keeper, once it runs
// again, keeps the next push. (A sync and the next commit wait for a push:
// without the bound a frozen buddy would hold the job for good.)
TEST_F(BuddyPush, APushToAFrozenBuddyFailsWithinItsTimeoutAndTheKeeperTakesTheNextOnceThawed) {
  const std::string name = "buddy-slot-a-0";
  Status first = push(name, 1);
  ASSERT_TRUE(first.is_ok()) << first.message();
  // Pushes commit `id` while the keeper is frozen (mid_push: from the moment
  // its first MiB has landed); the push's status and how long it took.
  auto push_frozen = [&](uint64_t id, bool mid_push, double* took) {
    if (!mid_push) ::kill(keeper_, SIGSTOP);
    std::thread freezer;
    if (mid_push) freezer = std::thread([&] { freeze_once_landed(keeper_, name, id); });
    const auto t0 = std::chrono::steady_clock::now();
    Status s = push(name, id);
    *took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (freezer.joinable()) freezer.join();
    return s;
  };
  uint64_t id = 2;
  for (const bool mid_push : {false, true}) {
    double took = 0;
    Status frozen = push_frozen(id, mid_push, &took);
    // The rest of the piece may beat the SIGSTOP on a busy machine: try again.
    for (int again = 0; mid_push && frozen.is_ok() && again < 3; ++again) {
      ::kill(keeper_, SIGCONT);
      frozen = push_frozen(++id, mid_push, &took);
    }
    EXPECT_FALSE(frozen.is_ok()) << (mid_push ? "mid-push" : "before the push");
    EXPECT_NE(frozen.message().find("keeping commit " + std::to_string(id)), std::string::npos) << frozen.message();
    // One step (a connect, a send, the receipt) waits up to the timeout; a margin for a loaded machine.
    EXPECT_LT(took, 2.0 + 10.0) << frozen.message();
    ::kill(keeper_, SIGCONT);
    // The keeper drops the pusher that went away, then takes the next.
    Status after = Status::error("not tried");
    for (int attempt = 0; attempt < 10 && !after.is_ok(); ++attempt) {
      after = push(name, ++id);
      if (!after.is_ok()) std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
    EXPECT_TRUE(after.is_ok()) << after.message();
    ++id;
  }
}

// Two pushers with one buddy (a host with fewer workers than the one before
// it). One is frozen in the middle of its push: the keeper, which waits up
// to its own 30 s bound for the rest, takes the other's push meanwhile, at
// once, where one push at a time made it fail at its 2 s handshake.
TEST_F(BuddyPush, AFrozenPusherHoldsOnlyItsOwnPushAndTheOtherPusherIsKept) {
  const std::string frozen_name = "buddy-slot-a-0", other = "buddy-slot-a-1";
  Status first = push(frozen_name, 1);
  ASSERT_TRUE(first.is_ok()) << first.message();
  pusher_ = ::fork();  // this process has no thread of its own: the keeper is a child
  ASSERT_GE(pusher_, 0);
  if (pusher_ == 0) ::_exit(push(frozen_name, 2, std::chrono::seconds(30)).is_ok() ? 0 : 1);
  freeze_once_landed(pusher_, frozen_name, 2);
  ASSERT_TRUE(landed(frozen_name, 2)) << "the first pusher's push never began";
  const auto t0 = std::chrono::steady_clock::now();
  Status s = push(other, 1);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(s.is_ok()) << s.message();
  EXPECT_LT(took, 10.0) << "the keeper waited for the frozen pusher";
}

// Two buddy keepers of one host (two of its workers) over one commit
// directory, and pushes of one pusher's pair to either.
class BuddyKeepers : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/erun-buddy-keepers-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    k0_ = std::make_unique<BuddyKeeper>("127.0.0.1", dir_, "job", "secret", std::chrono::seconds(10));
    k1_ = std::make_unique<BuddyKeeper>("127.0.0.1", dir_, "job", "secret", std::chrono::seconds(10));
    ASSERT_NE(k0_->port(), 0) << k0_->error();
    ASSERT_NE(k1_->port(), 0) << k1_->error();
  }
  void TearDown() override {
    k0_.reset();
    k1_.reset();
    std::filesystem::remove_all(dir_);
  }
  // Commit `id` of a piece of `bytes` bytes of `fill`, never over `keep`.
  void push(const BuddyKeeper& k, uint64_t id, uint64_t keep, size_t bytes, char fill) {
    std::vector<char> piece(bytes, fill);
    Status s = push_to_buddy("127.0.0.1", k.port(), "job", "secret", kName, id, keep, {EntryRef::of("w", piece)},
                             std::chrono::seconds(10));
    ASSERT_TRUE(s.is_ok()) << "commit " << id << ": " << s.message();
  }
  // What each file of the pair holds: commit id and its piece's size.
  std::set<std::pair<uint64_t, size_t>> held() const {
    std::set<std::pair<uint64_t, size_t>> out;
    for (const char* ab : {".a", ".b"}) {
      auto c = HostCommits::read(dir_ + "/" + kName + ab);
      if (c) out.insert({c->commit_id, c->entries.at(0).second.size()});
    }
    return out;
  }
  static constexpr const char* kName = "buddy-slot-b-0";
  std::string dir_;
  std::unique_ptr<BuddyKeeper> k0_, k1_;
};

// Once a generation's stale pairs are gone, a late push of one (a frozen
// pusher of an older generation) is refused rather than making it again;
// the next generation's sync takes any name again.
TEST_F(BuddyKeepers, APushOfAForgottenPairIsRefusedUntilTheNextGeneration) {
  push(*k0_, 1, 0, 4096, 1);
  k0_->forget_pairs_except({"buddy-slot-c-0"});
  std::vector<char> piece(4096, 2);
  Status s = push_to_buddy("127.0.0.1", k0_->port(), "job", "secret", kName, 2, 1, {EntryRef::of("w", piece)},
                           std::chrono::seconds(10));
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("no longer kept here"), std::string::npos) << s.message();
  EXPECT_EQ(held(), (std::set<std::pair<uint64_t, size_t>>{{1, 4096}}));
  k0_->accept_any();
  push(*k0_, 2, 1, 4096, 2);
  EXPECT_EQ(held(), (std::set<std::pair<uint64_t, size_t>>{{1, 4096}, {2, 4096}}));
}

// A pusher's buddy moves between the workers of a host (the pairs change at
// each generation) and back: the keeper it comes back to writes over the
// older commit the files hold now, not over the one the other keeper wrote
// last (which a push cut short would then have left the host without).
TEST_F(BuddyKeepers, AKeeperThatServesAPusherAgainWritesOverTheOlderCommit) {
  using Held = std::set<std::pair<uint64_t, size_t>>;
  push(*k0_, 1, 0, 4096, 1);
  push(*k0_, 2, 1, 4096, 2);
  push(*k1_, 3, 2, 4096, 3);  // the pairs changed: k1 writes over 1
  EXPECT_EQ(held(), (Held{{2, 4096}, {3, 4096}}));
  push(*k0_, 4, 3, 4096, 4);  // and back: over 2, never over 3
  EXPECT_EQ(held(), (Held{{3, 4096}, {4, 4096}}));
}

// A job that went back to commit 3 (its commit 4 was not whole across the
// job) pushes 3 again in its new layout, then goes on with 5: the keeper
// writes each over the abandoned 4, never over the pusher's copy of 3 (it
// may be the host's only copy of those rows until the next push lands),
// then over 3's old layout. (By ids alone it wrote 3's new layout over
// its old one, and 5 over the new one, keeping the abandoned 4.)
TEST_F(BuddyKeepers, AfterGoingBackTheKeeperWritesOverTheAbandonedCommitFirst) {
  using Held = std::set<std::pair<uint64_t, size_t>>;
  push(*k0_, 3, 2, 4096, 3);
  push(*k0_, 4, 3, 4096, 4);
  ASSERT_EQ(held(), (Held{{3, 4096}, {4, 4096}}));
  push(*k1_, 3, 3, 1024, 13);  // 3 in its new layout, kept by another worker of the host
  EXPECT_EQ(held(), (Held{{3, 4096}, {3, 1024}})) << "the abandoned 4 stayed";
  push(*k0_, 5, 3, 1024, 5);
  EXPECT_EQ(held(), (Held{{3, 1024}, {5, 1024}})) << "the pusher's copy of 3 written over";
}

TEST(ShardTable, ATableRoundTripsAndGarbageIsAnErrorNamingTheSource) {
  std::vector<ShardPiece> t{{"a", 10, 8, {0, 4}}, {"b.c", 7, 1, {7, 7}}};
  const std::string bytes = encode_shard_table(t);
  auto back = decode_shard_table(bytes.data(), bytes.size(), "here");
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[1].name, "b.c");
  EXPECT_EQ(back[0].held, (RowRange{0, 4}));
  EXPECT_THROW(decode_shard_table(bytes.data(), bytes.size() - 1, "here"), Error);
  std::vector<ShardPiece> bad{{"a", 3, 8, {2, 5}}};  // rows beyond the array
  const std::string b2 = encode_shard_table(bad);
  try {
    decode_shard_table(b2.data(), b2.size(), "file X");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("file X"), std::string::npos);
  }
}

}  // namespace
}  // namespace erun::state_internal
