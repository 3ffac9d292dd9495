// The driver's state machine over FakeDiscovery, FakeLauncher and FakeClock:
// no process, no thread, no sleep.
#include <gtest/gtest.h>
#include <signal.h>

#include <map>
#include <set>
#include <thread>

#include "common/no_retry.h"
#include "discovery/discovery.h"
#include "erun/errors.hpp"
#include "runner/driver.h"
#include "runner/launch/fake_launcher.h"
#include "runner/takeover/record_keeper.h"
#include "support/erun_process.h"

namespace erun {
namespace {

class DriverTest : public ::testing::Test {
 protected:
  void make(DriverOptions o, DriverDeps d = {}) {
    o.command = {"./train"};
    o.term_grace = std::chrono::milliseconds(10);
    d.discovery = &discovery;
    d.local_launcher = &launcher;
    d.clock = &clock;
    d.synchronous_discovery = true;
    d.job_id = "job";
    d.secret = "s3cret";
    driver = std::make_unique<Driver>(o, d);
  }
  DriverOptions elastic(int np, int min_np, int max_np) {
    DriverOptions o;
    o.np = np;
    o.min_np = min_np;
    o.max_np = max_np;
    o.elastic = true;
    o.discovery_interval = std::chrono::seconds(1);
    o.elastic_timeout = std::chrono::seconds(30);
    return o;
  }
  // Steps until the driver returns or `limit` steps of 100 ms fake time pass.
  std::optional<int> steps(int limit = 5) {
    for (int i = 0; i < limit; ++i) {
      if (auto c = driver->step()) return c;
      clock.advance(std::chrono::milliseconds(100));
    }
    return std::nullopt;
  }
  std::map<std::string, std::string> env_of(const FakeLauncher::Worker& w) {
    std::map<std::string, std::string> m;
    for (auto& [k, v] : w.spec.env) m[k] = v;
    return m;
  }
  void finish_all(ExitStatus s) {
    for (auto& w : launcher.running()) launcher.finish(w, s);
  }

  FakeDiscovery discovery;
  FakeLauncher launcher;
  FakeClock clock;
  std::unique_ptr<Driver> driver;
};

TEST_F(DriverTest, StaticJobLaunchesRanksWithTorchrunEnvAndSucceeds) {
  discovery.set(HostSet({{"localhost", 4}}));
  DriverOptions o;
  o.np = o.min_np = o.max_np = 4;
  make(o);
  ASSERT_TRUE(driver->start());
  EXPECT_FALSE(steps(1));
  ASSERT_EQ(launcher.running().size(), 4u);
  for (int r = 0; r < 4; ++r) {
    auto w = launcher.running_rank(r);
    ASSERT_TRUE(w);
    auto env = env_of(*w);
    EXPECT_EQ(env["RANK"], std::to_string(r));
    EXPECT_EQ(env["ERUN_RANK"], std::to_string(r));
    EXPECT_EQ(env["WORLD_SIZE"], "4");
    EXPECT_EQ(env["LOCAL_RANK"], std::to_string(r));
    EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "4");
    EXPECT_EQ(env["MASTER_ADDR"], "127.0.0.1");
    EXPECT_EQ(env["MASTER_PORT"], "4242");
    EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], "0");
    EXPECT_EQ(env["TORCHELASTIC_RUN_ID"], "job");
    EXPECT_EQ(env["ERUN_GENERATION"], "1");
    EXPECT_EQ(w->spec.secret, "s3cret");
    for (auto& [k, v] : w->spec.env) EXPECT_EQ(v.find("s3cret"), std::string::npos) << k;
  }
  finish_all(ExitStatus{0, 0});
  EXPECT_EQ(steps(1), 0);
}

TEST_F(DriverTest, NodeNumbersAreTheHostsIndexesAsTorchrunGivesThem) {
  // Unequal slots: the cross rank of b's local ranks 2 and 3 is 0, but
  // torchrun-style programs read GROUP_RANK as the node's index.
  discovery.set(HostSet({{"a", 2}, {"b", 4}}));
  DriverOptions o;
  o.np = o.min_np = o.max_np = 6;
  make(o);
  ASSERT_TRUE(driver->start());
  EXPECT_FALSE(steps(1));
  ASSERT_EQ(launcher.running().size(), 6u);
  for (int r = 0; r < 6; ++r) {
    auto w = launcher.running_rank(r);
    ASSERT_TRUE(w);
    auto env = env_of(*w);
    std::string host = w->spec.host;
    EXPECT_EQ(env["GROUP_RANK"], host == "a" ? "0" : "1") << r;
    EXPECT_EQ(env["GROUP_WORLD_SIZE"], "2");
    EXPECT_EQ(env["LOCAL_WORLD_SIZE"], host == "a" ? "2" : "4");
    EXPECT_EQ(env["ROLE_NAME"], "default");
    if (::getenv("OMP_NUM_THREADS") == nullptr) {
      EXPECT_EQ(env["OMP_NUM_THREADS"], "1");
    }
  }
}

TEST_F(DriverTest, OmpThreadsComeFromTheUserWhenGivenWithX) {
  discovery.set(HostSet({{"a", 1}, {"b", 2}}));
  DriverOptions o;
  o.np = o.min_np = o.max_np = 3;
  o.env = {"OMP_NUM_THREADS=3"};
  make(o);
  ASSERT_TRUE(driver->start());
  EXPECT_FALSE(steps(1));
  ASSERT_EQ(launcher.running().size(), 3u);
  for (auto& w : launcher.running()) {
    int n = 0;
    for (auto& [k, v] : w->spec.env) {
      if (k == "OMP_NUM_THREADS") {
        ++n;
        EXPECT_EQ(v, "3");
      }
    }
    EXPECT_EQ(n, 1) << w->spec.host;
  }
}

TEST_F(DriverTest, OmpThreadsAreOneOnlyWhereAHostRunsSeveralWorkers) {
  if (::getenv("OMP_NUM_THREADS") != nullptr) GTEST_SKIP() << "OMP_NUM_THREADS is set in the test's environment";
  discovery.set(HostSet({{"a", 1}, {"b", 2}}));
  DriverOptions o;
  o.np = o.min_np = o.max_np = 3;
  make(o);
  ASSERT_TRUE(driver->start());
  EXPECT_FALSE(steps(1));
  ASSERT_EQ(launcher.running().size(), 3u);
  for (auto& w : launcher.running()) {
    auto env = env_of(*w);
    if (w->spec.host == "a") {
      EXPECT_EQ(env.count("OMP_NUM_THREADS"), 0u) << "a runs one worker";
    } else {
      EXPECT_EQ(env["OMP_NUM_THREADS"], "1");
    }
  }
}

TEST_F(DriverTest, NonElasticFailureEndsWithTheWorkersExitCode) {
  discovery.set(HostSet({{"localhost", 2}}));
  DriverOptions o;
  o.np = o.min_np = o.max_np = 2;
  o.reset_limit = 0;
  make(o);
  ASSERT_TRUE(driver->start());
  steps(1);
  launcher.finish(launcher.running_rank(1), ExitStatus{3, 0});
  EXPECT_EQ(steps(2), 3);
  EXPECT_TRUE(launcher.running().empty());  // the survivor was stopped
  EXPECT_TRUE(launcher.launched()[0]->terminated);
}

TEST_F(DriverTest, SignalExitCodeIs128PlusSignal) {
  discovery.set(HostSet({{"localhost", 1}}));
  DriverOptions o;
  o.np = o.min_np = o.max_np = 1;
  o.reset_limit = 0;
  make(o);
  ASSERT_TRUE(driver->start());
  steps(1);
  launcher.finish(launcher.running_rank(0), ExitStatus{0, SIGKILL});
  EXPECT_EQ(steps(2), 128 + SIGKILL);
}

TEST_F(DriverTest, FailureRestartsEveryWorkerUntilTheResetLimit) {
  discovery.set(HostSet({{"a", 2}, {"b", 2}}));
  auto o = elastic(4, 2, 4);
  o.reset_limit = 2;
  o.blacklist_after = 5;
  make(o);
  ASSERT_TRUE(driver->start());
  steps(1);
  ASSERT_EQ(launcher.running().size(), 4u);
  for (int reset = 1; reset <= 2; ++reset) {
    launcher.finish(launcher.running_rank(2), ExitStatus{1, 0});
    EXPECT_FALSE(steps(2));
    EXPECT_EQ(driver->record().resets, reset);
    EXPECT_EQ(driver->record().generation, reset + 1);
    ASSERT_EQ(launcher.running().size(), 4u);
    EXPECT_EQ(env_of(*launcher.running_rank(0))["TORCHELASTIC_RESTART_COUNT"], std::to_string(reset));
  }
  EXPECT_EQ(launcher.launched().size(), 12u);
  launcher.finish(launcher.running_rank(3), ExitStatus{7, 0});
  EXPECT_EQ(steps(2), 7);
}

TEST_F(DriverTest, FatalExitCodeEndsAnElasticJobWithoutARetry) {
  discovery.set(HostSet({{"a", 2}, {"b", 2}}));
  auto o = elastic(4, 1, 4);
  make(o);
  ASSERT_TRUE(driver->start());
  steps(1);
  ASSERT_EQ(launcher.running().size(), 4u);
  launcher.finish(launcher.running_rank(2), ExitStatus{kFatalExitCode, 0});
  EXPECT_EQ(steps(2), kFatalExitCode);
  EXPECT_EQ(driver->record().resets, 0);
  EXPECT_EQ(launcher.launched().size(), 4u);
  EXPECT_TRUE(launcher.running().empty());
}

TEST_F(DriverTest, NoRetryMarkInTheAgentsExitReportEndsAnElasticJob) {
  discovery.set(HostSet({{"a", 2}, {"b", 2}}));
  make(elastic(4, 1, 4));
  ASSERT_TRUE(driver->start());
  steps(1);
  ASSERT_EQ(launcher.running().size(), 4u);
  // The driver forwarded nothing of it (the fake has no pipes): the mark is
  // only in the lines the worker's agent reported with its exit.
  launcher.finish(launcher.running_rank(2), ExitStatus{1, 0},
                  {"Traceback (most recent call last):", std::string(kNoRetryMark) + "allreduce shapes differ"});
  EXPECT_EQ(steps(2), 1);
  EXPECT_EQ(driver->record().resets, 0);
  EXPECT_EQ(launcher.launched().size(), 4u);
}

TEST_F(DriverTest, AFailureWithoutTheMarkInItsExitReportIsRetried) {
  discovery.set(HostSet({{"a", 2}, {"b", 2}}));
  make(elastic(4, 1, 4));
  ASSERT_TRUE(driver->start());
  steps(1);
  launcher.finish(launcher.running_rank(2), ExitStatus{1, 0}, {"RuntimeError: peer went away"});
  EXPECT_FALSE(steps(2));
  EXPECT_EQ(driver->record().resets, 1);
}

TEST_F(DriverTest, RecoveredFailureDoesNotFailTheJob) {
  discovery.set(HostSet({{"a", 2}}));
  auto o = elastic(2, 2, 2);
  make(o);
  ASSERT_TRUE(driver->start());
  steps(1);
  launcher.finish(launcher.running_rank(1), ExitStatus{0, SIGKILL});
  steps(2);
  EXPECT_EQ(driver->record().generation, 2);
  finish_all(ExitStatus{0, 0});
  EXPECT_EQ(steps(2), 0);
}

TEST_F(DriverTest, GrowsShrinksAndWaitsForMinNp) {
  discovery.set(HostSet({{"a", 2}}));
  make(elastic(2, 2, 4));
  ASSERT_TRUE(driver->start());
  steps(1);
  EXPECT_EQ(driver->plan().size(), 2);
  // A host appears: the job restarts at 4 ranks, a's ranks first.
  discovery.set(HostSet({{"a", 2}, {"b", 4}}));
  steps(15);
  EXPECT_EQ(driver->record().generation, 2);
  EXPECT_EQ(driver->plan().to_string(), "4 ranks: a[0-1] b[2-3]");
  EXPECT_EQ(launcher.running().size(), 4u);
  // More slots than max-np change nothing.
  discovery.set(HostSet({{"a", 2}, {"b", 4}, {"c", 4}}));
  steps(15);
  EXPECT_EQ(driver->record().generation, 2);
  // a leaves: b takes ranks 0-3.
  discovery.set(HostSet({{"b", 4}, {"c", 4}}));
  steps(15);
  EXPECT_EQ(driver->record().generation, 3);
  EXPECT_EQ(driver->plan().to_string(), "4 ranks: b[0-3]");
  // Everything but one slot goes: below --min-np the running workers are kept.
  discovery.set(HostSet({{"c", 1}}));
  steps(15);
  EXPECT_EQ(launcher.running().size(), 4u);
  EXPECT_EQ(driver->record().generation, 3);
  // A worker fails: the job waits for --min-np slots, then the elastic timeout ends it.
  launcher.finish(launcher.running_rank(1), ExitStatus{5, 0});
  steps(2);
  EXPECT_TRUE(launcher.running().empty());
  auto code = steps(400);
  EXPECT_EQ(code, 5);
}

TEST_F(DriverTest, DiscoveryErrorsKeepTheJobRunning) {
  discovery.set(HostSet({{"a", 2}}));
  make(elastic(2, 2, 2));
  ASSERT_TRUE(driver->start());
  steps(1);
  discovery.set_error("script exited with exit code 1");
  EXPECT_FALSE(steps(30));
  EXPECT_EQ(driver->record().generation, 1);
  EXPECT_EQ(launcher.running().size(), 2u);
}

TEST_F(DriverTest, FirstDiscoveryFailureFailsTheStart) {
  discovery.set_error("bad line 1");
  make(elastic(2, 2, 2));
  Status s = driver->start();
  EXPECT_FALSE(s);
  EXPECT_NE(s.message().find("bad line 1"), std::string::npos);
}

TEST_F(DriverTest, HostFailingTwiceIsBlacklistedAndTheJobGoesOnWithoutIt) {
  discovery.set(HostSet({{"a", 2}, {"b", 2}}));
  auto o = elastic(4, 2, 4);
  o.blacklist_after = 2;
  o.cooldown_min_s = 60;
  make(o);
  ASSERT_TRUE(driver->start());
  steps(1);
  for (int i = 0; i < 2; ++i) {
    launcher.finish(launcher.running_rank(3), ExitStatus{1, 0});
    steps(2);
  }
  EXPECT_TRUE(driver->host_manager().is_blacklisted("b"));
  EXPECT_EQ(driver->plan().to_string(), "2 ranks: a[0-1]");
  EXPECT_EQ(launcher.running().size(), 2u);
  // After the cooldown b is used again.
  clock.advance(std::chrono::seconds(61));
  steps(15);
  EXPECT_EQ(driver->plan().size(), 4);
}

TEST_F(DriverTest, AfterOneWorkerSucceedsTheOthersMayFinish) {
  discovery.set(HostSet({{"a", 3}}));
  DriverOptions o;
  o.np = o.min_np = o.max_np = 3;
  o.finish_timeout = std::chrono::seconds(10);
  make(o);
  ASSERT_TRUE(driver->start());
  steps(1);
  launcher.finish(launcher.running_rank(0), ExitStatus{0, 0});
  EXPECT_FALSE(steps(20));
  EXPECT_EQ(launcher.running().size(), 2u);  // not killed
  finish_all(ExitStatus{0, 0});
  EXPECT_EQ(steps(1), 0);
}

TEST_F(DriverTest, StragglersPastTheFinishTimeoutAreStopped) {
  discovery.set(HostSet({{"a", 2}}));
  DriverOptions o;
  o.np = o.min_np = o.max_np = 2;
  o.finish_timeout = std::chrono::seconds(2);
  make(o);
  ASSERT_TRUE(driver->start());
  steps(1);
  launcher.finish(launcher.running_rank(0), ExitStatus{0, 0});
  auto code = steps(40);
  EXPECT_EQ(code, 1);
  EXPECT_TRUE(launcher.running().empty());
}

TEST_F(DriverTest, StopRequestForwardsAndExitsWith128PlusSignal) {
  discovery.set(HostSet({{"a", 2}}));
  DriverOptions o;
  o.np = o.min_np = o.max_np = 2;
  make(o);
  ASSERT_TRUE(driver->start());
  steps(1);
  driver->request_stop(SIGTERM);
  EXPECT_EQ(steps(1), 128 + SIGTERM);
  EXPECT_TRUE(launcher.running().empty());
}

// A host's agent is lost (its worker ends with 255) and the workers on the
// other host fail a few milliseconds later, all found at the same look: the
// failure that came first is the generation's, so the lost host is the one
// blacklisted, not the host of rank 0.
TEST_F(DriverTest, TheFirstEndAmongThoseFoundTogetherIsTheFailure) {
  discovery.set(HostSet({{"a", 1}, {"b", 1}, {"c", 1}}));
  auto o = elastic(3, 1, 3);
  o.blacklist_after = 1;
  make(o);
  ASSERT_TRUE(driver->start());
  steps(1);
  ASSERT_EQ(launcher.running().size(), 3u);
  const TimePoint t = clock.now();
  auto lost = launcher.running_rank(1);  // neither the lowest rank nor the highest
  ASSERT_EQ(lost->spec.host, "b");
  auto r0 = launcher.running_rank(0), r2 = launcher.running_rank(2);
  launcher.finish(r2, ExitStatus{4, 0}, t + std::chrono::milliseconds(3));
  launcher.finish(r0, ExitStatus{4, 0}, t + std::chrono::milliseconds(4));
  launcher.finish(lost, ExitStatus{255, 0}, t);
  steps(3);
  EXPECT_TRUE(driver->host_manager().is_blacklisted("b"));
  EXPECT_FALSE(driver->host_manager().is_blacklisted("a"));
  EXPECT_FALSE(driver->host_manager().is_blacklisted("c"));
  EXPECT_EQ(driver->plan().to_string(), "2 ranks: a[0] c[1]");
  EXPECT_EQ(launcher.running().size(), 2u);
}

TEST_F(DriverTest, LaunchFailureCountsAsAFailureOfThatHost) {
  discovery.set(HostSet({{"a", 1}, {"b", 1}}));
  auto o = elastic(2, 1, 2);
  o.blacklist_after = 1;
  make(o);
  launcher.fail_launches_on("b");
  ASSERT_TRUE(driver->start());
  steps(3);
  EXPECT_TRUE(driver->host_manager().is_blacklisted("b"));
  EXPECT_EQ(driver->plan().to_string(), "1 rank: a[0]");
  EXPECT_EQ(launcher.running().size(), 1u);
}

}  // namespace
}  // namespace erun

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <sstream>

#include "runner/policies/crash_loop.h"

namespace erun {
namespace {

using namespace std::chrono_literals;

// Captures the default logger's lines for one test.
class LogCapture {
 public:
  LogCapture() : previous_(spdlog::default_logger()) {
    auto logger = std::make_shared<spdlog::logger>("capture", std::make_shared<spdlog::sinks::ostream_sink_mt>(out_));
    logger->set_level(spdlog::level::info);
    spdlog::set_default_logger(logger);
  }
  ~LogCapture() { spdlog::set_default_logger(previous_); }
  std::string text() const { return out_.str(); }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::logger> previous_;
};

TEST(CrashLoop, SameFailureEverywhereThreeTimesIsALoop) {
  CrashLoopDetector d(3, 60s);
  for (long g = 1; g <= 3; ++g) {
    d.generation_started(g, {"a", "b"});
    d.worker_failed("a", ExitStatus{127, 0});
    d.worker_failed("b", ExitStatus{127, 0});
    auto why = d.generation_failed(1s);
    if (g < 3) {
      EXPECT_FALSE(why) << g;
    } else {
      ASSERT_TRUE(why);
      EXPECT_NE(why->find("generations 1-3 (3 in a row) all failed with exit code 127"), std::string::npos) << *why;
      EXPECT_NE(why->find("command not found"), std::string::npos);
      EXPECT_NE(why->find("(a,b)"), std::string::npos);
    }
  }
}

TEST(CrashLoop, OneBadHostOrProgressOrADifferentStatusIsNoLoop) {
  // Only b ever fails (a's workers are stopped by erun): the blacklist's job.
  CrashLoopDetector bad_host(3, 60s);
  for (long g = 1; g <= 6; ++g) {
    bad_host.generation_started(g, {"a", "b"});
    bad_host.worker_failed("b", ExitStatus{1, 0});
    EXPECT_FALSE(bad_host.generation_failed(1s));
  }
  EXPECT_EQ(bad_host.streak(), 6);
  // Progress between failures resets the streak.
  CrashLoopDetector progress(3, 60s);
  for (long g = 1; g <= 6; ++g) {
    progress.generation_started(g, {"a"});
    progress.commit_seen(static_cast<unsigned long long>(g));
    progress.worker_failed("a", ExitStatus{1, 0});
    EXPECT_FALSE(progress.generation_failed(1s));
  }
  // A generation that ran past progress_after counts as progress.
  CrashLoopDetector slow(2, 60s);
  for (long g = 1; g <= 4; ++g) {
    slow.generation_started(g, {"a"});
    slow.worker_failed("a", ExitStatus{0, SIGSEGV});
    EXPECT_FALSE(slow.generation_failed(61s));
  }
  // Alternating statuses: never the same twice in a row.
  CrashLoopDetector mixed(2, 60s);
  for (long g = 1; g <= 4; ++g) {
    mixed.generation_started(g, {"a"});
    mixed.worker_failed("a", ExitStatus{g % 2 ? 1 : 2, 0});
    EXPECT_FALSE(mixed.generation_failed(1s));
  }
  // Off.
  CrashLoopDetector off(0, 60s);
  for (long g = 1; g <= 4; ++g) {
    off.generation_started(g, {"a"});
    off.worker_failed("a", ExitStatus{1, 0});
    EXPECT_FALSE(off.generation_failed(1s));
  }
}

TEST_F(DriverTest, CrashLoopEndsTheJobWithTheProgramsExitCode) {
  LogCapture log;
  discovery.set(HostSet({{"a", 2}, {"b", 2}}));
  auto o = elastic(4, 2, 4);
  o.blacklist_after = 100;
  make(o);
  ASSERT_TRUE(driver->start());
  std::optional<int> code;
  for (int g = 0; g < 10 && !code; ++g) {
    code = steps(1);
    if (code) break;
    finish_all(ExitStatus{127, 0});
    code = steps(2);
  }
  EXPECT_EQ(code, 127);
  EXPECT_EQ(driver->record().generation, 3);
  EXPECT_TRUE(launcher.running().empty());
  EXPECT_NE(log.text().find("crash loop: generations 1-3"), std::string::npos) << log.text();
  EXPECT_NE(log.text().find("root cause: gen 3"), std::string::npos) << log.text();
}

TEST_F(DriverTest, CrashLoopLimitZeroKeepsRestarting) {
  discovery.set(HostSet({{"a", 2}}));
  auto o = elastic(2, 1, 2);
  o.blacklist_after = 100;
  o.crash_loop_limit = 0;
  make(o);
  ASSERT_TRUE(driver->start());
  steps(1);
  for (int g = 0; g < 6; ++g) {
    finish_all(ExitStatus{127, 0});
    EXPECT_FALSE(steps(2));
  }
  EXPECT_EQ(driver->record().generation, 7);
}

TEST_F(DriverTest, FinishingAfterAFailureSaysWhoFinishedWhoFailedAndWhy) {
  LogCapture log;
  discovery.set(HostSet({{"a", 3}}));
  auto o = elastic(3, 1, 3);
  make(o);
  ASSERT_TRUE(driver->start());
  steps(1);
  launcher.set_obey_terminate(false);
  launcher.finish(launcher.running_rank(0), ExitStatus{0, 0});
  steps(1);
  launcher.finish(launcher.running_rank(2), ExitStatus{0, SIGSEGV});
  launcher.set_obey_terminate(true);
  auto code = steps(5);
  EXPECT_EQ(code, 128 + SIGSEGV);
  auto text = log.text();
  EXPECT_NE(text.find("gen 1: a rank 0 finished successfully"), std::string::npos) << text;
  EXPECT_NE(text.find("then a rank 2 failed with signal 11"), std::string::npos) << text;
  EXPECT_NE(text.find("a job cannot restart once a worker has finished"), std::string::npos) << text;
  EXPECT_EQ(text.find("after the first worker finished, others still run"), std::string::npos) << text;
}

TEST_F(DriverTest, StragglerMessageNamesTheFinishedAndTheStillRunningRanks) {
  LogCapture log;
  discovery.set(HostSet({{"a", 2}}));
  DriverOptions o;
  o.np = o.min_np = o.max_np = 2;
  o.finish_timeout = std::chrono::seconds(2);
  make(o);
  ASSERT_TRUE(driver->start());
  steps(1);
  launcher.finish(launcher.running_rank(0), ExitStatus{0, 0});
  EXPECT_EQ(steps(40), 1);
  auto text = log.text();
  EXPECT_NE(text.find("gen 1: stopping 1 worker still running (rank 1 on a): a rank 0 finished successfully"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("did not finish within --finish-timeout 2 s"), std::string::npos) << text;
}

// Every pair of phases and of worker states: exactly these changes are allowed.
TEST(DriverStates, OnlyTheseTransitionsAreAllowed) {
  using P = JobPhase;
  const std::vector<P> phases{P::kWaitingForHosts, P::kWaitingWithSurvivors, P::kRunning,
                              P::kFinishing,       P::kStopping,             P::kDone};
  const std::set<std::pair<P, P>> allowed{
      {P::kWaitingForHosts, P::kRunning},       {P::kWaitingForHosts, P::kStopping},
      {P::kWaitingForHosts, P::kDone},          {P::kWaitingWithSurvivors, P::kRunning},
      {P::kWaitingWithSurvivors, P::kWaitingForHosts}, {P::kWaitingWithSurvivors, P::kStopping},
      {P::kWaitingWithSurvivors, P::kDone},  // another driver took the job over
      {P::kRunning, P::kWaitingWithSurvivors},  {P::kRunning, P::kFinishing},
      {P::kRunning, P::kStopping},              {P::kRunning, P::kDone},
      {P::kFinishing, P::kStopping},            {P::kFinishing, P::kDone},
      {P::kStopping, P::kWaitingForHosts},      {P::kStopping, P::kDone},
  };
  for (P from : phases) {
    for (P to : phases) {
      EXPECT_EQ(transition_allowed(from, to), from == to || allowed.count({from, to}) > 0)
          << to_string(from) << " -> " << to_string(to);
    }
  }
  using W = WorkerState;
  const std::vector<W> states{W::kPending, W::kMember, W::kRetiring, W::kDismissed, W::kExcluded, W::kStopping};
  const std::set<std::pair<W, W>> allowed_w{
      {W::kPending, W::kMember},    {W::kPending, W::kRetiring},  {W::kPending, W::kDismissed},
      {W::kPending, W::kExcluded},  {W::kPending, W::kStopping},  {W::kMember, W::kRetiring},
      {W::kMember, W::kDismissed},  {W::kMember, W::kExcluded},   {W::kMember, W::kStopping},
      {W::kRetiring, W::kDismissed}, {W::kRetiring, W::kExcluded}, {W::kDismissed, W::kExcluded},
      {W::kStopping, W::kExcluded},
  };
  for (W from : states) {
    for (W to : states) {
      EXPECT_EQ(transition_allowed(from, to), from == to || allowed_w.count({from, to}) > 0)
          << to_string(from) << " -> " << to_string(to);
    }
  }
  // A worker's stage: a standby gets ready and is promoted; a pending one,
  // admitted, is fresh until a member of a complete generation.
  using S = WorkerStage;
  const std::vector<S> stages{S::kStandby, S::kStandbyReady, S::kReplacement, S::kGrowth, S::kFresh, S::kSettled};
  const std::set<std::pair<S, S>> allowed_s{
      {S::kStandby, S::kStandbyReady},     {S::kStandby, S::kReplacement}, {S::kStandby, S::kGrowth},
      {S::kStandbyReady, S::kReplacement}, {S::kStandbyReady, S::kGrowth}, {S::kReplacement, S::kFresh},
      {S::kGrowth, S::kFresh},             {S::kFresh, S::kSettled},
  };
  for (S from : stages) {
    for (S to : stages) {
      EXPECT_EQ(transition_allowed(from, to), from == to || allowed_s.count({from, to}) > 0)
          << to_string(from) << " -> " << to_string(to);
    }
  }
}

TEST_F(DriverTest, ASuccessfulJobGoesFromWaitingToRunningToFinishingToDone) {
  discovery.set(HostSet({{"a", 2}}));
  DriverOptions o;
  o.np = o.min_np = o.max_np = 2;
  make(o);
  ASSERT_TRUE(driver->start());
  EXPECT_EQ(driver->phase(), JobPhase::kWaitingForHosts);
  EXPECT_FALSE(steps(1));
  EXPECT_EQ(driver->phase(), JobPhase::kRunning);
  launcher.finish(launcher.running_rank(0), ExitStatus{0, 0});
  EXPECT_FALSE(steps(1));
  EXPECT_EQ(driver->phase(), JobPhase::kFinishing);
  launcher.finish(launcher.running_rank(1), ExitStatus{0, 0});
  EXPECT_EQ(steps(1), 0);
  EXPECT_EQ(driver->phase(), JobPhase::kDone);
  EXPECT_EQ(steps(1), 0);  // done stays done
}

// A restart stops the workers in a phase of its own, timed by the Clock: a
// worker that ignores SIGTERM is killed once --term-grace + 2 s of the
// driver's clock passed, and the next generation starts only after that.
TEST_F(DriverTest, StoppingForARestartIsAPhaseTimedByTheClock) {
  discovery.set(HostSet({{"a", 2}}));
  auto o = elastic(2, 1, 2);
  make(o);
  driver = nullptr;
  o.command = {"./train"};
  o.term_grace = std::chrono::seconds(3);
  DriverDeps d;
  d.discovery = &discovery;
  d.local_launcher = &launcher;
  d.clock = &clock;
  d.synchronous_discovery = true;
  driver = std::make_unique<Driver>(o, d);
  ASSERT_TRUE(driver->start());
  EXPECT_FALSE(steps(1));
  launcher.set_obey_terminate(false);
  auto stubborn = launcher.running_rank(0);
  launcher.finish(launcher.running_rank(1), ExitStatus{1, 0});
  EXPECT_FALSE(steps(1));
  EXPECT_EQ(driver->phase(), JobPhase::kStopping);
  EXPECT_TRUE(stubborn->terminated);
  EXPECT_FALSE(steps(45));  // 4.5 s of the 5 s
  EXPECT_EQ(driver->phase(), JobPhase::kStopping);
  EXPECT_FALSE(stubborn->killed);
  EXPECT_EQ(driver->record().generation, 1);
  EXPECT_FALSE(steps(10));
  EXPECT_TRUE(stubborn->killed);
  EXPECT_EQ(driver->phase(), JobPhase::kRunning);
  EXPECT_EQ(driver->record().generation, 2);
  EXPECT_EQ(launcher.running().size(), 2u);
}

TEST_F(DriverTest, ASecondSignalWhileStoppingKillsAtOnce) {
  discovery.set(HostSet({{"a", 2}}));
  DriverOptions o;
  o.np = o.min_np = o.max_np = 2;
  make(o);
  ASSERT_TRUE(driver->start());
  EXPECT_FALSE(steps(1));
  launcher.set_obey_terminate(false);
  driver->request_stop(SIGINT);
  EXPECT_FALSE(steps(1));
  EXPECT_EQ(driver->phase(), JobPhase::kStopping);
  for (auto& w : launcher.running()) EXPECT_EQ(w->signals, std::vector<int>{SIGINT});
  driver->request_stop(SIGKILL);
  EXPECT_EQ(steps(1), 128 + SIGINT);  // the first signal names the job's end
  for (auto& w : launcher.launched()) EXPECT_TRUE(w->killed);
}

TEST_F(DriverTest, WaitingForHostsEndsAfterTheElasticTimeout) {
  discovery.set(HostSet({{"a", 1}}));
  auto o = elastic(2, 2, 2);
  make(o);
  ASSERT_TRUE(driver->start());
  EXPECT_FALSE(steps(290));
  EXPECT_EQ(driver->phase(), JobPhase::kWaitingForHosts);
  EXPECT_TRUE(launcher.launched().empty());
  EXPECT_EQ(steps(20), 1);
  EXPECT_EQ(driver->phase(), JobPhase::kDone);
}

// A driver replaced while it was frozen or cut off whose agents could not
// tell it (the SUPERSEDED line lost): its record keeper finds the newer
// term in the job record, stops keeping that driver's heartbeat, and the
// driver leaves the job to it (exit 3) without touching the workers.
TEST_F(DriverTest, ADriverWhoseRecordNamesANewerTermLeavesTheJob) {
  testing::TempDir dir;
  auto store = JobStore::lock(dir.file("jobs"), "j");
  ASSERT_TRUE(store.is_ok()) << store.message();
  JobRecord base;
  base.name = "j";
  base.job_id = "job";
  base.term = 1;
  base.driver_pid = 100;
  base.driver_host = "login1";
  base.secret = "s3cret";
  RecordKeeper keeper(*store.value(), base, {&launcher});
  discovery.set(HostSet({{"a", 2}}));
  DriverOptions o = elastic(2, 1, 2);
  DriverDeps d;
  d.record_superseded = [&keeper] { return keeper.superseded(); };
  make(o, d);
  ASSERT_TRUE(driver->start());
  EXPECT_FALSE(steps(1));
  keeper(*driver);
  ASSERT_TRUE(store.value()->read());
  EXPECT_EQ(store.value()->read()->term, 1u);
  EXPECT_FALSE(steps(1));
  keeper(*driver);
  EXPECT_EQ(keeper.superseded(), 0u) << "its own record";

  auto other = JobStore::open_unlocked(dir.file("jobs"), "j");  // a standby that took the job over
  ASSERT_TRUE(other.is_ok()) << other.message();
  JobRecord taken = *store.value()->read();
  taken.term = 2;
  taken.driver_pid = 200;
  ASSERT_TRUE(other.value()->write(taken).is_ok());
  const std::string stamp = record_stamp(dir.file("jobs"), "j");
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // a heartbeat is due
  keeper(*driver);
  EXPECT_EQ(keeper.superseded(), 2u);
  EXPECT_EQ(record_stamp(dir.file("jobs"), "j"), stamp) << "the new driver's heartbeat kept by the old one";
  const size_t running = launcher.running().size();
  EXPECT_EQ(steps(1), 3);
  EXPECT_EQ(driver->superseded_by(), 2u);
  EXPECT_EQ(launcher.running().size(), running) << "a worker stopped by the replaced driver";
  EXPECT_EQ(store.value()->read()->driver_pid, 200) << "the record written back";
}

}  // namespace
}  // namespace erun
