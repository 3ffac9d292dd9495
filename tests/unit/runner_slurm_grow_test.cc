// SlurmGrow's decisions over a fake Slurm (the commands it would run and
// what squeue answers): how many placeholders it keeps, which nodes join,
// a requeued placeholder made eligible at once, surplus and end cancelled.
// The real Slurm run is tests/integration/slurm_test.cc.
#include <gtest/gtest.h>

#include <algorithm>

#include "common/strings.h"
#include "runner/hosts/slurm_grow.h"

namespace erun {
namespace {

class SlurmGrowTest : public ::testing::Test {
 protected:
  std::unique_ptr<SlurmGrow> make(int slots = 2) {
    return std::make_unique<SlurmGrow>(SlurmGrow::Options{"spare", "41", slots}, [this](const std::vector<std::string>& a) {
      ran.push_back(join(a, " "));
      if (a[0] == "squeue") {
        if (squeue_fails) return Result<std::string>::error("squeue: slurmctld unreachable");
        return Result<std::string>(squeue);
      }
      if (a[0] == "sbatch") {
        if (sbatch_fails) return Result<std::string>::error("sbatch: invalid partition specified: spare");
        return Result<std::string>(std::to_string(next_id++) + "\n");
      }
      return Result<std::string>(std::string());
    });
  }
  int count(const std::string& prefix) const {
    return static_cast<int>(std::count_if(ran.begin(), ran.end(), [&](const std::string& r) { return starts_with(r, prefix); }));
  }
  std::vector<std::string> ran;
  std::string squeue;
  bool squeue_fails = false, sbatch_fails = false;
  int next_id = 100;
};

TEST_F(SlurmGrowTest, KeepsAsManyPlaceholdersAsWantedAndOnlyRunningOnesLendANode) {
  auto g = make();
  g->tick(2);
  ASSERT_EQ(count("sbatch"), 2);
  const std::string& submit = ran[1];
  for (const char* w : {"--parsable", "--partition=spare", "--nodes=1", "--exclusive", "--requeue",
                        "--job-name=erun-grow-41", "squeue -h -o %i -j 41"}) {
    EXPECT_NE(submit.find(w), std::string::npos) << w << " not in: " << submit;
  }
  EXPECT_TRUE(g->hosts().empty());
  ran.clear();
  squeue = "100|RUNNING|n3|None\n101|PENDING||Resources\n";
  g->tick(2);
  EXPECT_EQ(count("sbatch"), 0) << "two placeholders live";
  EXPECT_EQ(g->hosts().to_string(), "n3:2");
  EXPECT_EQ(g->job_of("n3"), "100");
  EXPECT_EQ(g->job_of("n4"), "");
  // The running one ends (preempted and cancelled, or its node failed): another is submitted.
  ran.clear();
  squeue = "100|COMPLETING|n3|None\n101|PENDING||Resources\n";
  g->tick(2);
  EXPECT_EQ(count("sbatch"), 1);
  EXPECT_TRUE(g->hosts().empty());
  EXPECT_EQ(g->job_of("n3"), "");
}

TEST_F(SlurmGrowTest, ARequeuedPlaceholderIsMadeEligibleAtOnce) {
  auto g = make();
  squeue = "7|PENDING||BeginTime\n";
  g->tick(1);
  EXPECT_EQ(count("scontrol update JobId=7 StartTime=now"), 1);
  EXPECT_EQ(count("sbatch"), 0);
  EXPECT_TRUE(g->hosts().empty());
}

TEST_F(SlurmGrowTest, PendingPlaceholdersBeyondTheWantedAreCancelledRunningOnesStay) {
  auto g = make();
  squeue = "7|RUNNING|n3|None\n8|PENDING||Resources\n9|PENDING||Priority\n";
  g->tick(1);
  EXPECT_EQ(count("scancel 8"), 1);
  EXPECT_EQ(count("scancel 9"), 1);
  EXPECT_EQ(count("scancel 7"), 0);
  EXPECT_EQ(g->hosts().to_string(), "n3:2");
}

TEST_F(SlurmGrowTest, CancelAllOnceByNameAtTheEnd) {
  auto g = make();
  g->tick(1);
  g->cancel_all();
  EXPECT_EQ(count("scancel --name=erun-grow-41"), 1);
  g->tick(1);
  EXPECT_EQ(count("sbatch"), 1) << "nothing is submitted after the end";
  g.reset();
  EXPECT_EQ(count("scancel --name=erun-grow-41"), 1) << "the destructor cancels only once";
}

TEST_F(SlurmGrowTest, SlurmFailingKeepsTheJobsNodesAndSubmitsNothing) {
  auto g = make();
  squeue = "7|RUNNING|n3|None\n";
  g->tick(1);
  squeue_fails = true;
  g->tick(1);
  EXPECT_EQ(g->hosts().to_string(), "n3:2") << "an unanswered squeue takes no node away";
  squeue_fails = false;
  squeue = "";
  sbatch_fails = true;
  g->tick(1);  // logs the partition's trouble; no throw, no loop
  EXPECT_EQ(count("sbatch"), 1);
  g->tick(1);
  EXPECT_EQ(count("sbatch"), 1) << "a failed submission is not repeated at the next tick";
}

TEST_F(SlurmGrowTest, DiscoveryWantsTheRoomMaxNpLeavesAndAddsRunningNodes) {
  auto g = std::shared_ptr<SlurmGrow>(make(1));
  auto base = std::make_unique<StaticDiscovery>(HostSet({{"n1", 1}, {"n2", 1}}));
  SlurmGrowDiscovery d(std::move(base), g, /*max_np=*/4, /*slots_per_node=*/1);
  auto hs = d.discover();
  ASSERT_TRUE(hs);
  EXPECT_EQ(hs->to_string(), "n1:1,n2:1");
  EXPECT_EQ(count("sbatch"), 2) << "room for 2 more nodes of 1 slot";
  squeue = "100|RUNNING|n3|None\n101|PENDING||Resources\n";
  hs = d.discover();
  ASSERT_TRUE(hs);
  EXPECT_EQ(hs->to_string(), "n1:1,n2:1,n3:1");
  EXPECT_EQ(count("sbatch"), 2);
}

}  // namespace
}  // namespace erun
