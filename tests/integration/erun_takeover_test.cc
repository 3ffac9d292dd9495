// The job outlives its driver (--driver-grace; docs/design.md, "A driver
// that can be replaced"): examples/train_mlp (a copy of its own, so its
// workers are found by path) under the real erun, which is SIGKILLed
// mid-training. The workers train on; the same command run again takes the
// job over: every worker keeps its process and rank, no epoch runs twice and
// none is missing (the lines printed meanwhile reach the new erun), and the
// job ends at exactly the uninterrupted model. A worker killed while no
// driver is there is recovered in place by the next one. Nobody running it
// again: after the grace every process and the host memory are gone. A
// host that left discovery meanwhile is left out in place. `erun --attach
// NAME` takes the job over by the name the first erun logged. The summary
// after a takeover is the whole job's (read back from its event log, or
// without one from the job's own copy of its events). Two
// takeovers racing: one wins. Another user reaches neither the record nor
// the agents.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "support/erun_process.h"
#include "support/netns.h"
#include "support/process_utils.h"
#include "support/sshd.h"

namespace erun::testing {
namespace {

using namespace std::chrono_literals;

class ErunTakeover : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(uninterrupted_checksum().empty());
    program_ = dir_.file("train_mlp_takeover");
    std::filesystem::copy_file(build_path("examples/train_mlp"), program_);
    ::chmod(program_.c_str(), 0755);
    ::mkdir(dir_.file("jobs").c_str(), 0700);
  }
  void TearDown() override {
    std::vector<pid_t> left;
    EXPECT_TRUE(wait_no_process(program_, 30s, &left)) << describe_pids(left);
  }
  std::vector<std::string> args(std::vector<std::string> extra) {
    std::vector<std::string> a = {"--driver-grace", "30", "--term-grace", "2"};
    a.insert(a.end(), extra.begin(), extra.end());
    a.push_back(program_);
    a.insert(a.end(), kTrainMlpArgs.begin(), kTrainMlpArgs.end());
    return a;
  }
  std::vector<std::string> env() const { return {"ERUN_JOB_DIR=" + dir_.file("jobs")}; }
  std::set<pid_t> workers() const {
    std::set<pid_t> out;
    for (pid_t pid : pids_with_cmdline(program_)) {
      if (read_file("/proc/" + std::to_string(pid) + "/cmdline").rfind(program_ + std::string(1, '\0'), 0) == 0) {
        out.insert(pid);
      }
    }
    return out;
  }
  // Rank 0's epoch lines, in order, of every erun's output together.
  static std::vector<int> epochs(const std::string& out) {
    std::vector<int> e;
    const std::regex re(":epoch ([0-9]+) loss=");
    for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator(); ++it) {
      e.push_back(std::stoi((*it)[1].str()));
    }
    return e;
  }
  // Epochs 0-9 each printed once across the two eruns' output: none ran
  // twice, none went missing, none of the lines printed between was lost.
  static void expect_each_epoch_once(ErunProcess& first, ErunProcess& next) {
    std::vector<int> want(10);
    for (int i = 0; i < 10; ++i) want[static_cast<size_t>(i)] = i;
    EXPECT_EQ(epochs(first.out() + next.out()), want)
        << "an epoch ran twice or went missing\n" << first.out() << "\n---\n" << next.out();
  }
  // The job's name, which erun logs at its start ("" when it has not yet).
  static std::string job_name(ErunProcess& p) {
    if (!p.wait_output("erun --attach job-", 60s)) return "";
    std::smatch m;
    const std::string said = p.err();
    return std::regex_search(said, m, std::regex("erun --attach (job-[0-9a-f]+)")) ? m[1].str() : "";
  }
  // The tests of a standby on another machine (below); `relay`: the
  // workers reach the driver through their agent's relay.
  void standby_on_another_machine(bool relay);
  // Starts the job and SIGKILLs its erun right after rank 0's line for
  // `epoch` (not while a line is on its way); the workers' pids then.
  // Waits for the epoch, SIGKILLs erun (with `launcher_lost`, every ssh
  // client it started too: the launching machine dies) and returns the
  // workers from before.
  std::set<pid_t> start_and_kill(ErunProcess& p, int epoch, bool launcher_lost = false) {
    EXPECT_TRUE(p.wait_output(fmt::format(":epoch {} loss=", epoch), 120s)) << p.out() << p.err();
    std::set<pid_t> before = workers();
    std::vector<pid_t> clients;
    if (launcher_lost) clients = children_of(static_cast<pid_t>(p.pid()));
    p.signal(SIGKILL);
    for (pid_t c : clients) ::kill(c, SIGKILL);
    EXPECT_TRUE(p.wait(10s));
    return before;
  }

  // SIGKILLs one of the job's two workers, waits until the job recovered in
  // place (its events, at `events`, show a reset and then the next
  // generation joined), then SIGKILLs erun.
  void kill_a_worker_then_erun(ErunProcess& erun, const std::string& events) {
    std::set<pid_t> before = workers();
    ASSERT_EQ(before.size(), 2u);
    ASSERT_EQ(::kill(*before.rbegin(), SIGKILL), 0);
    auto recovered = [&events] {
      const std::string text = read_file(events);
      const size_t reset = text.find("\"event\":\"reset\"");
      return reset != std::string::npos && text.find("\"event\":\"generation_joined\"", reset) != std::string::npos;
    };
    for (int i = 0; i < 600 && !recovered(); ++i) std::this_thread::sleep_for(100ms);
    ASSERT_TRUE(recovered()) << read_file(events) << erun.err();
    erun.signal(SIGKILL);
    ASSERT_TRUE(erun.wait(10s));
  }

  TempDir dir_;
  std::string program_;
};

TEST_F(ErunTakeover, TheSameCommandAgainTakesTheJobOverInPlace) {
  ErunProcess first(args({"-np", "2"}), env());
  std::set<pid_t> before = start_and_kill(first, 1);
  ASSERT_EQ(before.size(), 2u);
  std::this_thread::sleep_for(2s);  // the workers train on, with no driver
  EXPECT_EQ(workers(), before) << "a worker ended with its driver";

  ErunProcess again(args({"-np", "2"}), env());
  ASSERT_TRUE(again.wait_output("took the job over at generation", 30s)) << again.err();
  EXPECT_EQ(workers(), before) << "the new erun did not keep the workers";
  ASSERT_NO_FATAL_FAILURE(expect_trained_exactly(again, uninterrupted_checksum()));
  EXPECT_NE(again.err().find("re-forming (hosts updated) in place"), std::string::npos) << again.err();
  EXPECT_NE(again.err().find("and 0 resets"), std::string::npos) << "a takeover is no reset\n" << again.err();
  // Every epoch once: none ran twice, and the lines printed while no erun
  // was there reached the new one.
  expect_each_epoch_once(first, again);
  // The job is over: its record is gone, so the command starts anew next
  // time, and so is the rest of its directory.
  for (auto& e : std::filesystem::directory_iterator(dir_.file("jobs"))) {
    ADD_FAILURE() << e.path() << " is left behind";
  }
}

// Workers that reach the rendezvous themselves (--no-agent-relay) follow
// the job to the next erun too: it listens on the job's port again.
TEST_F(ErunTakeover, WithoutTheAgentRelayTheWorkersReconnectToTheNextErun) {
  ErunProcess first(args({"--no-agent-relay", "-np", "2"}), env());
  std::set<pid_t> before = start_and_kill(first, 1);
  ASSERT_EQ(before.size(), 2u);
  std::this_thread::sleep_for(1s);
  ErunProcess again(args({"--no-agent-relay", "-np", "2"}), env());
  ASSERT_TRUE(again.wait_output("took the job over at generation", 30s)) << again.err();
  EXPECT_EQ(workers(), before) << "the new erun did not keep the workers";
  ASSERT_NO_FATAL_FAILURE(expect_trained_exactly(again, uninterrupted_checksum()));
  EXPECT_EQ(again.err().find("cannot listen on the job's rendezvous port"), std::string::npos) << again.err();
  EXPECT_NE(again.err().find("and 0 resets"), std::string::npos) << again.err();
  expect_each_epoch_once(first, again);
}

TEST_F(ErunTakeover, AWorkerKilledWithoutADriverIsRecoveredInPlaceByTheNext) {
  ErunProcess first(args({"-np", "2", "--min-np", "1"}), env());
  std::set<pid_t> before = start_and_kill(first, 1);
  ASSERT_EQ(before.size(), 2u);
  pid_t victim = *before.rbegin();
  ::kill(victim, SIGKILL);
  std::this_thread::sleep_for(2s);  // the survivor rolls back and waits to re-join
  // This time by the job's name, which the first erun logged.
  const std::string name = job_name(first);
  ASSERT_FALSE(name.empty()) << first.err();
  ErunProcess again({"--attach", name}, env());
  ASSERT_NO_FATAL_FAILURE(expect_trained_exactly(again, uninterrupted_checksum()));
  EXPECT_NE(again.err().find("took the job over"), std::string::npos) << again.err();
  EXPECT_EQ(again.out().find("] epoch 0 "), std::string::npos) << "restarted from the start";
  std::vector<int> all = epochs(first.out() + again.out());
  ASSERT_FALSE(all.empty());
  EXPECT_EQ(all.back(), 9);
  EXPECT_EQ(std::count(all.begin(), all.end(), 0), 1) << "epoch 0 ran again: not in place\n" << again.out();
}

// The account spans the whole job: the erun that takes the job over reads
// the job's event log back, so its summary (and status line and /metrics)
// counts the failure, the reset and the time of the erun before it, and says
// what `erun report` says of the whole log.
// Without --event-log too: the job keeps its events in its directory (a
// private file, gone with the record at the end), and the erun that takes
// it over reads them back.
TEST_F(ErunTakeover, WithoutAnEventLogTheSummaryAfterATakeoverIsTheWholeJobsToo) {
  ErunProcess first(args({"-np", "2", "--min-np", "1"}), env());
  const std::string name = job_name(first);
  ASSERT_FALSE(name.empty()) << first.err();
  const std::string events = dir_.file("jobs") + "/" + name + "/events";
  ASSERT_TRUE(first.wait_output(":epoch 1 loss=", 120s)) << first.out() << first.err();
  struct stat st{};
  ASSERT_EQ(::lstat(events.c_str(), &st), 0) << events;
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_NO_FATAL_FAILURE(kill_a_worker_then_erun(first, events));

  ErunProcess again(args({"-np", "2", "--min-np", "1"}), env());
  ASSERT_NO_FATAL_FAILURE(expect_trained_exactly(again, uninterrupted_checksum()));
  const std::string said = again.err();
  EXPECT_NE(said.find("took the job over"), std::string::npos) << said;
  // The first erun's failure and reset, and the takeover, are in the summary.
  EXPECT_NE(said.find("1 worker failed)"), std::string::npos) << "the reset: " << said;
  EXPECT_NE(said.find("; 1 worker failed, "), std::string::npos) << "the failed worker: " << said;
  EXPECT_NE(said.find("1 driver takeover"), std::string::npos) << said;
  EXPECT_FALSE(std::filesystem::exists(events)) << "the job's events outlived it";
}

TEST_F(ErunTakeover, TheSummaryAfterATakeoverIsTheWholeJobs) {
  const std::string log = dir_.file("events.jsonl");
  const auto began = std::chrono::steady_clock::now();
  ErunProcess first(args({"-np", "2", "--min-np", "1", "--event-log", log}), env());
  ASSERT_TRUE(first.wait_output(":epoch 1 loss=", 120s)) << first.out() << first.err();
  ASSERT_NO_FATAL_FAILURE(kill_a_worker_then_erun(first, log));
  const double first_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();

  ErunProcess again(args({"-np", "2", "--min-np", "1", "--event-log", log}), env());
  ASSERT_NO_FATAL_FAILURE(expect_trained_exactly(again, uninterrupted_checksum()));
  const double whole_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  EXPECT_NE(again.err().find("took the job over"), std::string::npos) << again.err();
  nlohmann::json summary;
  std::istringstream lines(read_file(log));
  for (std::string line; std::getline(lines, line);) {
    auto e = nlohmann::json::parse(line);
    if (e["event"] == "job_summary") summary = e;
  }
  ASSERT_TRUE(summary.is_object()) << read_file(log);
  EXPECT_EQ(summary["resets"]["worker failed"], 1) << summary.dump();
  EXPECT_EQ(summary["workers_failed"], 1) << summary.dump();
  EXPECT_EQ(summary["takeovers"], 1) << summary.dump();
  // The first erun's two workers and the replacement count too: the record carries the count.
  EXPECT_GE(summary["workers_launched"], 3) << summary.dump();
  EXPECT_GT(summary["driver_gap_s"].get<double>(), 0) << summary.dump();
  const double wall_s = summary["wall_s"].get<double>();
  // More than the second erun's own time by the first one's (its start,
  // two epochs, the recovery: seconds); not more than the test's.
  EXPECT_GT(wall_s, whole_s - first_s + 0.5)
      << "the first erun's time is the job's too: " << first_s << " s of " << whole_s << " s; " << summary.dump();
  EXPECT_LE(wall_s, whole_s) << summary.dump();
  // What it printed is what `erun report` says of the whole log.
  const std::string printed = again.err();
  const size_t at = printed.find("erun: job ");
  ASSERT_NE(at, std::string::npos) << printed;
  Result<std::string> report = run_tool({erun_binary(), "report", log});
  ASSERT_TRUE(report) << report.message();
  EXPECT_EQ(printed.substr(at + 6, report->size()), *report) << "erun printed:\n" << printed << "\nreport:\n" << *report;
}

// Host memory lives as long as the job: an agent SIGKILLed while no driver
// is there (its watchdog stops its workers) leaves the host's commits in
// place through the grace, not only the 10 s a driver would need to start
// the host again, and the next erun resumes from them.
TEST_F(ErunTakeover, AnAgentKilledWithoutADriverKeepsTheHostMemoryForTheNext) {
  ErunProcess first(args({"-np", "2"}), env());
  std::set<pid_t> before = start_and_kill(first, 1);
  ASSERT_EQ(before.size(), 2u);
  std::smatch m;
  const std::string environ = environ_of(*before.begin());
  ASSERT_TRUE(std::regex_search(environ, m, std::regex("\nERUN_COMMIT_DIR=([^\n]+)\n"))) << environ;
  const std::string commit_dir = m[1].str();
  const pid_t agent = parent_of(*before.begin());
  ASSERT_GT(agent, 1);
  ::kill(agent, SIGKILL);
  std::vector<pid_t> left;
  ASSERT_TRUE(wait_no_process(program_, 20s, &left)) << describe_pids(left);
  std::this_thread::sleep_for(12s);  // past the 10 s that a driver would have to start the host again
  ASSERT_TRUE(std::filesystem::exists(commit_dir)) << "the host memory went with its agent";

  ErunProcess again(args({"-np", "2"}), env());
  ASSERT_NO_FATAL_FAILURE(expect_trained_exactly(again, uninterrupted_checksum()));
  EXPECT_NE(again.err().find("no worker of it is left"), std::string::npos) << again.err();
  EXPECT_NE(again.err().find("training resumes at commit"), std::string::npos) << again.err();
  EXPECT_NE(again.err().find("kept in host memory on localhost"), std::string::npos) << again.err();
  // Epochs 0 and 1 ended before the kill: none runs again.
  std::vector<int> all = epochs(first.out() + again.out());
  EXPECT_EQ(std::count(all.begin(), all.end(), 0), 1) << first.out() << "\n---\n" << again.out();
  EXPECT_EQ(std::count(all.begin(), all.end(), 1), 1) << first.out() << "\n---\n" << again.out();
  EXPECT_FALSE(std::filesystem::exists(commit_dir)) << "the job ended: its host memory goes";
}

TEST_F(ErunTakeover, AHostThatLeftDiscoveryMeanwhileIsLeftOutInPlaceByTheNext) {
  // Two simulated hosts of this machine; the second leaves the hosts file
  // while no erun runs.
  dir_.write("hosts", "127.0.0.2:1\n127.0.0.3:1\n");
  dir_.write("discover.sh", "#!/bin/sh\ncat " + dir_.file("hosts") + "\n", true);
  const std::vector<std::string> extra = {"--launcher", "local", "--host-discovery-script", dir_.file("discover.sh"),
                                          "--discovery-interval", "0.2", "-np", "2", "--min-np", "1"};
  ErunProcess first(args(extra), env());
  std::set<pid_t> before = start_and_kill(first, 1);
  ASSERT_EQ(before.size(), 2u);
  dir_.write("hosts", "127.0.0.2:1\n");
  ErunProcess again(args(extra), env());
  ASSERT_NO_FATAL_FAILURE(expect_trained_exactly(again, uninterrupted_checksum()));
  EXPECT_NE(again.err().find("took the job over"), std::string::npos) << again.err();
  EXPECT_NE(again.out().find("world size 2 -> 1"), std::string::npos) << "no shrink\n" << again.out();
  expect_each_epoch_once(first, again);
}

// erun SIGKILLed while the discovery script fails (an inventory service
// down for a few seconds, exit 3), and run again at once: its first
// discovery fails too. It takes the job over with the hosts of the job
// record instead of giving up ("nothing was launched", the workers left
// without a driver), and goes on once the script works again.
TEST_F(ErunTakeover, ATakeoverWhileDiscoveryFailsGoesOnWithTheRecordsHosts) {
  dir_.write("hosts", "127.0.0.2:1\n127.0.0.3:1\n");
  dir_.write("discover.sh", "#!/bin/sh\n[ -e " + dir_.file("down") + " ] && exit 3\ncat " + dir_.file("hosts") + "\n",
             true);
  const std::vector<std::string> extra = {"--launcher", "local", "--host-discovery-script", dir_.file("discover.sh"),
                                          "--discovery-interval", "0.2", "-np", "2", "--min-np", "1"};
  ErunProcess first(args(extra), env());
  ASSERT_TRUE(first.wait_output(":epoch 0 loss=", 120s)) << first.err();
  dir_.write("down", "");  // the inventory service goes down
  std::this_thread::sleep_for(500ms);
  std::set<pid_t> before = start_and_kill(first, 1);
  ASSERT_EQ(before.size(), 2u);
  ErunProcess again(args(extra), env());
  ASSERT_TRUE(again.wait_output("took the job over at generation", 30s)) << again.err();
  EXPECT_NE(again.err().find("the job goes on with the 2 host(s) of its record"), std::string::npos) << again.err();
  std::this_thread::sleep_for(2s);
  EXPECT_EQ(workers(), before) << "a worker was lost while discovery failed";
  std::filesystem::remove(dir_.file("down"));  // back
  ASSERT_NO_FATAL_FAILURE(expect_trained_exactly(again, uninterrupted_checksum()));
  EXPECT_EQ(again.out().find("world size 2 -> 1"), std::string::npos) << "a host was dropped\n" << again.out();
  expect_each_epoch_once(first, again);
}

TEST_F(ErunTakeover, OverSshTheLaunchingSideLostWholeIsTakenOverByTheSameCommand) {
  // Two hosts of the test's sshd; erun and every ssh client it started are
  // SIGKILLed together, as when the launching machine dies: the remote
  // agents see their connections gone, and the same command reaches them
  // again over new ssh connections (`erun --agent --attach` on each host).
  auto server = SshServer::start();
  ERUN_REQUIRE_SSHD(server);
  std::vector<std::string> extra = {"-np", "2", "-H", "127.0.0.2:1,127.0.0.3:1"};
  for (auto& a : server->erun_args()) extra.push_back(a);
  ErunProcess first(args(extra), env());
  std::set<pid_t> before = start_and_kill(first, 1, /*launcher_lost=*/true);
  ASSERT_EQ(before.size(), 2u);
  std::this_thread::sleep_for(2s);
  EXPECT_EQ(workers(), before) << "a worker ended with the launching side";

  ErunProcess again(args(extra), env());
  ASSERT_TRUE(again.wait_output("took the job over at generation", 60s)) << again.err();
  EXPECT_EQ(workers(), before) << "the new erun did not keep the workers";
  ASSERT_NO_FATAL_FAILURE(expect_trained_exactly(again, uninterrupted_checksum()));
  EXPECT_NE(again.err().find("2 worker(s) on 2 host(s)"), std::string::npos) << again.err();
  expect_each_epoch_once(first, again);
}

TEST_F(ErunTakeover, AnErunStoppedPastItsHeartbeatTimeoutGoesOnWhenContinued) {
  // Ctrl-Z on erun for three heartbeat timeouts, then fg: the agents keep
  // their workers and the channel, and the job goes on as if nothing
  // happened (no worker replaced, no reset).
  std::vector<std::string> extra = {"--heartbeat-timeout", "2", "-np", "2"};
  ErunProcess p(args(extra), env());
  ASSERT_TRUE(p.wait_output(":epoch 1 loss=", 120s)) << p.out() << p.err();
  std::set<pid_t> before = workers();
  ASSERT_EQ(before.size(), 2u);
  p.signal(SIGSTOP);
  std::this_thread::sleep_for(6s);
  EXPECT_EQ(workers(), before) << "a worker stopped while erun was stopped";
  p.signal(SIGCONT);
  ASSERT_NO_FATAL_FAILURE(expect_trained_exactly(p, uninterrupted_checksum()));
  EXPECT_NE(p.err().find("and 0 resets"), std::string::npos) << p.err();
  EXPECT_NE(p.err().find("the driver speaks again"), std::string::npos) << p.err();
}

TEST_F(ErunTakeover, NobodyTakingOverLeavesNothingAfterTheGrace) {
  std::vector<std::string> a = args({"-np", "2"});
  a[1] = "3";  // --driver-grace 3
  ErunProcess first(a, env());
  ASSERT_TRUE(first.wait_output(":epoch 0 loss=", 120s)) << first.out() << first.err();
  // This job's host memory (other tests' jobs may run beside it).
  std::set<std::string> shm_before;
  for (pid_t pid : workers()) {
    const std::string env = environ_of(pid);
    const size_t at = env.find("\nERUN_COMMIT_DIR=");
    if (at != std::string::npos) shm_before.insert(env.substr(at + 17, env.find('\n', at + 17) - at - 17));
  }
  ASSERT_FALSE(shm_before.empty());
  for (auto& d : shm_before) ASSERT_TRUE(std::filesystem::exists(d)) << d;
  // This job's agents, told apart from other tests' by the job directory
  // in their environment.
  auto job_agents = [job_dir = "\nERUN_JOB_DIR=" + dir_.file("jobs") + "\n"] {
    std::vector<pid_t> out;
    for (pid_t pid : pids_with_cmdline("--agent")) {
      if (environ_of(pid).find(job_dir) != std::string::npos) out.push_back(pid);
    }
    return out;
  };
  ASSERT_FALSE(job_agents().empty()) << "the job's agent was not found";
  std::set<pid_t> before = start_and_kill(first, 0);
  ASSERT_EQ(before.size(), 2u);
  std::this_thread::sleep_for(1s);
  EXPECT_EQ(workers(), before) << "the workers did not wait for the grace\n" << first.err();
  std::vector<pid_t> left;
  EXPECT_TRUE(wait_no_process(program_, 20s, &left)) << describe_pids(left);
  // Their host memory went with them.
  auto deadline = std::chrono::steady_clock::now() + 10s;
  std::vector<std::string> still;
  do {
    still.clear();
    for (auto& d : shm_before) {
      if (std::filesystem::exists(d) && std::chrono::steady_clock::now() < deadline) still.push_back(d);
    }
    if (!still.empty()) std::this_thread::sleep_for(100ms);
  } while (!still.empty() && std::chrono::steady_clock::now() < deadline);
  for (auto& d : shm_before) EXPECT_FALSE(std::filesystem::exists(d)) << d;
  // No agent of this job is left.
  std::vector<pid_t> agents;
  deadline = std::chrono::steady_clock::now() + 10s;
  while (!(agents = job_agents()).empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_TRUE(agents.empty()) << describe_pids(agents);
}

// Test (i): a standby driver (erun --standby --attach NAME) watches the job
// and takes it over by itself when its erun is SIGKILLed: no command typed.
TEST_F(ErunTakeover, AStandbyDriverTakesTheJobOverWhenItsErunIsKilled) {
  ErunProcess first(args({"-np", "2"}), env());
  const std::string name = job_name(first);
  ASSERT_FALSE(name.empty()) << first.err();
  ErunProcess standby({"--watch", "--attach", name}, env());
  ASSERT_TRUE(standby.wait_output("standing by for its driver", 30s)) << standby.err();
  // One standby is enough.
  ErunProcess second({"--standby", "--attach", name}, env());
  auto refused = second.wait(30s);
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->shell_code(), 2) << second.err();
  EXPECT_NE(second.err().find("has a standby driver already"), std::string::npos) << second.err();

  std::set<pid_t> before = start_and_kill(first, 1);
  ASSERT_EQ(before.size(), 2u);
  ASSERT_TRUE(standby.wait_output("took the job over at generation", 30s)) << standby.err();
  EXPECT_NE(standby.err().find("its driver is gone: the standby takes the job over"), std::string::npos)
      << standby.err();
  EXPECT_EQ(workers(), before) << "the standby did not keep the workers";
  ASSERT_NO_FATAL_FAILURE(expect_trained_exactly(standby, uninterrupted_checksum()));
  EXPECT_NE(standby.err().find("and 0 resets"), std::string::npos) << standby.err();
  expect_each_epoch_once(first, standby);
  ASSERT_TRUE(standby.wait(30s));
  EXPECT_FALSE(std::filesystem::exists(dir_.file("jobs/" + name))) << "the job's directory is left behind";
}

// A standby on another machine: a network namespace of its own (its own
// addresses, reaching this machine only through its link), sharing the
// job record's directory as shared storage would. The job runs over ssh
// on this machine's end of the link; erun and its ssh clients are SIGKILLed
// together (the launching machine lost). The standby, started with
// --job-record and its own --driver-address, reaches the agents over ssh
// across the link and has their relays reconnect to it there: the workers
// keep their processes and ranks, every epoch runs once, the exact model.
void ErunTakeover::standby_on_another_machine(bool relay) {
  auto ns = NetNamespace::create();
  ERUN_REQUIRE_NETNS(ns);
  auto server = SshServer::start({ns->outer_address()});
  ERUN_REQUIRE_SSHD(server);
  std::vector<std::string> extra = {"--launcher", "ssh", "-np", "2", "-H", ns->outer_address() + ":2",
                                    "--driver-address", ns->outer_address()};
  if (!relay) extra.push_back("--no-agent-relay");
  for (auto& a : server->erun_args()) extra.push_back(a);
  ErunProcess first(args(extra), env());
  const std::string name = job_name(first);
  ASSERT_FALSE(name.empty()) << first.err();
  ErunProcess standby({"--standby", "--job-record", dir_.file("jobs/" + name + "/record"), "--driver-address",
                       ns->inner_address()},
                      {}, {"ip", "netns", "exec", ns->name()});
  ASSERT_TRUE(standby.wait_output("standing by for its driver", 30s)) << standby.err();
  std::set<pid_t> before = start_and_kill(first, 1, /*launcher_lost=*/true);
  ASSERT_EQ(before.size(), 2u);

  ASSERT_TRUE(standby.wait_output("took the job over at generation", 60s)) << standby.err();
  EXPECT_EQ(workers(), before) << "the standby did not keep the workers";
  ASSERT_NO_FATAL_FAILURE(expect_trained_exactly(standby, uninterrupted_checksum()));
  EXPECT_NE(standby.err().find("2 worker(s) on 1 host(s)"), std::string::npos) << standby.err();
  EXPECT_NE(standby.err().find("and 0 resets"), std::string::npos) << standby.err();
  expect_each_epoch_once(first, standby);
  if (!relay) {
    // Each worker was told where the new driver is by its agent (their
    // stderr comes out on erun's stdout, marked <stderr>).
    const std::string told = "a new driver took the job over at " + ns->inner_address() + ":";
    std::set<std::string> ranks_told;
    std::istringstream lines(standby.out());
    for (std::string line; std::getline(lines, line);) {
      if (line.find(told) != std::string::npos) ranks_told.insert(line.substr(0, line.find('<')));
    }
    EXPECT_EQ(ranks_told, (std::set<std::string>{"[0]", "[1]"})) << standby.out();
  }
}

TEST_F(ErunTakeover, AStandbyOnAnotherMachineTakesTheJobOverAcrossTheNetwork) {
  standby_on_another_machine(/*relay=*/true);
}

// As above, the workers reaching the driver themselves (--no-agent-relay):
// their agents write where the new driver is (ERUN_DRIVER_FILE), and the
// workers connect there.
TEST_F(ErunTakeover, AStandbyOnAnotherMachineIsFoundByWorkersWithoutTheAgentRelay) {
  standby_on_another_machine(/*relay=*/false);
}

// A standby given the record's path (--job-record: shared storage) takes over
// from a driver that is alive but silent (here stopped) past
// --heartbeat-timeout. The old driver, continued, finds itself replaced and
// leaves without touching the workers.
TEST_F(ErunTakeover, AStandbyDriverTakesAFrozenDriversJobWhichThenLeaves) {
  ErunProcess first(args({"--heartbeat-timeout", "3", "-np", "2"}), env());
  const std::string name = job_name(first);
  ASSERT_FALSE(name.empty()) << first.err();
  const std::string record = dir_.file("jobs") + "/" + name + "/record";
  ErunProcess standby({"--watch", "--job-record", record}, env());
  ASSERT_TRUE(standby.wait_output("standing by for its driver", 30s)) << standby.err();
  ASSERT_TRUE(first.wait_output(":epoch 1 loss=", 120s)) << first.out() << first.err();
  std::set<pid_t> before = workers();
  ASSERT_EQ(before.size(), 2u);
  first.signal(SIGSTOP);
  ASSERT_TRUE(standby.wait_output("took the job over at generation", 30s)) << standby.err();
  EXPECT_NE(standby.err().find("has been silent for"), std::string::npos) << standby.err();
  EXPECT_EQ(workers(), before) << "the standby did not keep the workers";
  first.signal(SIGCONT);
  auto left = first.wait(30s);
  ASSERT_TRUE(left) << first.err();
  EXPECT_EQ(left->shell_code(), 3) << first.err();
  EXPECT_NE(first.err().find("this erun leaves it to that one"), std::string::npos) << first.err();
  ASSERT_NO_FATAL_FAILURE(expect_trained_exactly(standby, uninterrupted_checksum()));
  EXPECT_NE(standby.err().find("and 0 resets"), std::string::npos) << standby.err();
  std::vector<int> all = epochs(first.out() + standby.out());
  ASSERT_FALSE(all.empty());
  for (int i = 0; i < 10; ++i) EXPECT_EQ(std::count(all.begin(), all.end(), i), 1) << "epoch " << i;
}

// The job record carries the hosts' failures and blacklistings: a host
// blacklisted before erun was killed stays out under the next erun for the
// rest of its cooldown, instead of being used again at once.
TEST_F(ErunTakeover, ABlacklistedHostStaysOutUnderTheNextErun) {
  dir_.write("hosts", "127.0.0.2:1\n127.0.0.3:1\n");
  dir_.write("discover.sh", "#!/bin/sh\ncat " + dir_.file("hosts") + "\n", true);
  std::vector<std::string> extra = {"--launcher", "local", "--host-discovery-script", dir_.file("discover.sh"),
                                    "--discovery-interval", "0.2", "-np", "2", "--min-np", "1",
                                    "--blacklist-after", "1", "--blacklist-cooldown-range", "60", "300"};
  ErunProcess first(args(extra), env());
  ASSERT_TRUE(first.wait_output(":epoch 0 loss=", 120s)) << first.out() << first.err();
  pid_t on_b = 0;
  for (pid_t pid : workers()) {
    if (environ_of(pid).find("\nERUN_HOSTNAME=127.0.0.3\n") != std::string::npos) on_b = pid;
  }
  ASSERT_GT(on_b, 0);
  ::kill(on_b, SIGKILL);
  ASSERT_TRUE(first.wait_output("127.0.0.3 blacklisted for 60 s", 30s)) << first.err();
  ASSERT_TRUE(first.wait_output("world size 2 -> 1", 30s)) << first.out();
  std::this_thread::sleep_for(1500ms);  // the record written (at most a second later)
  // Replicas are pushed to the blacklisted host meanwhile: the pusher's
  // stderr is its agent's pipe, not erun's, so erun's output ends with erun
  // (wait() reads it to its end), not with the grace.
  ASSERT_TRUE(first.wait_output("replicated to 127.0.0.3, the first", 30s)) << first.err();
  // The record names the keeper, which the next erun keeps as such.
  const std::string record = dir_.file("jobs/" + job_name(first) + "/record");
  EXPECT_NE(read_file(record).find("\nkeeper 127.0.0.3 127.0.0.2\n"), std::string::npos) << read_file(record);
  const auto killed = std::chrono::steady_clock::now();
  first.signal(SIGKILL);
  ASSERT_TRUE(first.wait(10s));
  EXPECT_LT(std::chrono::steady_clock::now() - killed, 10s) << "erun's stderr stayed open after erun was killed";

  ErunProcess again(args(extra), env());
  ASSERT_TRUE(again.wait_output("still blacklisted, as the job record says: 127.0.0.3", 30s)) << again.err();
  // A takeover of the running worker, not a job started anew.
  ASSERT_TRUE(again.wait_output("took the job over at generation", 30s)) << again.err();
  EXPECT_NE(again.err().find("1 worker(s) on 1 host(s)"), std::string::npos) << again.err();
  ASSERT_NO_FATAL_FAILURE(expect_trained_exactly(again, uninterrupted_checksum()));
  EXPECT_EQ(again.out().find("world size 1 -> 2"), std::string::npos) << "127.0.0.3 was used again\n" << again.out();
}

TEST_F(ErunTakeover, TwoTakeoversRacingOneWins) {
  ErunProcess first(args({"-np", "2"}), env());
  std::set<pid_t> before = start_and_kill(first, 0);
  ASSERT_EQ(before.size(), 2u);
  ErunProcess a(args({"-np", "2"}), env());
  ErunProcess b(args({"-np", "2"}), env());
  auto sa = a.wait(180s);
  auto sb = b.wait(180s);
  ASSERT_TRUE(sa && sb) << a.err() << b.err();
  ErunProcess& winner = sa->shell_code() == 0 ? a : b;
  ErunProcess& loser = sa->shell_code() == 0 ? b : a;
  const auto& lost = sa->shell_code() == 0 ? sb : sa;
  EXPECT_EQ(lost->shell_code(), 2) << loser.err();
  EXPECT_NE(loser.err().find("is already driven by erun pid"), std::string::npos) << loser.err();
  EXPECT_EQ(train_checksum(winner.out()), uninterrupted_checksum()) << winner.out() << winner.err();
  EXPECT_NE(winner.err().find("took the job over"), std::string::npos) << winner.err();
}

TEST_F(ErunTakeover, AnotherUserReachesNeitherTheRecordNorTheAgents) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a command as nobody";
  // The refusals below count only if `nobody` can run erun at all.
  auto can_run = run_tool({"runuser", "-u", "nobody", "--", erun_binary(), "--version"});
  ASSERT_TRUE(can_run.is_ok()) << can_run.message();
  ::chmod(dir_.path().c_str(), 0755);  // the program is nobody's to read; the job directory stays 0700
  ErunProcess first(args({"-np", "2"}), env());
  ASSERT_TRUE(first.wait_output(":epoch 0 loss=", 120s)) << first.err();
  std::set<pid_t> before = workers();
  // The agent's attach socket, from the record only root reads.
  std::string record;
  for (auto& e : std::filesystem::directory_iterator(dir_.file("jobs"))) record = read_file((e.path() / "record").string());
  std::smatch m;
  ASSERT_TRUE(std::regex_search(record, m, std::regex("\nagent [^ ]+ ([^\n]+)\n"))) << record;
  const std::string socket = m[1].str();
  auto attach = run_tool({"runuser", "-u", "nobody", "--", erun_binary(), "--agent", "--attach", socket});
  EXPECT_FALSE(attach.is_ok()) << "another user reached the agent's attach socket";
  auto job = run_tool({"runuser", "-u", "nobody", "--", "env", "ERUN_JOB_DIR=" + dir_.file("jobs"), erun_binary(),
                       "--attach", std::filesystem::directory_iterator(dir_.file("jobs"))->path().filename().string()});
  EXPECT_FALSE(job.is_ok()) << "another user read the job record";
  EXPECT_EQ(workers(), before);
  first.signal(SIGTERM);  // a stop order: everything stops at once
  auto s = first.wait(30s);
  ASSERT_TRUE(s);
  std::vector<pid_t> left;
  EXPECT_TRUE(wait_no_process(program_, 15s, &left)) << describe_pids(left);
}

}  // namespace
}  // namespace erun::testing
