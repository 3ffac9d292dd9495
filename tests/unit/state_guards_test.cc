// Guards against silent mistakes in the State: reset callbacks run after
// sync() on every rank of the new generation (a value they set survives, a
// worker new to the job gets them too, old_size is the size of the synced
// commit), and ranks at different commit ids at commit() get a
// CollectiveMismatch naming them, which erun::run() does not retry.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <vector>

#include "erun/erun.hpp"
#include "state_fake_world.h"

namespace erun {
namespace {

using testing::FakeContext;
using testing::FakeHub;
using testing::run_threads;

struct Died {};

// The learning-rate example of docs/state.md: lr is registered (a schedule
// changes it) and rescaled with the world size in a reset callback.
struct LrTrainer {
  int64_t step = 0;
  double lr = 0;
  std::vector<std::pair<int, int>> resets;
  std::vector<double> lr_at_start;  // lr when fn (re)started

  void attach(State& st, int size) {
    lr = 0.1 * size;
    st.register_value("step", &step);
    st.register_value("lr", &lr);
    st.on_reset([this](int old_size, int new_size) {
      resets.emplace_back(old_size, new_size);
      lr = lr * new_size / old_size;
    });
  }
  void run(State& st, int64_t steps, const std::function<void(int64_t)>& before_step = {}) {
    erun::run(st, [&](State& s) {
      lr_at_start.push_back(lr);
      while (step < steps) {
        if (before_step) before_step(step);
        s.context().comm().allreduce_value<int64_t>(step, ReduceOp::kMax);
        lr *= 0.5;  // a schedule
        ++step;
        s.commit();
      }
    });
  }
};

TEST(StateGuards, ResetCallbackRunsAfterSyncAndOnAWorkerNewToTheJob) {
  FakeHub hub(2);
  const int newcomer = hub.add_slot();
  std::vector<LrTrainer> t(3);
  run_threads(3, [&](int slot) {
    FakeContext ctx(hub, slot);
    State st(ctx);
    LrTrainer& tr = t[static_cast<size_t>(slot)];
    tr.attach(st, slot == newcomer ? 99 : 2);  // the newcomer's own value is replaced by the synced one
    if (slot == newcomer) ctx.rejoin(0);
    tr.run(st, 6, [&](int64_t step) {
      if (slot == 0 && step == 3) hub.set_host_update(0);
    });
  });
  // Committed at step 4 (the update is seen at the commit of step 3) with
  // 2 ranks: lr = 0.2 / 2^4; the callback makes it 3/2 of that on every rank.
  const double at_join = 0.2 / 16 * 3 / 2;
  for (int slot = 0; slot < 3; ++slot) {
    const LrTrainer& tr = t[static_cast<size_t>(slot)];
    EXPECT_EQ(tr.resets, (std::vector<std::pair<int, int>>{{2, 3}})) << "slot " << slot;
    ASSERT_FALSE(tr.lr_at_start.empty());
    EXPECT_DOUBLE_EQ(tr.lr_at_start.back(), at_join) << "slot " << slot;
    EXPECT_DOUBLE_EQ(tr.lr, at_join / 4) << "slot " << slot;
  }
}

TEST(StateGuards, OldSizeIsTheSizeOfTheSyncedCommitAcrossTwoFailures) {
  FakeHub hub(4);
  std::vector<LrTrainer> t(4);
  run_threads(4, [&](int slot) {
    FakeContext ctx(hub, slot);
    State st(ctx);
    LrTrainer& tr = t[static_cast<size_t>(slot)];
    tr.attach(st, 4);
    try {
      tr.run(st, 6, [&](int64_t step) {
        // Slot 3 dies in generation 1, slot 2 in generation 2 before anyone
        // committed there: generation 3 restarts from the commit taken with 4.
        if ((slot == 3 && hub.generation() == 1 && step == 2) || (slot == 2 && hub.generation() == 2)) {
          hub.kill(slot);
          throw Died{};
        }
      });
    } catch (const Died&) {
    }
  });
  for (int slot = 0; slot < 2; ++slot) {
    const LrTrainer& tr = t[static_cast<size_t>(slot)];
    EXPECT_EQ(tr.resets, (std::vector<std::pair<int, int>>{{4, 3}, {4, 2}})) << "slot " << slot;
    // lr committed at step 2 with 4 ranks: 0.4 / 4, rescaled to 2 ranks.
    EXPECT_DOUBLE_EQ(tr.lr_at_start.back(), 0.4 / 4 * 2 / 4) << "slot " << slot;
  }
  EXPECT_EQ(hub.size(), 2);
}

// The classic mistake: a step counter that decides when to commit but is not
// registered. A worker that joins starts it from 0 and commits at other steps
// than the others; its commit() meets their check_host_updates() (the same
// collective), so only the commit id shows it.
void train_with_step_counter(bool register_step, std::vector<std::string>* errors, FakeHub& hub, int newcomer) {
  std::atomic<bool> updated{false};
  run_threads(3, [&](int slot) {
    FakeContext ctx(hub, slot);
    State st(ctx);
    int64_t step = 0;
    std::vector<int64_t> w(4, 0);
    st.register_vector("w", &w);
    if (register_step) st.register_value("step", &step);
    if (slot == newcomer) ctx.rejoin(0);
    try {
      erun::run(st, [&](State& s) {
        for (; step < 12; ++step) {
          if (slot == 0 && step == 3 && !updated.exchange(true)) hub.set_host_update(0);
          std::vector<int64_t> g(4, step);
          s.context().comm().allreduce(g, ReduceOp::kSum);
          for (size_t i = 0; i < w.size(); ++i) w[i] += g[i];
          if (step % 5 == 0) {
            s.commit();
          } else {
            s.check_host_updates();
          }
        }
      });
    } catch (const CollectiveMismatch& e) {
      (*errors)[static_cast<size_t>(slot)] = e.what();
    }
  });
}

TEST(StateGuards, RanksAtDifferentCommitIdsGetAnErrorNamingThemAndNoRetry) {
  FakeHub hub(2);
  const int newcomer = hub.add_slot();
  std::vector<std::string> errors(3);
  train_with_step_counter(/*register_step=*/false, &errors, hub, newcomer);
  for (int slot = 0; slot < 3; ++slot) {
    const std::string& msg = errors[static_cast<size_t>(slot)];
    EXPECT_NE(msg.find("disagree on the commit id"), std::string::npos) << "slot " << slot << ": " << msg;
    // Survivors committed at step 0 (id 1); the newcomer's step 0 commit made its id 2.
    EXPECT_NE(msg.find("ranks 0, 1 at commit 1; rank 2 at commit 2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("registered in the State"), std::string::npos) << msg;
  }
  // Not retried: the only re-join was the host update's.
  EXPECT_EQ(hub.rejoins(0), 1);
  EXPECT_EQ(hub.rejoins(1), 1);
  EXPECT_EQ(hub.generation(), 2);
}

TEST(StateGuards, TheSameLoopWithTheStepRegisteredRunsThrough) {
  FakeHub hub(2);
  const int newcomer = hub.add_slot();
  std::vector<std::string> errors(3);
  train_with_step_counter(/*register_step=*/true, &errors, hub, newcomer);
  EXPECT_EQ(errors, std::vector<std::string>(3));
}

}  // namespace
}  // namespace erun
