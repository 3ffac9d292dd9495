// Standbys (--standby; docs/design.md, "Standbys"): examples/train_mlp (a
// copy of its own, found by path) on two simulated hosts of two slots under
// the real erun, -np 3 --max-np 3: the fourth slot runs a standby, started
// and waiting in its first join. A member SIGKILLed is replaced by that very
// process, in the generation the survivors re-join (no cold start, no
// generation without it), and a new standby starts on the freed slot; the
// job ends at the uninterrupted model. A standby killed while it waits is
// replaced without touching the job. A standby ready before a cold
// replacement takes its place (growth through a standby). Nothing is left,
// also after SIGINT.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <regex>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "support/erun_process.h"
#include "support/process_utils.h"

namespace erun::testing {
namespace {

using namespace std::chrono_literals;

class ErunStandby : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(uninterrupted_checksum().empty());
    program_ = dir_.file("train_mlp_standby");
    std::filesystem::copy_file(build_path("examples/train_mlp"), program_);
    ::chmod(program_.c_str(), 0755);
    dir_.write("hosts", "127.0.0.2:2\n127.0.0.3:2\n");
    dir_.write("discover.sh", "#!/bin/sh\ncat " + dir_.file("hosts") + "\n", true);
  }
  void TearDown() override {
    std::vector<pid_t> left;
    EXPECT_TRUE(wait_no_process(program_, 30s, &left)) << describe_pids(left);
  }
  std::vector<std::string> args(std::vector<std::string> extra = {}) {
    std::vector<std::string> a = {"--launcher", "local", "--host-discovery-script", dir_.file("discover.sh"),
                                  "--discovery-interval", "0.2", "-np", "3", "--min-np", "2", "--max-np", "3",
                                  "--term-grace", "2", "--event-log", dir_.file("events.jsonl")};
    a.insert(a.end(), extra.begin(), extra.end());
    a.push_back(program_);
    a.insert(a.end(), kTrainMlpArgs.begin(), kTrainMlpArgs.end());
    return a;
  }
  std::vector<nlohmann::json> events(const std::string& name) const {
    std::vector<nlohmann::json> out;
    std::istringstream in(read_file(dir_.file("events.jsonl")));
    std::string line;
    while (std::getline(in, line)) {
      auto e = nlohmann::json::parse(line, nullptr, false);
      if (e.is_object() && e["event"] == name) out.push_back(e);
    }
    return out;
  }
  bool wait_events(const std::string& name, size_t n, Duration limit) const {
    for (auto until = std::chrono::steady_clock::now() + limit; std::chrono::steady_clock::now() < until;) {
      if (events(name).size() >= n) return true;
      std::this_thread::sleep_for(50ms);
    }
    return events(name).size() >= n;
  }
  // The worker process on `host` slot `slot` (ERUN_LOCAL_INDEX), or 0.
  pid_t worker_at(const std::string& host, int slot) const {
    for (pid_t pid : pids_with_cmdline(program_)) {
      const std::string env = environ_of(pid);
      if (env.find("\nERUN_HOSTNAME=" + host + "\n") != std::string::npos &&
          env.find(fmt::format("\nERUN_LOCAL_INDEX={}\n", slot)) != std::string::npos &&
          read_file("/proc/" + std::to_string(pid) + "/cmdline").rfind(program_ + std::string(1, '\0'), 0) == 0) {
        return pid;
      }
    }
    return 0;
  }
  // The standby's slot from its standby_ready event.
  static std::pair<std::string, int> slot_of(const nlohmann::json& e) {
    return {e["host"].get<std::string>(), e["slot"].get<int>()};
  }

  TempDir dir_;
  std::string program_;
};

TEST_F(ErunStandby, ALostMemberIsReplacedByTheWaitingStandbyProcess) {
  ErunProcess p(args());
  ASSERT_TRUE(p.started()) << p.start_error();
  ASSERT_TRUE(wait_events("standby_ready", 1, 120s)) << p.err();
  const auto [standby_host, standby_slot] = slot_of(events("standby_ready").front());
  const pid_t standby = worker_at(standby_host, standby_slot);
  ASSERT_GT(standby, 0) << "no standby process on " << standby_host << "[" << standby_slot << "]";
  ASSERT_TRUE(p.wait_output("epoch 2 ", 120s)) << p.out() << p.err();
  const size_t joined_before = events("generation_joined").size();

  // A member on the other slot of the standby's host (the nearest standby).
  const pid_t victim = worker_at(standby_host, 1 - standby_slot);
  ASSERT_GT(victim, 0);
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  ASSERT_TRUE(wait_events("standby_promoted", 1, 30s)) << p.err();
  ASSERT_TRUE(wait_events("generation_joined", joined_before + 1, 30s)) << p.err();

  // The generation after the kill has three ranks, the standby's slot among
  // them, and the standby's process is the one that joined: no cold start.
  const auto started = events("generation_started");
  const auto promoted = events("standby_promoted").front();
  EXPECT_EQ(slot_of(promoted), std::make_pair(standby_host, standby_slot)) << promoted.dump();
  const auto next = std::find_if(started.begin(), started.end(), [&](const nlohmann::json& e) {
    return e["generation"] == promoted["generation"];
  });
  ASSERT_NE(next, started.end());
  EXPECT_EQ((*next)["size"], 3) << next->dump() << "\n" << p.err();
  EXPECT_TRUE(pid_alive(standby)) << "the standby's process is gone";
  const auto exited = events("worker_exited");
  const auto joined = events("generation_joined");
  double killed_at = -1, back_at = -1;
  for (auto& e : exited) {
    if (e["exit_code"] == 137 && killed_at < 0) killed_at = e["t"].get<double>();
  }
  for (auto& e : joined) {
    if (e["generation"] == promoted["generation"]) back_at = e["t"].get<double>();
  }
  ASSERT_GE(killed_at, 0);
  ASSERT_GE(back_at, killed_at);
  std::printf("standby: back at 3 ranks %.3f s after the SIGKILL (event log)\n", back_at - killed_at);

  // A new standby on the freed slot, then the end at the exact model.
  EXPECT_TRUE(wait_events("standby_ready", 2, 60s)) << p.err();
  ASSERT_NO_FATAL_FAILURE(expect_trained_exactly(p, uninterrupted_checksum()));
  // Its death was no host failure: nothing blacklisted, one reset.
  EXPECT_TRUE(events("host_blacklisted").empty());
}

TEST_F(ErunStandby, AStandbyKilledWhileWaitingIsReplacedAndTheJobGoesOn) {
  ErunProcess p(args());
  ASSERT_TRUE(wait_events("standby_ready", 1, 120s)) << p.err();
  const auto [host, slot] = slot_of(events("standby_ready").front());
  const pid_t standby = worker_at(host, slot);
  ASSERT_GT(standby, 0);
  const size_t generations = events("generation_started").size();
  ASSERT_EQ(::kill(standby, SIGKILL), 0);
  ASSERT_TRUE(wait_events("standby_ready", 2, 60s)) << p.err();
  EXPECT_NE(worker_at(host, slot), standby);
  // The job did not notice: no reset, no new generation.
  EXPECT_TRUE(events("reset").empty()) << read_file(dir_.file("events.jsonl"));
  EXPECT_EQ(events("generation_started").size(), generations);
  ASSERT_NO_FATAL_FAILURE(expect_trained_exactly(p, uninterrupted_checksum()));
  EXPECT_TRUE(events("host_blacklisted").empty());
}

// Growth through a standby: a second member lost while the new standby is
// still starting (the program spends 4 s before erun::init()) has the
// survivors go on alone at 2 ranks and a cold replacement start; the standby,
// started earlier, is ready first, so the job grows back to 3 through it
// and the cold worker is stopped, neither counted as a failure.
TEST_F(ErunStandby, TheJobGrowsBackThroughAStandbyReadyBeforeTheColdReplacement) {
  const std::string slow = dir_.file("slow_start.sh");
  dir_.write("slow_start.sh", "#!/bin/sh\nsleep 4\nexec " + program_ + " \"$@\"\n", true);
  std::vector<std::string> a = args();
  std::replace(a.begin(), a.end(), program_, slow);
  ErunProcess p(a);
  ASSERT_TRUE(p.started()) << p.start_error();
  ASSERT_TRUE(wait_events("standby_ready", 1, 120s)) << p.err();
  const auto [standby_host, standby_slot] = slot_of(events("standby_ready").front());
  ASSERT_TRUE(p.wait_output("epoch 2 ", 120s)) << p.out() << p.err();

  // The first loss: the waiting standby takes the member's place, and a new
  // standby starts on the member's slot.
  const int first_slot = 1 - standby_slot;
  const pid_t first = worker_at(standby_host, first_slot);
  ASSERT_GT(first, 0);
  ASSERT_EQ(::kill(first, SIGKILL), 0);
  ASSERT_TRUE(wait_events("standby_promoted", 1, 30s)) << p.err();
  for (auto until = std::chrono::steady_clock::now() + 30s;
       p.count("standby started") < 2 && std::chrono::steady_clock::now() < until;) {
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_GE(p.count("standby started"), 2u) << p.err();
  ASSERT_TRUE(events("standby_ready").size() == 1u) << "the new standby is ready already: " << p.err();

  // The second loss, 2 s into the new standby's start-up, on the other host:
  // no standby is ready, so a cold replacement starts there, 2 s behind.
  std::this_thread::sleep_for(2s);
  const std::string other_host = standby_host == "127.0.0.2" ? "127.0.0.3" : "127.0.0.2";
  const pid_t second = worker_at(other_host, 0);
  ASSERT_GT(second, 0);
  const size_t err_before_second = p.err().size();
  ASSERT_EQ(::kill(second, SIGKILL), 0);
  ASSERT_TRUE(wait_events("standby_promoted", 2, 60s)) << p.err();
  const auto promoted = events("standby_promoted")[1];
  EXPECT_EQ(slot_of(promoted), std::make_pair(standby_host, first_slot)) << promoted.dump() << "\n" << p.err();
  EXPECT_NE(promoted["reason"].get<std::string>().find("grows back"), std::string::npos) << promoted.dump();
  EXPECT_TRUE(p.wait_output("is ready before the worker starting on " + other_host + "[0]", 10s)) << p.err();
  // The generation it joins is whole again.
  const auto started = events("generation_started");
  const auto next = std::find_if(started.begin(), started.end(), [&](const nlohmann::json& e) {
    return e["generation"].get<long>() > promoted["generation"].get<long>() && e["size"] == 3;
  });
  EXPECT_NE(next, started.end()) << read_file(dir_.file("events.jsonl"));

  ASSERT_NO_FATAL_FAILURE(expect_trained_exactly(p, uninterrupted_checksum()));
  // The stopped cold worker was no failure: nothing blacklisted, and its
  // slot's failures are the SIGKILLs alone.
  EXPECT_TRUE(events("host_blacklisted").empty());
  EXPECT_EQ(p.count("replacement ended"), 0u) << p.err();
  // The promoted standby kept its place: the grown generation formed. (At
  // the first loss a generation may fail to form: the survivors' report can
  // reach the driver before the killed worker's end, and it re-forms once
  // more; ErunStandby is about the second loss.)
  EXPECT_EQ(p.err().find("failed to form", err_before_second), std::string::npos) << p.err();
  EXPECT_EQ(p.count("slot left the job"), 0u) << p.err();
}

TEST_F(ErunStandby, NothingIsLeftAfterSigint) {
  ErunProcess p(args());
  ASSERT_TRUE(wait_events("standby_ready", 1, 120s)) << p.err();
  p.signal(SIGINT);
  auto s = p.wait(60s);
  ASSERT_TRUE(s) << p.err();
  // TearDown: no process of the program (members and standby) is left.
}

TEST_F(ErunStandby, NoneWithStandbyZero) {
  ErunProcess p(args({"--standby", "0"}));
  ASSERT_TRUE(p.wait_output("epoch 3 ", 120s)) << p.out() << p.err();
  EXPECT_TRUE(events("standby_ready").empty());
  EXPECT_EQ(worker_at("127.0.0.3", 1), 0) << "a worker on the free slot";
  ASSERT_NO_FATAL_FAILURE(expect_trained_exactly(p, uninterrupted_checksum()));
}

}  // namespace
}  // namespace erun::testing
