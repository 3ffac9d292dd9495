// The event log's schema (docs/event_log.md): every event type, written by
// the typed writer, is byte for byte the line the driver wrote before its
// events were typed (names, key order, number formats, escapes), and reads
// back into the same event.
#include "runner/observe/events.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "runner/observe/job_account.h"

namespace erun {
namespace {

// 2026-11-22T23:04:19.534Z, 12.018 s after its erun started.
constexpr Stamp kStamp{1795388659.534, 12.018};

JobSummary some_summary() {
  return JobSummary{.job_id = "job-0123456789ab",
                    .wall_s = 300.5,
                    .spent = {10.25, 250.125, 20.0, 5.5, 4.0, 10.625},
                    .generations = 7,
                    .resets = {{"worker failed", 3}, {"membership changed", 1}},
                    .hosts_seen = 5,
                    .workers_failed = 7,
                    .workers_launched = 11,
                    .commits_restored = 1,
                    .drains = 1,
                    .stragglers = 2,
                    .takeovers = 1,
                    .standbys_promoted = 1,
                    .slowest_recovery_s = 3.14159265,
                    .slowest_recovery_reason = "worker failed"};
}

// One of each event type, with the values the reference lines were written with.
std::vector<Event> every_event() {
  return {
      ev::JobStarted{.job_id = "job-0123456789ab", .hosts = "node-a:2,[fe80::1]:4", .min_np = 1, .max_np = 8},
      ev::DriverAttached{.term = 2, .generation = 7, .workers = 6, .hosts = 3},
      ev::HostsChanged{.hosts = "node-a:2,node-b:2"},
      ev::GenerationStarted{.generation = 3, .size = 4, .plan = "4 ranks: node-a[0-1] node-b[2-3]"},
      ev::GenerationJoined{.generation = 3, .seconds = 0.1846532},
      ev::CommitRestored{.generation = 3, .commit = 1234567890123, .host = "node-b"},
      ev::WorkerExited{.generation = 3, .host = "node-b", .rank = 3, .exit_code = 137, .oom_killed = true},
      ev::Reset{.generation = 3, .reason = "worker failed", .resets = 2},
      ev::PeersLost{.generation = 3, .ranks = "1,3"},
      ev::Rejoined{.generation = 3,
                   .host = "node-a",
                   .slot = 1,
                   .reason = "peer lost",
                   .failed_rank = 3,
                   .failed_state = "dead",
                   .commit = 42},
      ev::WorkerExcluded{.generation = 3, .host = "node-c", .rank = 5, .state = "alive but not arriving"},
      ev::SurvivorsWaiting{.generation = 4, .usable_slots = 1},
      ev::CrashLoop{.generations = 3},
      ev::HostDraining{
          .generation = 4, .host = "node-b", .reason = "SIGTERM to [gen 4] node-b rank 2 (pid 4242)", .workers = 2},
      ev::HostDrained{.generation = 4, .host = "node-b", .seconds = 12.5},
      ev::Straggler{.generation = 5,
                    .host = "node-c",
                    .slot = 0,
                    .rank = 2,
                    .factor = 2.3456789,
                    .interval = 1.5,
                    .without = 0.75,
                    .action = "evict",
                    .cooldown = 300.0},
      ev::PreflightHeldBack{.generation = 5,
                            .host = "node-d",
                            .slot = 1,
                            .check = "link",
                            .probe_ms = 1000.25,
                            .median_ms = 0.0,
                            .cooldown = 1234567.0},
      ev::HostBlacklisted{.host = "node-\"q\"\\x\n"},
      ev::Signal{.signal = 15},
      ev::StandbyReady{.host = "node-e", .slot = 0, .seconds = 3.25},
      ev::StandbyPromoted{.generation = 6, .host = "node-e", .slot = 0, .reason = "a member was lost"},
      ev::RolledBack{.generation = 6, .commit = 41, .seconds = 0.000123456789},
      ev::JobFinished{.exit_code = 0, .generation = 7, .resets = 4, .launched = 11},
      summary_event(some_summary()),
      summary_event(JobSummary{}),
  };
}

// What the driver wrote for the events above before they were typed (its
// EventLog::write with each call site's field list, commit 6546da2), the
// time stamps set to kStamp's: the schema, kept.
const std::vector<std::string> kReference = {
    R"j({"time":"2026-11-22T23:04:19.534Z","t":12.018,"event":"job_started","job_id":"job-0123456789ab","hosts":"node-a:2,[fe80::1]:4","min_np":1,"max_np":8})j",
    R"j({"time":"2026-11-22T23:04:19.534Z","t":12.018,"event":"driver_attached","term":2,"generation":7,"workers":6,"hosts":3})j",
    R"j({"time":"2026-11-22T23:04:19.534Z","t":12.018,"event":"hosts_changed","hosts":"node-a:2,node-b:2"})j",
    R"j({"time":"2026-11-22T23:04:19.534Z","t":12.018,"event":"generation_started","generation":3,"size":4,"plan":"4 ranks: node-a[0-1] node-b[2-3]"})j",
    R"j({"time":"2026-11-22T23:04:19.534Z","t":12.018,"event":"generation_joined","generation":3,"seconds":0.184653})j",
    R"j({"time":"2026-11-22T23:04:19.534Z","t":12.018,"event":"commit_restored","generation":3,"commit":1234567890123,"host":"node-b"})j",
    R"j({"time":"2026-11-22T23:04:19.534Z","t":12.018,"event":"worker_exited","generation":3,"host":"node-b","rank":3,"exit_code":137,"oom_killed":true,"stopped_by_erun":false,"standby":false})j",
    R"j({"time":"2026-11-22T23:04:19.534Z","t":12.018,"event":"reset","generation":3,"reason":"worker failed","resets":2})j",
    R"j({"time":"2026-11-22T23:04:19.534Z","t":12.018,"event":"peers_lost","generation":3,"ranks":"1,3"})j",
    R"j({"time":"2026-11-22T23:04:19.534Z","t":12.018,"event":"rejoined","generation":3,"host":"node-a","slot":1,"reason":"peer lost","failed_rank":3,"failed_state":"dead","commit":42})j",
    R"j({"time":"2026-11-22T23:04:19.534Z","t":12.018,"event":"worker_excluded","generation":3,"host":"node-c","rank":5,"state":"alive but not arriving"})j",
    R"j({"time":"2026-11-22T23:04:19.534Z","t":12.018,"event":"survivors_waiting","generation":4,"usable_slots":1})j",
    R"j({"time":"2026-11-22T23:04:19.534Z","t":12.018,"event":"crash_loop","generations":3})j",
    R"j({"time":"2026-11-22T23:04:19.534Z","t":12.018,"event":"host_draining","generation":4,"host":"node-b","reason":"SIGTERM to [gen 4] node-b rank 2 (pid 4242)","workers":2})j",
    R"j({"time":"2026-11-22T23:04:19.534Z","t":12.018,"event":"host_drained","generation":4,"host":"node-b","seconds":12.5})j",
    R"j({"time":"2026-11-22T23:04:19.534Z","t":12.018,"event":"straggler","generation":5,"host":"node-c","slot":0,"rank":2,"factor":2.34568,"interval":1.5,"without":0.75,"action":"evict","cooldown":300})j",
    R"j({"time":"2026-11-22T23:04:19.534Z","t":12.018,"event":"preflight_held_back","generation":5,"host":"node-d","slot":1,"check":"link","probe_ms":1000.25,"median_ms":0,"cooldown":1.23457e+06})j",
    R"j({"time":"2026-11-22T23:04:19.534Z","t":12.018,"event":"host_blacklisted","host":"node-\"q\"\\x\n"})j",
    R"j({"time":"2026-11-22T23:04:19.534Z","t":12.018,"event":"signal","signal":15})j",
    R"j({"time":"2026-11-22T23:04:19.534Z","t":12.018,"event":"standby_ready","host":"node-e","slot":0,"seconds":3.25})j",
    R"j({"time":"2026-11-22T23:04:19.534Z","t":12.018,"event":"standby_promoted","generation":6,"host":"node-e","slot":0,"reason":"a member was lost"})j",
    R"j({"time":"2026-11-22T23:04:19.534Z","t":12.018,"event":"rolled_back","generation":6,"commit":41,"seconds":0.000123457})j",
    R"j({"time":"2026-11-22T23:04:19.534Z","t":12.018,"event":"job_finished","exit_code":0,"generation":7,"resets":4,"launched":11})j",
    R"j({"time":"2026-11-22T23:04:19.534Z","t":12.018,"event":"job_summary","wall_s":300.5,"startup_s":10.25,"training_s":250.125,"recovery_s":20,"rolled_back_s":5.5,"waiting_s":4,"driver_gap_s":10.625,"goodput":0.832363,"generations":7,"resets":{"membership changed":1,"worker failed":3},"hosts_seen":5,"workers_failed":7,"workers_launched":11,"commits_restored":1,"drains":1,"stragglers":2,"takeovers":1,"standbys_promoted":1,"slowest_recovery_s":3.14159})j",
    R"j({"time":"2026-11-22T23:04:19.534Z","t":12.018,"event":"job_summary","wall_s":0,"startup_s":0,"training_s":0,"recovery_s":0,"rolled_back_s":0,"waiting_s":0,"driver_gap_s":0,"goodput":0,"generations":0,"resets":{},"hosts_seen":0,"workers_failed":0,"workers_launched":0,"commits_restored":0,"drains":0,"stragglers":0,"takeovers":0,"standbys_promoted":0,"slowest_recovery_s":-1})j",
};

TEST(Events, EveryTypeIsWrittenAsTheUntypedDriverWroteIt) {
  const std::vector<Event> events = every_event();
  ASSERT_EQ(events.size(), kReference.size());
  std::set<size_t> types;
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(event_line(kStamp, events[i]), kReference[i]) << event_name(events[i]);
    types.insert(events[i].index());
  }
  EXPECT_EQ(types.size(), std::variant_size_v<Event>) << "a new event type needs its reference line here";
}

TEST(Events, EveryLineReadsBackIntoTheSameEvent) {
  for (const std::string& line : kReference) {
    std::optional<LoggedEvent> e = parse_event_line(line);
    ASSERT_TRUE(e && e->event) << line;
    EXPECT_DOUBLE_EQ(e->stamp.time, kStamp.time);
    EXPECT_DOUBLE_EQ(e->stamp.t, kStamp.t);
    EXPECT_EQ(event_line(e->stamp, *e->event), line);
  }
}

TEST(Events, AMissingOrMistypedFieldKeepsItsDefault) {
  auto e = parse_event_line(
      R"({"time":"2026-11-22T23:04:19.534Z","event":"job_finished","exit_code":"x","generation":2.0,"extra":1})");
  ASSERT_TRUE(e && e->event);
  EXPECT_EQ(e->stamp.t, 0);
  auto* f = std::get_if<ev::JobFinished>(&*e->event);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->exit_code, -1);
  EXPECT_EQ(f->generation, 2);
  EXPECT_EQ(f->launched, -1) << "an older log without the count";
}

TEST(Events, AnUnknownTypeIsStampedWithoutAnEventAndNonEventsAreNothing) {
  auto e = parse_event_line(R"({"time":"2026-11-22T23:04:19.534Z","t":1,"event":"from_a_newer_erun","x":1})");
  ASSERT_TRUE(e);
  EXPECT_FALSE(e->event);
  EXPECT_DOUBLE_EQ(e->stamp.t, 1);
  for (std::string_view bad : {"", "{", "[1]", R"({"event":"reset"})", R"({"time":"2026-11-22T23:04:19.534Z"})",
                               R"({"time":"yesterday","event":"reset"})"}) {
    EXPECT_FALSE(parse_event_line(bad)) << bad;
  }
}

}  // namespace
}  // namespace erun
