// The job record: every field survives the text form (bytes of any kind,
// empty values, lists), a damaged or foreign file is refused, the name of a
// job follows its user, directory and command, the store replaces the
// record atomically with a private file, and only one holder at a time gets
// a job's lock (the second is told who holds it and what to do).
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>
#include <variant>

#include "common/clock.h"
#include "runner/hosts/host_manager.h"
#include "runner/takeover/job_record.h"
#include "runner/takeover/record_keeper.h"
#include "runner/takeover/standby_driver.h"
#include "support/erun_process.h"

namespace erun {
namespace {

// An instant on a driver's clock and the wall clock, whole milliseconds
// apart from the record's time points (the text's unit).
const RecordClock kAt{TimePoint(std::chrono::hours(5)),
                      std::chrono::system_clock::time_point(std::chrono::milliseconds(1'800'000'000'000))};

JobRecord sample() {
  JobRecord r;
  r.name = "job-0123456789ab";
  r.term = 7;
  r.driver_pid = 4242;
  r.driver_host = "login1";
  r.job_id = "erun-abcdef";
  r.secret = std::string("s3cr3t %\n\0x", 11);
  r.rendezvous_port = 40123;
  r.commit_dir = "";
  r.cwd = "/home/a user/run";
  r.args = {"-np", "2", "", "python3", "train.py", "--name=a b%c"};
  r.generation = 12;
  r.resets = 3;
  r.restarts = 1;
  r.launched = 17;
  r.in_place = true;
  r.plan = {{"node a", 0}, {"node a", 1}, {"b", 0}};
  r.agents = {{"node a", "/tmp/erun-agent-x/attach"}, {"b", ""}};
  r.hosts = {{"node a", {1, 2, kAt.steady + std::chrono::milliseconds(29500)}}, {"c", {0, 1, {}}}};
  r.keepers = {{"c", "node a"}, {"d", "b"}};
  return r;
}

TEST(JobRecord, EveryFieldSurvivesTheTextForm) {
  JobRecord r = sample();
  auto back = decode_record(encode_record(r, kAt), kAt);
  ASSERT_TRUE(back.is_ok()) << back.message();
  EXPECT_EQ(back.value(), r);
  EXPECT_EQ(encode_record(r).find('\0'), std::string::npos);
  r.unlocked = true;  // written only when set: an older erun's record has none
  EXPECT_EQ(decode_record(encode_record(r, kAt), kAt).value(), r);
  EXPECT_EQ(encode_record(sample()).find("unlocked"), std::string::npos);
}

TEST(JobRecord, DamagedOrForeignTextIsRefused) {
  const std::string good = encode_record(sample());
  EXPECT_FALSE(decode_record("").is_ok());
  EXPECT_FALSE(decode_record("hello\n").is_ok());
  EXPECT_FALSE(decode_record(good.substr(0, good.size() - 4)).is_ok()) << "cut short";
  EXPECT_FALSE(decode_record(good + "term 1\n").is_ok()) << "lines after the end";
  std::string bad_escape = good;
  bad_escape.replace(bad_escape.find("term 7"), 6, "term %Z");
  EXPECT_FALSE(decode_record(bad_escape).is_ok());
  std::string bad_slot = good;
  bad_slot.replace(bad_slot.find("slot b 0"), 8, "slot b -1");
  EXPECT_FALSE(decode_record(bad_slot).is_ok());
  std::string bad_host = good;
  bad_host.replace(bad_host.find("host c 0 1 0"), 12, "host c 0 -1 0");
  EXPECT_FALSE(decode_record(bad_host).is_ok());
  std::string short_host = good;
  short_host.replace(short_host.find("host c 0 1 0"), 12, "host c 0 1");
  EXPECT_FALSE(decode_record(short_host).is_ok());
  EXPECT_FALSE(decode_record(good.substr(0, good.size() - 4) + "keeper c b\nend\n").is_ok()) << "c kept twice";
  EXPECT_FALSE(decode_record(good.substr(0, good.size() - 4) + "host c 0 1 0\nend\n").is_ok()) << "c's history twice";
  EXPECT_FALSE(decode_record(good.substr(0, good.size() - 4) + "host_until zz 5\nend\n").is_ok()) << "no such host";
  EXPECT_FALSE(decode_record(good.substr(0, good.size() - 4) + "host_until c 99999999999999999\nend\n").is_ok())
      << "past what a clock holds";
  std::string short_keeper = good;
  short_keeper.replace(short_keeper.find("keeper d b"), 10, "keeper d");
  EXPECT_FALSE(decode_record(short_keeper).is_ok());
  std::string no_secret = good;
  no_secret.erase(no_secret.find("secret "), no_secret.find('\n', no_secret.find("secret ")) - no_secret.find("secret ") + 1);
  EXPECT_FALSE(decode_record(no_secret).is_ok());
}

// A takeover carries the hosts' histories over: the next driver, on
// another clock and some seconds later, keeps a blacklisting until it
// would have ended, and the cooldowns go on doubling from the counts.
TEST(JobRecord, HostHistoriesCarryBlacklistingsAndCountsToTheNextDriverAndItsClock) {
  const BlacklistPolicy policy{2, std::chrono::seconds(10), std::chrono::seconds(300)};
  FakeClock clock;
  JobRecord r = sample();
  r.hosts.clear();
  HostManager m(clock, policy, r.hosts);
  m.record_failure("a");
  m.record_failure("a");  // blacklisted for 10 s
  m.record_failure("b");
  const RecordClock written{clock.now(), kAt.wall};
  const std::string text = encode_record(r, written);
  EXPECT_NE(text.find("host a 0 1 10000\nhost_until a 1800000010000\n"), std::string::npos) << text;
  EXPECT_NE(text.find("host b 1 0 0\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("host_until b"), std::string::npos) << text;

  FakeClock other;  // the next driver's: another origin
  other.advance(std::chrono::hours(7));
  auto back = decode_record(text, RecordClock{other.now(), kAt.wall + std::chrono::seconds(4)});  // read 4 s later
  ASSERT_TRUE(back.is_ok()) << back.message();
  JobRecord next_record = back.value();
  HostManager next(other, policy, next_record.hosts);
  EXPECT_TRUE(next.is_blacklisted("a"));
  EXPECT_EQ(next.usable(HostSet({{"a", 1}, {"b", 1}})).to_string(), "b:1");
  other.advance(std::chrono::milliseconds(5999));
  EXPECT_TRUE(next.is_blacklisted("a"));
  other.advance(std::chrono::milliseconds(2));
  EXPECT_FALSE(next.is_blacklisted("a")) << "its 10 s are over";
  EXPECT_TRUE(next.record_failure("b")) << "b's first failure counted";
  next.record_failure("a");
  EXPECT_TRUE(next.record_failure("a"));  // a's second blacklisting: 20 s
  other.advance(std::chrono::seconds(19));
  EXPECT_TRUE(next.is_blacklisted("a"));
  other.advance(std::chrono::seconds(2));
  EXPECT_FALSE(next.is_blacklisted("a"));

  // A record an erun before host_until wrote: the time left, from its reading.
  std::string older = text;
  older.erase(older.find("host_until a "), std::string("host_until a 1800000010000\n").size());
  FakeClock third;
  auto old_back = decode_record(older, RecordClock{third.now(), kAt.wall + std::chrono::seconds(4)});
  ASSERT_TRUE(old_back.is_ok()) << old_back.message();
  EXPECT_EQ(old_back->hosts.at("a").blacklisted_until, third.now() + std::chrono::seconds(10));
  EXPECT_EQ(old_back->hosts.at("a").times_blacklisted, 1);
}

TEST(JobRecord, TheNameFollowsDirectoryAndCommand) {
  const std::string a = default_job_name("/w", {"-np", "2", "./train"});
  EXPECT_EQ(a, default_job_name("/w", {"-np", "2", "./train"}));
  EXPECT_NE(a, default_job_name("/v", {"-np", "2", "./train"}));
  EXPECT_NE(a, default_job_name("/w", {"-np", "4", "./train"}));
  EXPECT_NE(a, default_job_name("/w", {"-np", "2./train"}));  // word boundaries count
  EXPECT_TRUE(valid_job_name(a));
  EXPECT_EQ(a.size(), 16u);
  EXPECT_FALSE(valid_job_name("../x"));
  EXPECT_FALSE(valid_job_name(".hidden"));
  EXPECT_FALSE(valid_job_name("a/b"));
  EXPECT_FALSE(valid_job_name(""));
  EXPECT_TRUE(valid_job_name("nightly-run_2.b"));
}

TEST(JobStore, WritesPrivatelyAndAtomicallyAndLocksOneHolder) {
  testing::TempDir dir;
  auto store = JobStore::lock(dir.file("jobs"), "j1");
  ASSERT_TRUE(store.is_ok()) << store.message();
  EXPECT_FALSE(store.value()->read());
  JobRecord r = sample();
  // On the clocks of now (the store's): read back to the millisecond.
  r.hosts["node a"].blacklisted_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(29500);
  ASSERT_TRUE(store.value()->write(r).is_ok());
  struct stat st {};
  ASSERT_EQ(::stat(store.value()->record_path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(::stat(dir.file("jobs/j1").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  auto back = store.value()->read();
  ASSERT_TRUE(back);
  const Duration off = back->hosts["node a"].blacklisted_until - r.hosts["node a"].blacklisted_until;
  EXPECT_LT(std::chrono::abs(off), std::chrono::milliseconds(50));
  back->hosts["node a"].blacklisted_until = r.hosts["node a"].blacklisted_until;
  EXPECT_EQ(*back, r);
  r.generation = 13;
  ASSERT_TRUE(store.value()->write(r).is_ok());
  EXPECT_EQ(store.value()->read()->generation, 13);
  // No temporary file is left beside it.
  size_t files = 0;
  for (auto& e : std::filesystem::directory_iterator(dir.file("jobs/j1"))) {
    (void)e;
    ++files;
  }
  EXPECT_EQ(files, 2u);  // lock and record

  // A second holder is refused while the first holds the lock, and told who.
  auto second = JobStore::lock(dir.file("jobs"), "j1");
  ASSERT_FALSE(second.is_ok());
  EXPECT_NE(second.message().find("already driven by erun pid 4242 on login1"), std::string::npos) << second.message();
  EXPECT_NE(second.message().find("--job-name"), std::string::npos);
  EXPECT_TRUE(peek_record(dir.file("jobs"), "j1"));
  // Another name is another job.
  EXPECT_TRUE(JobStore::lock(dir.file("jobs"), "j2").is_ok());

  store.value()->remove();
  EXPECT_FALSE(peek_record(dir.file("jobs"), "j1"));
  EXPECT_NE(::access(dir.file("jobs/j1").c_str(), F_OK), 0) << "the ended job's directory is left behind";
  store.value().reset();  // the lock goes with it
  EXPECT_TRUE(JobStore::lock(dir.file("jobs"), "j1").is_ok());
}

// A standby driver standing by (its marker held) keeps its marker, and so
// the directory, when the job ends: it sees the end and cleans up itself.
// Without one, the marker goes with the rest.
TEST(JobStore, AnEndedJobLeavesALiveStandbysMarker) {
  testing::TempDir dir;
  auto ended = JobStore::lock(dir.file("jobs"), "j");
  ASSERT_TRUE(ended.is_ok());
  const int standby = ::open(dir.file("jobs/j/standby").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(standby, 0);
  ASSERT_EQ(::flock(standby, LOCK_EX | LOCK_NB), 0);
  ended.value()->remove();
  EXPECT_EQ(::access(dir.file("jobs/j/standby").c_str(), F_OK), 0) << "a live standby's marker removed";
  EXPECT_NE(::access(dir.file("jobs/j/lock").c_str(), F_OK), 0);
  ended.value().reset();
  ::close(standby);  // the standby left without cleaning up: the next end does
  auto next = JobStore::lock(dir.file("jobs"), "j");
  ASSERT_TRUE(next.is_ok()) << next.message();
  next.value()->remove();
  EXPECT_NE(::access(dir.file("jobs/j").c_str(), F_OK), 0) << "the directory is left behind";
}

// A job that ends removes its lock file and directory; whoever opened them
// before (a standby driver, another erun of the same name) never holds a
// removed lock: it takes a new one, or none.
TEST(JobStore, ALockRemovedByTheEndedJobIsNoLock) {
  testing::TempDir dir;
  auto ended = JobStore::lock(dir.file("jobs"), "j");
  ASSERT_TRUE(ended.is_ok());
  auto standby = JobStore::open_unlocked(dir.file("jobs"), "j");
  ASSERT_TRUE(standby.is_ok());
  // Another erun's descriptor of the lock file, opened before the end.
  const int stale = ::open(dir.file("jobs/j/lock").c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(stale, 0);
  ended.value()->remove();
  ended.value().reset();
  EXPECT_EQ(::flock(stale, LOCK_EX | LOCK_NB), 0) << "the old file can be locked, but it is no one's lock now";
  EXPECT_FALSE(standby.value()->try_lock()) << "a lock in the removed directory";
  auto next = JobStore::lock(dir.file("jobs"), "j");
  ASSERT_TRUE(next.is_ok()) << next.message();
  EXPECT_FALSE(JobStore::lock(dir.file("jobs"), "j").is_ok()) << "two holders";
  ::close(stale);
  // A store that does not hold the lock removes the record, not the lock.
  auto unlocked = JobStore::open_unlocked(dir.file("jobs"), "j");
  ASSERT_TRUE(unlocked.is_ok());
  unlocked.value()->remove();
  EXPECT_EQ(::access(dir.file("jobs/j/lock").c_str(), F_OK), 0);
  EXPECT_FALSE(JobStore::lock(dir.file("jobs"), "j").is_ok()) << "still held by `next`";
}

TEST(JobStore, ARecordOthersCouldChangeIsIgnored) {
  testing::TempDir dir;
  auto store = JobStore::lock(dir.file("jobs"), "j");
  ASSERT_TRUE(store.is_ok());
  ASSERT_TRUE(store.value()->write(sample()).is_ok());
  ::chmod(store.value()->record_path().c_str(), 0644);
  EXPECT_FALSE(store.value()->read()) << "a record others can read is no record (it holds the secret)";
  ::unlink(store.value()->record_path().c_str());
  ::symlink("/etc/passwd", store.value()->record_path().c_str());
  EXPECT_FALSE(store.value()->read());
}

// A standby driver takes a silent driver's job without the lock: the
// heartbeat (touch) changes the stamp it watches, the driver it replaced
// cannot put an older term back, and the lock comes once the old holder let
// it go.
TEST(JobStore, AStandbyWatchesTheHeartbeatAndAReplacedDriverCannotWriteBack) {
  testing::TempDir dir;
  auto old_driver = JobStore::lock(dir.file("jobs"), "j");
  ASSERT_TRUE(old_driver.is_ok());
  EXPECT_EQ(record_stamp(dir.file("jobs"), "j"), "");
  JobRecord r = sample();
  ASSERT_TRUE(old_driver.value()->write(r).is_ok());
  const std::string stamp = record_stamp(dir.file("jobs"), "j");
  EXPECT_NE(stamp, "");
  EXPECT_EQ(record_stamp(dir.file("jobs"), "j"), stamp) << "nothing changed";
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  old_driver.value()->touch();
  EXPECT_NE(record_stamp(dir.file("jobs"), "j"), stamp) << "the heartbeat changes the stamp";

  auto standby = JobStore::open_unlocked(dir.file("jobs"), "j");
  ASSERT_TRUE(standby.is_ok()) << standby.message();
  EXPECT_FALSE(standby.value()->holds_lock());
  EXPECT_FALSE(standby.value()->try_lock()) << "the old driver holds it";
  JobRecord taken = r;
  taken.term = r.term + 1;
  ASSERT_TRUE(standby.value()->write(taken).is_ok());
  r.generation += 1;
  auto refused = old_driver.value()->write(r);
  EXPECT_FALSE(refused.is_ok());
  EXPECT_NE(refused.message().find("term 8 (erun pid 4242 on login1) holds it"), std::string::npos) << refused.message();
  EXPECT_EQ(peek_record(dir.file("jobs"), "j")->term, taken.term);
  // A second erun that took the same silent driver over claims the same
  // term: refused, the first one's claim stays.
  JobRecord twin = taken;
  twin.driver_pid = taken.driver_pid + 1;
  auto second = JobStore::open_unlocked(dir.file("jobs"), "j");
  ASSERT_TRUE(second.is_ok());
  EXPECT_FALSE(second.value()->write(twin).is_ok());
  EXPECT_EQ(peek_record(dir.file("jobs"), "j")->driver_pid, taken.driver_pid);
  taken.generation += 1;
  EXPECT_TRUE(standby.value()->write(taken).is_ok()) << "the claimant's own next write";
  old_driver.value().reset();  // it leaves
  EXPECT_TRUE(standby.value()->try_lock());
  EXPECT_TRUE(standby.value()->holds_lock());
  EXPECT_FALSE(JobStore::lock(dir.file("jobs"), "j").is_ok());
}

// A driver replaced while it was frozen or cut off, that ends without having
// heard of it, leaves the job to its replacement: its record, its events,
// the lock file it holds and the directory. The replacement's own end
// removes them.
TEST(JobStore, AReplacedDriverThatEndsLeavesTheJobToItsReplacement) {
  testing::TempDir dir;
  auto old_driver = JobStore::lock(dir.file("jobs"), "j");
  ASSERT_TRUE(old_driver.is_ok());
  JobRecord r = sample();
  ASSERT_TRUE(old_driver.value()->write(r).is_ok());
  auto replacement = JobStore::open_unlocked(dir.file("jobs"), "j");
  ASSERT_TRUE(replacement.is_ok());
  JobRecord taken = r;
  taken.term = r.term + 1;
  ASSERT_TRUE(replacement.value()->write(taken).is_ok());
  {
    std::ofstream events(replacement.value()->events_path());
    events << "{}\n";
  }
  EXPECT_FALSE(old_driver.value()->remove());
  ASSERT_TRUE(peek_record(dir.file("jobs"), "j"));
  EXPECT_EQ(peek_record(dir.file("jobs"), "j")->term, taken.term);
  EXPECT_EQ(::access(dir.file("jobs/j/events").c_str(), F_OK), 0) << "the replacement's events removed";
  EXPECT_EQ(::access(dir.file("jobs/j/lock").c_str(), F_OK), 0) << "the job's lock file removed";
  old_driver.value().reset();
  ASSERT_TRUE(replacement.value()->try_lock()) << "the lock the old driver held is the job's lock still";
  EXPECT_TRUE(replacement.value()->remove());
  EXPECT_NE(::access(dir.file("jobs/j").c_str(), F_OK), 0) << "the job's directory left behind";
  // A standby that chose to take over a job that then ended finds nothing
  // to open: the directory is not made again for a job that is over.
  auto ended = JobStore::open_unlocked(dir.file("jobs"), "j");
  ASSERT_FALSE(ended.is_ok());
  EXPECT_NE(ended.message().find("job j ended"), std::string::npos) << ended.message();
  EXPECT_NE(::access(dir.file("jobs/j").c_str(), F_OK), 0) << "an ended job's directory made again";
  // Another job of the same name, or one the store never wrote: removed.
  auto again = JobStore::lock(dir.file("jobs"), "j");
  ASSERT_TRUE(again.is_ok());
  JobRecord other = sample();
  other.job_id = "another-id";
  other.term = 9;
  ASSERT_TRUE(again.value()->write(other).is_ok());
  auto never_wrote = JobStore::open_unlocked(dir.file("jobs"), "j");
  ASSERT_TRUE(never_wrote.is_ok());
  EXPECT_TRUE(never_wrote.value()->remove());
  EXPECT_FALSE(peek_record(dir.file("jobs"), "j"));
}

// While a taking-over driver attaches to its agents (it cannot step), its
// record beats from a thread, and stops beating when that ends.
TEST(RecordHeartbeat, TouchesTheRecordUntilItGoes) {
  testing::TempDir dir;
  auto store = JobStore::lock(dir.file("jobs"), "j");
  ASSERT_TRUE(store.is_ok());
  ASSERT_TRUE(store.value()->write(sample()).is_ok());
  std::string stamp = record_stamp(dir.file("jobs"), "j");
  {
    RecordHeartbeat beat(*store.value(), std::chrono::milliseconds(50));
    int changes = 0;
    for (int i = 0; i < 40 && changes < 3; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      if (std::string now = record_stamp(dir.file("jobs"), "j"); now != stamp) {
        stamp = now;
        ++changes;
      }
    }
    EXPECT_GE(changes, 3) << "the record did not beat";
  }
  stamp = record_stamp(dir.file("jobs"), "j");
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(record_stamp(dir.file("jobs"), "j"), stamp) << "it beat on after it went";
}

// A standby driver that gets the job's lock while the job's driver beats
// without it (it took the job over from a silent driver, which held the
// lock and has now gone) does not take over from that live driver: it keeps
// the lock and stands by until that one is silent, then takes over with it.
TEST(StandBy, ALockFreedUnderADriverThatTookOverWithoutItIsNoSignThatDriverIsGone) {
  testing::TempDir dir;
  const std::string jobs = dir.file("jobs");
  auto silent = JobStore::lock(jobs, "j");  // the first driver, frozen: it holds the lock
  ASSERT_TRUE(silent.is_ok());
  JobRecord r = sample();
  r.job_id = "job";
  ASSERT_TRUE(silent.value()->write(r).is_ok());
  auto live = JobStore::open_unlocked(jobs, "j");  // the driver that took it over
  ASSERT_TRUE(live.is_ok());
  JobRecord taken = r;
  taken.term = r.term + 1;
  taken.driver_pid = 5151;
  taken.unlocked = true;
  ASSERT_TRUE(live.value()->write(taken).is_ok());
  EXPECT_TRUE(peek_record(jobs, "j")->unlocked);

  std::atomic<bool> beating{true};
  std::thread heart([&] {
    while (beating) {
      live.value()->touch();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  std::thread gone([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    silent.value().reset();  // the frozen driver goes: its lock is free
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    beating = false;  // then the live one goes silent too
  });
  const auto t0 = std::chrono::steady_clock::now();
  auto got = stand_by(jobs, "j", std::chrono::milliseconds(700));
  const auto waited = std::chrono::steady_clock::now() - t0;
  gone.join();
  heart.join();
  ASSERT_TRUE(std::holds_alternative<std::unique_ptr<JobStore>>(got));
  auto& store = std::get<std::unique_ptr<JobStore>>(got);
  EXPECT_GE(waited, std::chrono::milliseconds(1800 + 700)) << "took over while the live driver beat";
  EXPECT_TRUE(store->holds_lock());
  EXPECT_EQ(store->read()->driver_pid, 5151);
}

}  // namespace
}  // namespace erun
