// Sharded state end to end: examples/train_mlp --zero (each rank keeps its
// rows of the momentum, a sharded State entry) under the real erun binary
// on simulated hosts, each with its own host-memory commit directory. A
// worker is SIGKILLed and replaced, a host is added, a host's slots shrink:
// at each new world erun reshards the momentum from the pieces the hosts
// hold (the dead worker's file included), and the run ends at the model of
// an uninterrupted run without --zero, bit for bit, with every sample of
// every epoch processed once and nothing written to disk.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <regex>
#include <set>
#include <thread>

#include "support/erun_process.h"
#include "support/process_utils.h"

namespace erun::testing {
namespace {

using namespace std::chrono_literals;

class ErunSharded : public ::testing::Test {
 protected:
  void SetUp() override {
    program_ = build_path("examples/train_mlp");
    dir_.write("discover.sh", "#!/bin/sh\ncat " + dir_.file("hosts") + "\n", true);
  }
  std::vector<std::string> erun_args(std::vector<std::string> extra) {
    std::vector<std::string> a = {"--host-discovery-script", dir_.file("discover.sh"), "--discovery-interval", "0.2",
                                  "--event-log", dir_.file("events.jsonl"), "--term-grace", "2"};
    a.insert(a.end(), extra.begin(), extra.end());
    a.push_back(program_);
    a.insert(a.end(), kTrainMlpArgs.begin(), kTrainMlpArgs.end());
    a.push_back("--zero");
    return a;
  }
  // A sharded commit is whole only once every rank committed its piece: a
  // rank killed between the others' commit and its own takes that commit
  // with it, and the job goes on from the one before (a commit interval of
  // 5 steps of 40 ms back). Right after an epoch's line, the commit before
  // that line may be the one to go, and the epoch would end twice. A kill
  // 10 steps after the line (the ranks step together) lands after the
  // first commit past it.
  static void after_the_epochs_commit() { std::this_thread::sleep_for(std::chrono::milliseconds(400)); }
  static bool wait_count(const ErunProcess& p, const std::string& text, size_t n, Duration timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (p.count(text) >= n) return true;
      std::this_thread::sleep_for(20ms);
    }
    return false;
  }
  std::vector<pid_t> workers(const std::string& host) {
    std::vector<pid_t> out;
    for (pid_t pid : pids_with_cmdline(program_)) {
      if (read_file("/proc/" + std::to_string(pid) + "/cmdline").rfind(program_ + std::string(1, '\0'), 0) != 0) {
        continue;
      }
      if (environ_of(pid).find("\nERUN_HOSTNAME=" + host + "\n") != std::string::npos) out.push_back(pid);
    }
    return out;
  }
  std::string program_;
  TempDir dir_;
};

TEST_F(ErunSharded, ZeroMomentumIsReshardedThroughAKillAGrowAndAShrinkAndEndsExact) {
  const std::string reference = uninterrupted_checksum();
  ASSERT_FALSE(reference.empty());
  dir_.write("hosts", "node-a:2\nnode-b:2\n");
  ErunProcess p(erun_args({"-np", "4", "--min-np", "2", "--max-np", "5", "--launcher", "local"}));
  ASSERT_TRUE(p.wait_output("epoch 0 ", 60s)) << p.out() << p.err();

  // A worker of node-b dies: its rows of the momentum are read from its
  // host-memory file, on node-b, by the ranks of the next world.
  auto victims = workers("node-b");
  ASSERT_EQ(victims.size(), 2u);
  const size_t resharded = p.count("resharded commit");
  after_the_epochs_commit();
  ::kill(victims.front(), SIGKILL);
  ASSERT_TRUE(wait_count(p, "resharded commit", resharded + 1, 60s)) << p.out() << p.err();
  ASSERT_TRUE(wait_count(p, "-> 4 (generation", 4, 60s)) << p.out() << p.err();  // the replacement is in

  dir_.write("hosts", "node-a:2\nnode-b:2\nnode-c:1\n");  // a host joins: 5 ranks
  ASSERT_TRUE(p.wait_output("world size 4 -> 5", 60s)) << p.out() << p.err();

  dir_.write("hosts", "node-a:2\nnode-b:1\nnode-c:1\n");  // node-b's slots shrink: 4 ranks
  ASSERT_TRUE(p.wait_output("world size 5 -> 4", 60s)) << p.out() << p.err();

  ASSERT_NO_FATAL_FAILURE(expect_trained_exactly(p, reference));
  EXPECT_EQ(p.count("exactly-once=yes"), 10u) << p.out();
  EXPECT_NE(p.out().find("zero=1"), std::string::npos) << p.out();
  // Rows moved between hosts over the shard servers at least once.
  const std::string all = p.out() + p.err();
  EXPECT_TRUE(std::regex_search(all, std::regex("resharded commit [0-9]+ for [0-9]+ ranks \\([1-9][0-9]* bytes from other hosts, ")))
      << all;
  EXPECT_EQ(all.find("cannot be put back together"), std::string::npos) << all;
  std::vector<pid_t> left;
  EXPECT_TRUE(wait_no_process(program_, 20s, &left)) << describe_pids(left);
  // Nothing on disk: the test's directory holds what it held.
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir_.path())) files += e.is_regular_file();
  EXPECT_EQ(files, 3u);  // discover.sh, hosts, events.jsonl
}

// Hosts node-a:2, node-b:1, node-c:1, each buddy to the next, around.
// node-c leaves discovery (its worker commits and leaves; its rows are on
// node-a, its buddy), then node-b is lost whole (its agent and its worker
// SIGKILLed: its memory goes with them; its rows are on node-a too). The
// job goes on in place at 3, then 2 ranks, and ends exact.
TEST_F(ErunSharded, AHostThatLeavesAndAHostLostWholeComeBackFromBuddyCopies) {
  const std::string reference = uninterrupted_checksum();
  ASSERT_FALSE(reference.empty());
  dir_.write("hosts", "node-a:2\nnode-b:1\nnode-c:1\n");
  ErunProcess p(erun_args({"-np", "4", "--min-np", "2", "--launcher", "local", "--blacklist-after", "1",
                           "--blacklist-cooldown-range", "600", "600"}));
  ASSERT_TRUE(p.wait_output("epoch 0 ", 60s)) << p.out() << p.err();
  dir_.write("hosts", "node-a:2\nnode-b:1\n");
  ASSERT_TRUE(p.wait_output("world size 4 -> 3", 60s)) << p.out() << p.err();
  ASSERT_TRUE(p.wait_output("epoch 3 ", 60s)) << p.out() << p.err();

  auto on_b = workers("node-b");
  ASSERT_EQ(on_b.size(), 1u);
  const pid_t agent = parent_of(on_b.front());
  ASSERT_GT(agent, 0);
  after_the_epochs_commit();
  dir_.write("hosts", "node-a:2\n");
  ::kill(agent, SIGKILL);
  ::kill(on_b.front(), SIGKILL);
  ASSERT_TRUE(p.wait_output("-> 2 (generation", 60s)) << p.out() << p.err();

  ASSERT_NO_FATAL_FAILURE(expect_trained_exactly(p, reference));
  EXPECT_EQ(p.count("exactly-once=yes"), 10u) << p.out();
  const std::string all = p.out() + p.err();
  EXPECT_EQ(all.find("cannot be put back together"), std::string::npos) << all;
  // At 2 ranks every living rank is on node-a: node-b's rows came from the
  // buddy files there, read locally.
  EXPECT_TRUE(std::regex_search(all, std::regex("resharded commit [0-9]+ for 2 ranks \\(0 bytes from other hosts, ")))
      << all;
  std::vector<pid_t> left;
  EXPECT_TRUE(wait_no_process(program_, 20s, &left)) << describe_pids(left);
}

// A one-host job (-np 2, --max-np 2) with a spare host in discovery. One
// host has no buddy: the spare's keeper holds each worker file's newest
// commit in a pair of its own (replica-of-<stem>). The host is then lost
// whole (its agent and workers SIGKILLed as it leaves discovery): the
// spare's standbys take the members' places, their sync reads every row
// from the replicas on their own host, and the run ends exact, every epoch
// once. (Before, the spare kept one worker's file: half the rows.)
TEST_F(ErunSharded, TheOnlyHostLostWholeResumesOnTheSpareFromEachWorkersReplica) {
  const std::string reference = uninterrupted_checksum();
  ASSERT_FALSE(reference.empty());
  dir_.write("hosts", "node-a:2\nnode-b:2\n");
  ErunProcess p(erun_args({"-np", "2", "--min-np", "2", "--max-np", "2", "--launcher", "local", "--blacklist-after",
                           "1", "--blacklist-cooldown-range", "600", "600"}));
  ASSERT_TRUE(p.wait_output("epoch 1 ", 60s)) << p.out() << p.err();
  ASSERT_TRUE(p.wait_output("commit replicas on spare hosts: node-b from node-a", 30s)) << p.err();
  auto on_a = workers("node-a");
  ASSERT_EQ(on_a.size(), 2u);
  const std::string env = environ_of(on_a.front());
  const size_t at = env.find("\nERUN_COMMIT_DIR=");
  ASSERT_NE(at, std::string::npos) << env;
  const size_t from = at + std::string("\nERUN_COMMIT_DIR=").size();
  const std::string dir_a = env.substr(from, env.find('\n', from) - from);
  ASSERT_EQ(dir_a.substr(dir_a.size() - 6), "node-a") << dir_a;
  const std::string dir_b = dir_a.substr(0, dir_a.size() - 6) + "node-b";
  // A replica pair per worker on the spare.
  auto replicas = [&] {
    std::set<std::string> stems;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir_b, ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("replica-of-", 0) == 0) stems.insert(name.substr(0, name.size() - 2));
    }
    return stems.size();
  };
  auto deadline = std::chrono::steady_clock::now() + 30s;
  while (replicas() < 2 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(50ms);
  ASSERT_EQ(replicas(), 2u) << "no replica of each worker's file in " << dir_b << "\n" << p.err();

  const pid_t agent = parent_of(on_a.front());
  ASSERT_GT(agent, 0);
  after_the_epochs_commit();
  dir_.write("hosts", "node-b:2\n");
  ::kill(agent, SIGKILL);
  for (pid_t w : on_a) ::kill(w, SIGKILL);

  ASSERT_NO_FATAL_FAILURE(expect_trained_exactly(p, reference));
  EXPECT_EQ(p.count("exactly-once=yes"), 10u) << p.out();
  const std::string all = p.out() + p.err();
  EXPECT_EQ(all.find("cannot be put back together"), std::string::npos) << all;
  EXPECT_TRUE(std::regex_search(all, std::regex("resharded commit [0-9]+ for 2 ranks \\(0 bytes from other hosts, ")))
      << all;
  std::vector<pid_t> left;
  EXPECT_TRUE(wait_no_process(program_, 20s, &left)) << describe_pids(left);
}

// --commit-replicas 0: no host keeps another's pieces. No buddy file is
// ever written, a worker's death is still recovered in place from its
// host's memory, and a host lost whole ends the job with an error that
// names the rows lost and the flag (never training on a hole).
TEST_F(ErunSharded, WithoutCommitReplicasAHostLostWholeEndsTheJobNamingItsRows) {
  dir_.write("hosts", "node-a:2\nnode-b:1\n");
  ErunProcess p(erun_args({"-np", "3", "--min-np", "1", "--launcher", "local", "--commit-replicas", "0",
                           "--blacklist-after", "1", "--blacklist-cooldown-range", "600", "600"}));
  ASSERT_TRUE(p.wait_output("epoch 1 ", 60s)) << p.out() << p.err();
  auto on_a = workers("node-a");
  auto on_b = workers("node-b");
  ASSERT_EQ(on_a.size(), 2u);
  ASSERT_EQ(on_b.size(), 1u);
  std::vector<std::string> dirs;
  for (pid_t pid : {on_a.front(), on_b.front()}) {
    const std::string env = environ_of(pid);
    EXPECT_NE(env.find("\nERUN_COMMIT_REPLICAS=0\n"), std::string::npos) << env;
    const size_t at = env.find("\nERUN_COMMIT_DIR=");
    ASSERT_NE(at, std::string::npos) << env;
    const size_t from = at + std::string("\nERUN_COMMIT_DIR=").size();
    dirs.push_back(env.substr(from, env.find('\n', from) - from));
  }

  // A worker of node-a dies: its rows come back from its file on node-a.
  const size_t resharded = p.count("resharded commit");
  after_the_epochs_commit();
  ::kill(on_a.front(), SIGKILL);
  ASSERT_TRUE(wait_count(p, "resharded commit", resharded + 1, 60s)) << p.out() << p.err();
  ASSERT_TRUE(p.wait_output("epoch 3 ", 60s)) << p.out() << p.err();
  // Every commit so far stayed on its own host.
  for (const std::string& d : dirs) {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(d, ec)) {
      EXPECT_NE(e.path().filename().string().rfind("buddy-", 0), 0u) << e.path();
    }
    EXPECT_FALSE(ec) << d << ": " << ec.message();
  }

  // node-b lost whole: its rows were nowhere else.
  on_b = workers("node-b");
  ASSERT_EQ(on_b.size(), 1u);
  const pid_t agent = parent_of(on_b.front());
  ASSERT_GT(agent, 0);
  dir_.write("hosts", "node-a:2\n");
  ::kill(agent, SIGKILL);
  ::kill(on_b.front(), SIGKILL);
  auto s = p.wait(120s);
  ASSERT_TRUE(s) << p.out() << p.err();
  EXPECT_NE(s->shell_code(), 0) << p.out() << p.err();
  const std::string all = p.out() + p.err();
  EXPECT_TRUE(std::regex_search(all, std::regex("cannot be put back together: no living host holds [^;]*rows")))
      << all;
  EXPECT_NE(all.find("with --commit-replicas 0 no other host keeps a copy"), std::string::npos) << all;
  EXPECT_EQ(all.find("final checksum"), std::string::npos) << all;  // no training on a hole
  std::vector<pid_t> left;
  EXPECT_TRUE(wait_no_process(program_, 20s, &left)) << describe_pids(left);
}

}  // namespace
}  // namespace erun::testing
