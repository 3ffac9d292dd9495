// sync(), check_host_updates() and the erun::run() loop over a fake world of
// threads: root choice, fresh starts, agreement on host updates, recovery from
// a failed collective, a rank that dies, a rank that joins.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>

#include "erun/erun.hpp"
#include "state_fake_world.h"

namespace erun {
namespace {

using testing::FakeContext;
using testing::FakeHub;
using testing::run_threads;

TEST(StateSync, RootIsTheLowestRankWithTheHighestCommit) {
  const std::vector<int> commits{2, 5, 5, 0};
  FakeHub shared(4);
  std::vector<int64_t> value(4);
  std::vector<std::vector<int>> vec(4);
  std::vector<uint64_t> ids(4);
  run_threads(4, [&](int r) {
    FakeHub solo(1);  // commits made alone, so each rank can reach its own commit id
    FakeContext ctx(solo, 0);
    State st(ctx);
    int64_t v = -1;
    std::vector<int> w;
    st.register_value("v", &v);
    st.register_vector("w", &w);
    for (int c = 1; c <= commits[static_cast<size_t>(r)]; ++c) {
      v = r * 100 + c;
      w.assign(static_cast<size_t>(c), r);
      st.commit();
    }
    v = 777;  // uncommitted progress, the root's included, is dropped by sync
    w.push_back(-1);
    ctx.attach(shared, r);
    st.sync();
    value[static_cast<size_t>(r)] = v;
    vec[static_cast<size_t>(r)] = w;
    ids[static_cast<size_t>(r)] = st.commit_id();
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(value[static_cast<size_t>(r)], 105) << "rank " << r;
    EXPECT_EQ(vec[static_cast<size_t>(r)], std::vector<int>(5, 1)) << "rank " << r;
    EXPECT_EQ(ids[static_cast<size_t>(r)], 5u) << "rank " << r;
  }
}

TEST(StateSync, FreshJobStartsFromRankZeroAndKeepsItAsBaseline) {
  FakeHub hub(3);
  std::vector<int> after_sync(3), after_restore(3);
  std::vector<uint64_t> ids(3);
  run_threads(3, [&](int r) {
    FakeContext ctx(hub, r);
    State st(ctx);
    int v = 1000 + r;
    std::string s(static_cast<size_t>(r), 'a');
    st.register_value("v", &v);
    st.register_string("s", &s);
    st.sync();
    after_sync[static_cast<size_t>(r)] = v;
    EXPECT_EQ(s, "");
    v = 5;
    s = "changed";
    st.restore();
    after_restore[static_cast<size_t>(r)] = v;
    EXPECT_EQ(s, "");
    ids[static_cast<size_t>(r)] = st.commit_id();
  });
  EXPECT_EQ(after_sync, std::vector<int>(3, 1000));
  EXPECT_EQ(after_restore, std::vector<int>(3, 1000));
  EXPECT_EQ(ids, std::vector<uint64_t>(3, 0));
}

TEST(StateSync, MismatchedRegistrationsAreAClearError) {
  FakeHub hub(2);
  std::vector<std::string> errors(2);
  run_threads(2, [&](int r) {
    FakeContext ctx(hub, r);
    State st(ctx);
    int32_t small = 1;
    int64_t big = 2;
    if (r == 0) {
      st.register_value("x", &small);
    } else {
      st.register_value("x", &big);
    }
    try {
      st.sync();
    } catch (const Error& e) {
      errors[static_cast<size_t>(r)] = e.what();
    }
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_NE(errors[1].find("'x'"), std::string::npos) << errors[1];
  EXPECT_NE(errors[1].find("4 bytes"), std::string::npos) << errors[1];

  FakeHub hub2(2);
  run_threads(2, [&](int r) {
    FakeContext ctx(hub2, r);
    State st(ctx);
    int a = 1;
    st.register_value(r == 0 ? "alpha" : "beta", &a);
    try {
      st.sync();
      EXPECT_EQ(r, 0);
    } catch (const Error& e) {
      EXPECT_EQ(r, 1);
      EXPECT_NE(std::string(e.what()).find("'alpha'"), std::string::npos) << e.what();
    }
  });
}

TEST(StateSync, HostUpdateSeenByOneRankRaisesOnAllAtTheSameStep) {
  FakeHub hub(3);
  std::vector<int> raised_at(3, -1);
  std::vector<uint64_t> ids(3);
  run_threads(3, [&](int r) {
    FakeContext ctx(hub, r);
    State st(ctx);
    int step = 0;
    st.register_value("step", &step);
    st.sync();
    for (; step < 10; ++step) {
      // Rank 1 alone learns of the update, late in its step 4.
      if (r == 1 && step == 4) hub.set_host_update(1);
      try {
        st.commit();
      } catch (const HostsUpdated&) {
        raised_at[static_cast<size_t>(r)] = step;
        break;
      }
    }
    ids[static_cast<size_t>(r)] = st.commit_id();
  });
  EXPECT_EQ(raised_at, std::vector<int>(3, 4));
  EXPECT_EQ(ids, std::vector<uint64_t>(3, 5));
}

// A program that checks for updates between commits (every step, commits
// every 4): a plain update there leaves at once, with the steps since the
// last commit rolled back; a host that drains makes that check commit first,
// so nothing is lost. Every rank commits together, and the id says so.
TEST(StateSync, ADrainSeenBetweenCommitsCommitsFirstAPlainUpdateDoesNot) {
  for (bool drain : {false, true}) {
    FakeHub hub(3);
    std::vector<int> raised_at(3, -1);
    std::vector<uint64_t> ids(3);
    std::vector<int> kept(3, -1);
    run_threads(3, [&](int r) {
      FakeContext ctx(hub, r);
      State st(ctx);
      int step = 0;
      st.register_value("step", &step);
      st.sync();
      for (; step < 20;) {
        if (r == 2 && step == 6) hub.set_host_update(2, drain);
        ++step;
        try {
          if (step % 4 == 0) {
            st.commit();
          } else {
            st.check_host_updates();
          }
        } catch (const HostsUpdated&) {
          raised_at[static_cast<size_t>(r)] = step;
          break;
        }
      }
      ids[static_cast<size_t>(r)] = st.commit_id();
      st.restore();  // what a re-join resumes from
      kept[static_cast<size_t>(r)] = step;
    });
    // Rank 2 sees it in step 7 (after its step 6), the others with it.
    EXPECT_EQ(raised_at, std::vector<int>(3, 7)) << "drain " << drain;
    // Commits at steps 4 (id 1), then with a drain at step 7 (id 2).
    EXPECT_EQ(ids, std::vector<uint64_t>(3, drain ? 2u : 1u)) << "drain " << drain;
    EXPECT_EQ(kept, std::vector<int>(3, drain ? 7 : 4)) << "drain " << drain;
  }
}

// A training loop in the shape erun::run() expects, with a replicated
// accumulator: every step adds the sum over ranks of (rank+1)*step.
struct Trainer {
  int64_t step = 0;
  int64_t acc = 0;
  int entries = 0;                // how many times fn started
  std::vector<int64_t> started_at;
  std::vector<std::pair<int, int>> resets;

  void attach(State& st) {
    st.register_value("step", &step);
    st.register_value("acc", &acc);
    st.on_reset([this](int o, int n) { resets.emplace_back(o, n); });
  }
  void run(State& st, int64_t steps, const std::function<void(int64_t)>& before_step = {}) {
    erun::run(st, [&](State& s) {
      ++entries;
      started_at.push_back(step);
      Communicator& comm = s.context().comm();
      while (step < steps) {
        if (before_step) before_step(step);
        acc += 1000000;  // uncommitted garbage that a restore must undo
        int64_t contrib = (s.context().rank() + 1) * step;
        acc -= 1000000;
        acc += comm.allreduce_value<int64_t>(contrib, ReduceOp::kSum);
        ++step;
        s.commit();
      }
    });
  }
};

TEST(StateRun, CommErrorRestoresRejoinsAndRunsFromTheLastCommit) {
  FakeHub hub(3);
  // Ops of slot 2: sync = 3 (allgather, 2 broadcasts), then 2 per step
  // (allreduce, host-update check). Op 11 is the allreduce of step 4.
  hub.fail_at(2, 3 + 2 * 4);
  std::vector<Trainer> t(3);
  std::vector<uint64_t> ids(3);
  run_threads(3, [&](int r) {
    FakeContext ctx(hub, r);
    State st(ctx);
    t[static_cast<size_t>(r)].attach(st);
    t[static_cast<size_t>(r)].run(st, 10);
    ids[static_cast<size_t>(r)] = st.commit_id();
  });
  int64_t want = 0;
  for (int64_t s = 0; s < 10; ++s) want += (1 + 2 + 3) * s;
  for (int r = 0; r < 3; ++r) {
    const Trainer& tr = t[static_cast<size_t>(r)];
    EXPECT_EQ(tr.step, 10);
    EXPECT_EQ(tr.acc, want) << "rank " << r;
    EXPECT_EQ(tr.entries, 2) << "rank " << r;
    EXPECT_EQ(tr.started_at, (std::vector<int64_t>{0, 4})) << "rank " << r;
    EXPECT_EQ(tr.resets, (std::vector<std::pair<int, int>>{{3, 3}})) << "rank " << r;
    EXPECT_EQ(ids[static_cast<size_t>(r)], 10u);
    EXPECT_EQ(hub.last_commit(r), 4u);  // told the driver its last commit on re-join
  }
  EXPECT_EQ(hub.generation(), 2);
}

struct Died {};

TEST(StateRun, ARankDiesAndTheOthersGoOnSmaller) {
  FakeHub hub(3);
  std::vector<Trainer> t(3);
  run_threads(3, [&](int r) {
    FakeContext ctx(hub, r);
    State st(ctx);
    t[static_cast<size_t>(r)].attach(st);
    try {
      t[static_cast<size_t>(r)].run(st, 8, [&](int64_t step) {
        if (r == 2 && step == 3) {
          hub.kill(2);
          throw Died{};
        }
      });
    } catch (const Died&) {
    }
  });
  for (int r = 0; r < 2; ++r) {
    const Trainer& tr = t[static_cast<size_t>(r)];
    EXPECT_EQ(tr.step, 8);
    EXPECT_EQ(tr.started_at, (std::vector<int64_t>{0, 3}));
    EXPECT_EQ(tr.resets, (std::vector<std::pair<int, int>>{{3, 2}}));
  }
  int64_t want = 0;
  for (int64_t s = 0; s < 3; ++s) want += 6 * s;
  for (int64_t s = 3; s < 8; ++s) want += 3 * s;
  EXPECT_EQ(t[0].acc, want);
  EXPECT_EQ(t[1].acc, want);
  EXPECT_EQ(hub.size(), 2);
}

TEST(StateRun, HostsUpdatedRejoinsWithoutRestoreAndANewRankGetsTheState) {
  FakeHub hub(2);
  const int newcomer = hub.add_slot();
  std::vector<Trainer> t(3);
  std::vector<uint64_t> ids(3);
  run_threads(3, [&](int slot) {
    FakeContext ctx(hub, slot);
    State st(ctx);
    Trainer& tr = t[static_cast<size_t>(slot)];
    tr.attach(st);
    if (slot == newcomer) ctx.rejoin(0);  // what init() does for a new worker
    tr.run(st, 8, [&](int64_t step) {
      if (slot == 0 && step == 3) hub.set_host_update(0);
    });
    ids[static_cast<size_t>(slot)] = st.commit_id();
  });
  // Steps 0..3 ran with 2 ranks (the update is seen at the commit of step 3),
  // 4..7 with 3.
  int64_t want = 0;
  for (int64_t s = 0; s < 4; ++s) want += 3 * s;
  for (int64_t s = 4; s < 8; ++s) want += 6 * s;
  for (int slot = 0; slot < 3; ++slot) {
    EXPECT_EQ(t[static_cast<size_t>(slot)].acc, want) << "slot " << slot;
    EXPECT_EQ(ids[static_cast<size_t>(slot)], 8u) << "slot " << slot;
  }
  EXPECT_EQ(t[0].started_at, (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(t[0].resets, (std::vector<std::pair<int, int>>{{2, 3}}));
  EXPECT_EQ(t[2].started_at, (std::vector<int64_t>{4}));
}

// End to end with the sampler: a replicated per-sample counter, resizes and a
// failure in between; at the end every sample of the epoch was counted once.
TEST(StateRun, SamplerCountsEverySampleOnceAcrossFailureAndShrink) {
  const size_t n = 1000, batch = 24;
  FakeHub hub(4);
  hub.fail_at(1, 3 + 2 * 5 + 1);  // the host-update check of step 5
  std::vector<std::vector<int32_t>> counts(4);
  run_threads(4, [&](int r) {
    FakeContext ctx(hub, r);
    State st(ctx);
    ElasticSampler sampler(n, /*seed=*/7);
    sampler.register_with(st);
    sampler.reset(ctx.rank(), ctx.size());
    std::vector<int32_t> seen(n, 0);
    int64_t step = 0;
    st.register_vector("seen", &seen);
    st.register_value("step", &step);
    st.on_reset([&](int, int) { sampler.reset(ctx.rank(), ctx.size()); });
    try {
      erun::run(st, [&](State& s) {
        while (sampler.remaining() > 0) {
          if (r == 3 && step == 9) {
            hub.kill(3);
            throw Died{};
          }
          std::vector<int32_t> inc(n, 0);
          for (size_t i : sampler.next_batch(batch)) ++inc[i];
          s.context().comm().allreduce(inc, ReduceOp::kSum);
          for (size_t i = 0; i < n; ++i) seen[i] += inc[i];
          sampler.record_batch(batch);
          ++step;
          s.commit();
        }
      });
    } catch (const Died&) {
      return;
    }
    counts[static_cast<size_t>(r)] = seen;
  });
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(counts[static_cast<size_t>(r)].size(), n);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(counts[static_cast<size_t>(r)][i], 1) << "sample " << i << " on rank " << r;
    }
  }
}

}  // namespace
}  // namespace erun
