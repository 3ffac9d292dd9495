#include "runner/observe/job_account.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace erun {
namespace {

// An event line as EventLog writes it: `at` seconds after 12:00:00 of a day,
// from a driver that started `driver_start` seconds after it.
std::string line(double at, const std::string& event, const std::string& fields = "", double driver_start = 0) {
  const int ms = static_cast<int>(std::lround(at * 1000));
  return fmt::format(R"({{"time":"2026-11-28T12:{:02d}:{:02d}.{:03d}Z","t":{:.3f},"event":"{}"{}{}}})",
                     ms / 60000, (ms / 1000) % 60, ms % 1000, at - driver_start, event, fields.empty() ? "" : ",",
                     fields);
}

double sum(const JobSummary& s) { return std::accumulate(s.spent.begin(), s.spent.end(), 0.0); }
double spent(const JobSummary& s, Spent k) { return s.spent[static_cast<int>(k)]; }

// A job like the demo's: start, a grow, a worker killed (its survivors roll
// back 0.4 s of work), a shrink, the end.
JobAccount demo_job() {
  JobAccount a;
  for (const std::string& l : {
           line(0.0, "job_started", R"("job_id":"erun-1","hosts":"node-a:2","min_np":1,"max_np":4)"),
           line(0.0, "generation_started", R"("generation":1,"size":2,"plan":"2 ranks")"),
           line(1.0, "generation_joined", R"("generation":1,"seconds":1.0)"),
           line(10.0, "hosts_changed", R"("hosts":"node-a:2,node-b:2")"),
           line(11.0, "reset", R"("generation":1,"reason":"membership changed","resets":1)"),
           line(11.0, "generation_started", R"("generation":2,"size":4,"plan":"4 ranks")"),
           line(11.5, "generation_joined", R"("generation":2,"seconds":0.5)"),
           line(20.0, "worker_exited",
                R"("generation":2,"host":"node-b","rank":3,"exit_code":137,"stopped_by_erun":false)"),
           line(20.0, "reset", R"("generation":2,"reason":"worker failed","resets":2)"),
           line(20.0, "generation_started", R"("generation":3,"size":3,"plan":"3 ranks")"),
           line(20.2, "generation_joined", R"("generation":3,"seconds":0.2)"),
           line(20.2, "rolled_back", R"("generation":3,"commit":24,"seconds":0.4)"),
           line(30.0, "hosts_changed", R"("hosts":"node-b:2")"),
           line(30.0, "reset", R"("generation":3,"reason":"membership changed","resets":3)"),
           line(30.0, "generation_started", R"("generation":4,"size":2,"plan":"2 ranks")"),
           line(30.1, "generation_joined", R"("generation":4,"seconds":0.1)"),
           line(30.2, "worker_exited",
                R"("generation":4,"host":"node-a","rank":0,"exit_code":143,"stopped_by_erun":true)"),
           line(40.0, "job_finished", R"("exit_code":0,"generation":4,"resets":3,"launched":6)"),
       }) {
    EXPECT_TRUE(a.observe_line(l)) << l;
  }
  return a;
}

TEST(JobAccount, ThePartsAddUpToTheWallTime) {
  JobSummary s = demo_job().summary(1e12);
  EXPECT_TRUE(s.finished);
  EXPECT_EQ(s.exit_code, 0);
  EXPECT_NEAR(s.wall_s, 40.0, 1e-6);
  EXPECT_NEAR(sum(s), s.wall_s, 1e-6);
  EXPECT_NEAR(spent(s, Spent::kStartup), 1.0, 1e-6);
  // 1 to 11, 11.5 to 20, 20.2 to 30, 30.1 to 40, less 0.4 rolled back
  EXPECT_NEAR(s.training_s(), 10 + 8.5 + 9.8 + 9.9 - 0.4, 1e-6);
  EXPECT_NEAR(spent(s, Spent::kRecovery), 0.5 + 0.2 + 0.1, 1e-6);
  EXPECT_NEAR(spent(s, Spent::kRolledBack), 0.4, 1e-6);
  EXPECT_NEAR(s.goodput(), s.training_s() / 40.0, 1e-9);
}

TEST(JobAccount, CountsWhatHappened) {
  JobSummary s = demo_job().summary(1e12);
  EXPECT_EQ(s.job_id, "erun-1");
  EXPECT_EQ(s.generations, 4);
  EXPECT_EQ(s.resets_total(), 3);
  EXPECT_EQ(s.resets["membership changed"], 2);
  EXPECT_EQ(s.resets["worker failed"], 1);
  EXPECT_EQ(s.hosts_seen, 2);
  EXPECT_EQ(s.workers_failed, 1);  // the one erun stopped is no failure
  EXPECT_EQ(s.workers_launched, 6);
  EXPECT_NEAR(s.slowest_recovery_s, 0.5, 1e-6);
  EXPECT_EQ(s.slowest_recovery_generation, 2);
  EXPECT_EQ(s.slowest_recovery_reason, "membership changed");
  const std::string text = format_summary(s);
  EXPECT_NE(text.find("goodput 94.5 %"), std::string::npos) << text;
  EXPECT_NE(text.find("1 worker failed"), std::string::npos) << text;
  EXPECT_NE(text.find("slowest recovery: 0.50 s (generation 2"), std::string::npos) << text;
}

TEST(JobAccount, ARunningJobIsCountedUpToNow) {
  JobAccount a;
  a.observe_line(line(0, "job_started", R"("job_id":"j","hosts":"h:1")"));
  a.observe_line(line(0, "generation_started", R"("generation":1,"size":1)"));
  a.observe_line(line(2, "generation_joined", R"("generation":1)"));
  const double start = a.start_time();
  JobSummary s = a.summary(start + 10);
  EXPECT_FALSE(s.finished);
  EXPECT_NEAR(s.wall_s, 10, 1e-6);
  EXPECT_NEAR(s.training_s(), 8, 1e-6);
  EXPECT_EQ(a.world_size(), 1);
  EXPECT_EQ(a.phase(), Spent::kTraining);
}

TEST(JobAccount, SurvivorsWaitingForMinNpIsItsOwnLoss) {
  JobAccount a;
  a.observe_line(line(0, "job_started", R"("job_id":"j","hosts":"h:2")"));
  a.observe_line(line(0, "generation_started", R"("generation":1,"size":2)"));
  a.observe_line(line(1, "generation_joined", R"("generation":1)"));
  a.observe_line(line(5, "reset", R"("reason":"worker failed")"));
  a.observe_line(line(5, "survivors_waiting", R"("generation":1,"usable_slots":1)"));
  a.observe_line(line(9, "generation_started", R"("generation":2,"size":2)"));
  a.observe_line(line(9.5, "generation_joined", R"("generation":2)"));
  a.observe_line(line(12, "job_finished", R"("exit_code":0)"));
  JobSummary s = a.summary(0);
  EXPECT_NEAR(spent(s, Spent::kWaiting), 4, 1e-6);
  EXPECT_NEAR(spent(s, Spent::kRecovery), 0.5, 1e-6);
  EXPECT_NEAR(s.slowest_recovery_s, 4.5, 1e-6);  // reset to joined, waiting included
  EXPECT_NEAR(sum(s), 12, 1e-6);
}

TEST(JobAccount, ANewDriverInTheSameLogIsADriverGapNotANewJob) {
  JobAccount a;
  a.observe_line(line(0, "job_started", R"("job_id":"j","hosts":"h:2")"));
  a.observe_line(line(0, "generation_started", R"("generation":1,"size":2)"));
  a.observe_line(line(1, "generation_joined", R"("generation":1)"));
  // the first erun is SIGKILLed at about 10 s; a second starts at 30 s and
  // attaches 0.5 s later: the workers trained through the gap
  a.observe_line(line(30.5, "driver_attached", R"("term":2,"generation":1,"workers":2)", 30));
  a.observe_line(line(40, "job_finished", R"("exit_code":0)", 30));
  JobSummary s = a.summary(0);
  EXPECT_NEAR(s.wall_s, 40, 1e-6);
  EXPECT_NEAR(spent(s, Spent::kDriverGap), 0.5, 1e-6);
  EXPECT_NEAR(s.training_s(), 29 + 9.5, 1e-6);
  EXPECT_EQ(s.takeovers, 1);
}

// The survivors can re-join (and the driver write `rolled_back`) before the
// driver has reset the generation: the work thrown away is then part of the
// training still in progress, and counts all the same.
// Restart mode with a program that does not use erun's library: no
// generation ever joins, so erun cannot tell start-up from training, and the
// summary says so instead of "goodput 0.0 %".
TEST(JobAccount, AJobWhoseGenerationsNeverJoinedHasNoGoodputToSay) {
  JobAccount a;
  for (const std::string& l : {
           line(0.0, "job_started", R"("job_id":"erun-1","hosts":"node-a:2","min_np":2,"max_np":2)"),
           line(0.0, "generation_started", R"("generation":1,"size":2,"plan":"2 ranks")"),
           line(30.0, "job_finished", R"("exit_code":0,"generation":1,"resets":0,"launched":2)"),
       }) {
    ASSERT_TRUE(a.observe_line(l)) << l;
  }
  JobSummary s = a.summary(1e12);
  EXPECT_EQ(s.joined, 0);
  const std::string text = format_summary(s);
  EXPECT_NE(text.find("in 30.00 s: goodput n/a (no generation joined"), std::string::npos) << text;
  EXPECT_EQ(demo_job().summary(1e12).goodput_text().find("n/a"), std::string::npos);
}

TEST(JobAccount, ARollbackBeforeTheResetIsCountedInFull) {
  JobAccount a;
  for (const std::string& l : {
           line(0.0, "job_started", R"("job_id":"erun-1","hosts":"node-a:2","min_np":1,"max_np":2)"),
           line(0.0, "generation_started", R"("generation":1,"size":2,"plan":"2 ranks")"),
           line(1.0, "generation_joined", R"("generation":1,"seconds":1.0)"),
           line(9.0, "worker_exited",
                R"("generation":1,"host":"node-a","rank":1,"exit_code":137,"stopped_by_erun":false)"),
           line(9.05, "rolled_back", R"("generation":1,"commit":12,"seconds":0.3)"),
           line(9.1, "reset", R"("generation":1,"reason":"worker failed","resets":1)"),
           line(9.1, "generation_started", R"("generation":2,"size":2,"plan":"2 ranks")"),
           line(9.6, "generation_joined", R"("generation":2,"seconds":0.5)"),
           line(20.0, "job_finished", R"("exit_code":0,"generation":2,"resets":1,"launched":3)"),
       }) {
    ASSERT_TRUE(a.observe_line(l)) << l;
  }
  JobSummary s = a.summary(1e12);
  EXPECT_NEAR(spent(s, Spent::kRolledBack), 0.3, 1e-6);
  EXPECT_NEAR(s.training_s(), (9.1 - 1.0) + (20.0 - 9.6) - 0.3, 1e-6);
  EXPECT_NEAR(spent(s, Spent::kRecovery), 0.5, 1e-6);
  EXPECT_NEAR(sum(s), s.wall_s, 1e-6);

  // Counted up to a moment between the two events, nothing is negative.
  JobAccount live;
  for (const std::string& l : {
           line(0.0, "job_started", R"("job_id":"erun-1","hosts":"node-a:2","min_np":1,"max_np":2)"),
           line(1.0, "generation_joined", R"("generation":1,"seconds":1.0)"),
           line(1.05, "rolled_back", R"("generation":1,"commit":1,"seconds":5)"),
       }) {
    ASSERT_TRUE(live.observe_line(l)) << l;
  }
  s = live.summary(0);
  EXPECT_NEAR(spent(s, Spent::kRolledBack), 0.05, 1e-6) << "never more than was trained";
  EXPECT_NEAR(s.training_s(), 0.0, 1e-6);
  EXPECT_NEAR(sum(s), s.wall_s, 1e-6);
}

TEST(JobAccount, RollbackIsDatedByTheCommitsSeen) {
  JobAccount a;
  a.observe_line(line(0, "job_started", R"("job_id":"j","hosts":"h:2")"));
  const double t0 = a.start_time();
  a.commit_seen(5, t0 + 3);
  a.commit_seen(6, t0 + 4);
  a.commit_seen(6, t0 + 4.5);  // the same commit from another rank: not newer
  EXPECT_EQ(a.last_commit(), 6u);
  EXPECT_NEAR(a.last_commit_time(), t0 + 4, 1e-9);
  EXPECT_NEAR(*a.rolled_back_to(6, t0 + 4.6), 0.6, 1e-3) << "no fault seen yet: up to now";
  a.observe_line(line(4.75, "reset", R"("reason":"worker failed")"));
  const double later = t0 + 9;  // the reset dates it, not the moment of asking
  ASSERT_TRUE(a.rolled_back_to(6, later).has_value());
  EXPECT_NEAR(*a.rolled_back_to(6, later), 0.75, 1e-3);
  EXPECT_NEAR(*a.rolled_back_to(5, later), 1.75, 1e-3);
  EXPECT_NEAR(*a.rolled_back_to(7, later), 0.0, 1e-3) << "a commit after the last seen: at the pace of the others, "
                                                        "never after the fault";
  EXPECT_FALSE(a.rolled_back_to(4, later).has_value()) << "before every commit seen";
  // A survivor that says when it made the commit dates it, seen or not.
  EXPECT_NEAR(*a.rolled_back_to(7, later, t0 + 2.5), 2.25, 1e-3);
  EXPECT_NEAR(*a.rolled_back_to(6, later, t0 + 3.9), 0.85, 1e-3) << "before the report of it arrived";
  EXPECT_NEAR(*a.rolled_back_to(4, later, t0 + 1), 3.75, 1e-3);
  EXPECT_NEAR(*a.rolled_back_to(8, later, t0 + 5), 0.0, 1e-3) << "never negative";
}

// Before the reset, the failure dates it; before the driver has seen the
// failure (its survivors can report it first), the moment of asking does,
// not a failure of an earlier generation.
TEST(JobAccount, ARollbackBeforeItsResetIsDatedByThisGenerationsFailure) {
  JobAccount a;
  a.observe_line(line(0, "job_started", R"("job_id":"j","hosts":"h:2")"));
  a.observe_line(line(1, "generation_joined", R"("generation":1)"));
  const double t0 = a.start_time();
  a.commit_seen(5, t0 + 3);
  a.commit_seen(6, t0 + 4);
  a.observe_line(line(4.5, "worker_exited", R"("generation":1,"host":"h","rank":1,"exit_code":9)"));
  EXPECT_NEAR(*a.rolled_back_to(6, t0 + 4.6), 0.5, 1e-3);
  a.observe_line(line(4.6, "reset", R"("reason":"worker failed")"));
  a.observe_line(line(5, "generation_joined", R"("generation":2)"));
  a.commit_seen(8, t0 + 6);
  EXPECT_NEAR(*a.rolled_back_to(8, t0 + 6.5), 0.5, 1e-3) << "the failure at 4.5 belongs to generation 1";
}

TEST(JobAccount, ACommitNeverReportedIsDatedBetweenTheOnesThatWere) {
  JobAccount a;
  a.observe_line(line(0, "job_started", R"("job_id":"j","hosts":"h:2")"));
  const double t0 = a.start_time();
  a.commit_seen(10, t0 + 1);
  a.commit_seen(14, t0 + 2);  // 11 to 13 came faster than the reports
  a.observe_line(line(3, "reset", R"("reason":"worker failed")"));
  EXPECT_NEAR(*a.rolled_back_to(12, t0 + 9), 1.5, 1e-3);
  EXPECT_NEAR(*a.rolled_back_to(16, t0 + 9), 0.5, 1e-3) << "two ids after 14 at a quarter second each";
}

// The driver hands the account its events as they are; a report reads them
// back from the file: both readings give the same account.
TEST(JobAccount, EventsFedLiveAndTheirLogLinesAgree) {
  const std::vector<std::string> lines = {
      line(0.0, "job_started", R"("job_id":"erun-1","hosts":"node-a:2","min_np":1,"max_np":4)"),
      line(0.0, "generation_started", R"("generation":1,"size":2,"plan":"2 ranks")"),
      line(1.0, "generation_joined", R"("generation":1,"seconds":1.0)"),
      line(20.0, "worker_exited", R"("generation":1,"host":"node-b","rank":1,"exit_code":137,"stopped_by_erun":false)"),
      line(20.0, "reset", R"("generation":1,"reason":"worker failed","resets":1)"),
      line(20.0, "generation_started", R"("generation":2,"size":2,"plan":"2 ranks")"),
      line(20.2, "generation_joined", R"("generation":2,"seconds":0.2)"),
      line(20.2, "rolled_back", R"("generation":2,"commit":24,"seconds":0.4)"),
      line(30.5, "driver_attached", R"("term":2,"generation":2,"workers":2)", 30),
      line(40.0, "job_finished", R"("exit_code":0,"generation":2,"resets":1,"launched":3)", 30),
  };
  JobAccount from_file, live;
  for (const std::string& l : lines) {
    ASSERT_TRUE(from_file.observe_line(l)) << l;
    std::optional<LoggedEvent> e = parse_event_line(l);
    ASSERT_TRUE(e && e->event) << l;
    live.observe(e->stamp, *e->event);
  }
  EXPECT_EQ(live.timeline_json(0), from_file.timeline_json(0));
  EXPECT_EQ(format_summary(live.summary(0)), format_summary(from_file.summary(0)));
  EXPECT_EQ(live.summary(0).takeovers, 1);
  EXPECT_EQ(live.summary(0).workers_failed, 1);
  EXPECT_EQ(live.summary(0).workers_launched, 3);
}

// A new erun that takes a job over reads the job's event log back first:
// its account counts the job from its start, not the runs before it there.
TEST(JobAccount, ATakenOverJobIsRestoredFromItsLastRunInTheLog) {
  std::stringstream log;
  for (const std::string& l : {
           // the same command's run before, which ended
           line(0, "job_started", R"("job_id":"j","hosts":"h:2")"),
           line(1, "reset", R"("reason":"worker failed")"),
           line(2, "job_finished", R"("exit_code":0)"),
           line(2, "job_summary", R"("wall_s":2)"),
           // another job's run
           line(3, "job_started", R"("job_id":"other","hosts":"x:1")"),
           line(4, "reset", R"("reason":"worker failed")"),
           // this run, whose erun was killed after a failure
           line(10, "job_started", R"("job_id":"j","hosts":"h:2")", 10),
           line(10, "generation_started", R"("generation":1,"size":2)", 10),
           line(11, "generation_joined", R"("generation":1)", 10),
           line(15, "worker_exited", R"("generation":1,"host":"h","rank":1,"exit_code":137)", 10),
           line(15, "reset", R"("generation":1,"reason":"worker failed","resets":1)", 10),
           line(15, "generation_started", R"("generation":2,"size":2)", 10),
           line(16, "generation_joined", R"("generation":2)", 10),
           std::string("not an event"),
       }) {
    log << l << "\n";
  }
  JobAccount a;
  a.restore(log, "j");
  // The new erun's own events follow, live.
  for (const std::string& l : {line(30, "job_started", R"("job_id":"j","hosts":"h:2")", 29.9),
                               line(30.5, "driver_attached", R"("term":2,"generation":2,"workers":2)", 29.9),
                               line(40, "job_finished", R"("exit_code":0,"launched":0)", 29.9)}) {
    std::optional<LoggedEvent> e = parse_event_line(l);
    ASSERT_TRUE(e && e->event) << l;
    a.observe(e->stamp, *e->event);
  }
  JobSummary s = a.summary(1e12);
  EXPECT_NEAR(s.wall_s, 30, 1e-3) << "from this run's start";
  EXPECT_EQ(s.resets_total(), 1);
  EXPECT_EQ(s.workers_failed, 1);
  EXPECT_EQ(s.takeovers, 1);
  EXPECT_EQ(s.generations, 2);
  EXPECT_NEAR(spent(s, Spent::kDriverGap), 0.6, 1e-3) << "the new erun's start to its attaching";
  EXPECT_NEAR(sum(s), s.wall_s, 1e-6);
}

TEST(JobAccount, LinesThatAreNotEventsChangeNothing) {
  JobAccount a = demo_job();
  const JobSummary before = a.summary(0);
  for (std::string_view bad : {"", "{", "[1,2]", "{\"event\":\"reset\"}", "{\"time\":\"yesterday\",\"event\":\"x\"}",
                               "{\"time\":\"2026-11-28T12:00:41.000Z\",\"t\":41,\"event\":\"reset\"",
                               "not json at all"}) {
    EXPECT_FALSE(a.observe_line(bad)) << bad;
  }
  EXPECT_EQ(a.summary(0).wall_s, before.wall_s);
  EXPECT_EQ(a.summary(0).resets_total(), before.resets_total());
}

TEST(JobAccount, TheTimelineHasEveryGenerationPhaseAndFault) {
  JobAccount a = demo_job();
  const std::string j = a.timeline_json(0);
  EXPECT_NE(j.find(R"("job_id":"erun-1")"), std::string::npos) << j;
  EXPECT_NE(j.find(R"("label":"node-b rank 3 exited 137")"), std::string::npos) << j;
  auto doc = nlohmann::json::parse(j);
  bool failure_with_recovery = false;
  for (auto& e : doc["events"]) {
    if (e["kind"] == "failure" && e.contains("recovery_s")) {
      EXPECT_NEAR(e["recovery_s"].get<double>(), 0.2, 1e-6);
      failure_with_recovery = true;
    }
  }
  EXPECT_TRUE(failure_with_recovery) << j;
  double last_end = 0;
  for (auto& g : doc["generations"]) {
    EXPECT_GE(g["start"].get<double>(), last_end - 1e-9) << "generations follow each other: " << g.dump();
    EXPECT_LE(g["end"].get<double>(), 40.0 + 1e-9) << "times are seconds since the job started: " << g.dump();
    last_end = g["end"].get<double>();
  }
  EXPECT_NEAR(doc["generations"][1]["end"].get<double>(), 20.0, 1e-6);
  double phases = 0;
  for (auto& p : doc["phases"]) phases += p["end"].get<double>() - p["start"].get<double>();
  EXPECT_NEAR(phases, 40.0, 1e-6) << "the phases cover the job";
  EXPECT_NE(j.find(R"("label":"+node-b")"), std::string::npos) << j;
  EXPECT_NE(j.find(R"("label":"-node-a")"), std::string::npos) << j;
  EXPECT_NE(j.find(R"("generation":4)"), std::string::npos) << j;
  EXPECT_NE(j.find(R"("kind":"recovery")"), std::string::npos) << j;
}

}  // namespace
}  // namespace erun
