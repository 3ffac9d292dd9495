// Background persistence (commits/persist.h): the host side copies the newest
// host-memory commit of the job's rank 0 into the durable file
// while the worker goes on committing into the same two files. Whatever the
// timing, the durable file holds one whole commit (never bytes of two), and
// never an older one than it held.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "commits/host_commits.h"
#include "commits/persist.h"
#include "commits/snapshot.h"
#include "erun/errors.hpp"
#include "support/erun_process.h"

namespace erun {
namespace {

namespace fs = std::filesystem;
namespace si = state_internal;

class PersistTest : public ::testing::Test {
 protected:
  // Commit `id` of two entries whose every byte is a function of the id.
  static std::vector<char> fill(uint64_t id, size_t n, int salt) {
    return std::vector<char>(n, static_cast<char>((id * 31 + static_cast<uint64_t>(salt)) % 251));
  }
  static void commit(si::HostCommits& h, uint64_t id, size_t n, uint32_t flags = si::kRankZeroCommit) {
    static const std::string a = "a", b = "b";
    auto da = fill(id, n, 1), db = fill(id, n / 3 + 1, 2);
    ASSERT_FALSE(h.write(id, {si::EntryRef::of(a, da), si::EntryRef::of(b, db)}, nullptr, flags).has_value());
  }
  si::Snapshot durable() const {
    std::vector<char> bytes;
    EXPECT_TRUE(si::read_file(ckpt_ + "/" + si::kStateFile, &bytes));
    return si::decode(bytes.data(), bytes.size(), "durable file");
  }
  static void expect_whole(const si::Snapshot& s, size_t n) {
    ASSERT_EQ(s.entries.size(), 2u);
    EXPECT_EQ(s.entries[0].first, "a");
    EXPECT_EQ(s.entries[0].second, fill(s.commit_id, n, 1)) << "commit " << s.commit_id << " mixes two commits";
    EXPECT_EQ(s.entries[1].second, fill(s.commit_id, n / 3 + 1, 2)) << "commit " << s.commit_id;
  }

  testing::TempDir root_;
  const std::string commits_ = root_.file("commits");
  const std::string ckpt_ = root_.file("ckpt");
  std::vector<char> scratch_;
};

TEST_F(PersistTest, TheNewestRankZeroCommitIsWrittenOnceAndOnlyWhenNewer) {
  si::HostCommits rank0(commits_ + "/slot-h-0");
  si::HostCommits rank1(commits_ + "/slot-h-1");
  commit(rank0, 1, 1000);
  commit(rank0, 2, 1000);
  commit(rank1, 3, 1000, 0);  // not rank 0's: never persisted
  si::Persisted p = si::persist_newest(commits_, ckpt_, 0, &scratch_);
  EXPECT_EQ(p.id, 2u);
  EXPECT_FALSE(p.raced);
  EXPECT_EQ(p.from, commits_ + "/slot-h-0.b");
  expect_whole(durable(), 1000);
  struct stat st {};
  ASSERT_EQ(::stat((ckpt_ + "/" + si::kStateFile).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  // Nothing newer: nothing written, whatever `after` says.
  EXPECT_EQ(si::persist_newest(commits_, ckpt_, 0, &scratch_).id, 0u);
  commit(rank0, 3, 1000);
  EXPECT_EQ(si::persist_newest(commits_, ckpt_, 3, &scratch_).id, 0u);
  EXPECT_EQ(si::persist_newest(commits_, ckpt_, 2, &scratch_).id, 3u);
  expect_whole(durable(), 1000);
  // A later State of the worker (its files end in -s1) is not State 0's.
  si::HostCommits second(si::HostCommits::stem_of(commits_ + "/slot-h-0", 1));
  commit(second, 9, 1000);
  EXPECT_EQ(si::persist_newest(commits_, ckpt_, 0, &scratch_).id, 0u);
}

TEST_F(PersistTest, AFileReclaimedForANewerCommitNoLongerHoldsTheOldOne) {
  si::HostCommits h(commits_ + "/slot-h-0");
  commit(h, 1, 4096);
  int fd = ::open((commits_ + "/slot-h-0.a").c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  auto l = si::HostCommits::list(fd);
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->id, 1u);
  EXPECT_EQ(l->flags, si::kRankZeroCommit);
  EXPECT_TRUE(si::HostCommits::held(fd, 1));
  commit(h, 2, 4096);  // into .b
  EXPECT_TRUE(si::HostCommits::held(fd, 1));
  commit(h, 3, 4096);  // .a again
  EXPECT_FALSE(si::HostCommits::held(fd, 1));
  ::close(fd);
}

// A writer process commits 8 MiB states, 1 ms apart, while this one
// persists in a loop: every durable file is one whole commit, ids only grow,
// and no temp file is left.
TEST_F(PersistTest, PersistingWhileTheWorkerCommitsNeverWritesAMixture) {
  constexpr size_t kBytes = 8 << 20;
  si::HostCommits(commits_ + "/slot-h-0").open();  // the directory exists before the child writes
  pid_t writer = ::fork();
  ASSERT_GE(writer, 0);
  if (writer == 0) {
    si::HostCommits h(commits_ + "/slot-h-0");
    static const std::string a = "a", b = "b";
    for (uint64_t id = 1; id < 1000000; ++id) {
      auto da = fill(id, kBytes, 1), db = fill(id, kBytes / 3 + 1, 2);
      if (h.write(id, {si::EntryRef::of(a, da), si::EntryRef::of(b, db)}, nullptr, si::kRankZeroCommit)) _exit(2);
      ::usleep(1000);  // a short training step
    }
    _exit(0);
  }
  uint64_t last = 0;
  int written = 0, raced = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(6);
  while (std::chrono::steady_clock::now() < until) {
    si::Persisted p = si::persist_newest(commits_, ckpt_, 0, &scratch_);
    raced += p.raced;
    if (p.id == 0) continue;
    ++written;
    si::Snapshot s = durable();
    EXPECT_EQ(s.commit_id, p.id);
    EXPECT_GT(s.commit_id, last);
    last = s.commit_id;
    ASSERT_NO_FATAL_FAILURE(expect_whole(s, kBytes));
  }
  ::kill(writer, SIGKILL);
  int status = 0;
  ::waitpid(writer, &status, 0);
  EXPECT_GE(written, 3);
  std::cout << written << " durable commits, " << raced << " copies dropped: their file was reclaimed\n";
  for (const auto& e : fs::directory_iterator(ckpt_)) EXPECT_EQ(e.path().filename(), si::kStateFile);
}

TEST_F(PersistTest, AnUnsafeCheckpointDirectoryIsAnErrorNamingIt) {
  si::HostCommits h(commits_ + "/slot-h-0");
  commit(h, 1, 100);
  fs::create_directories(ckpt_);
  fs::permissions(ckpt_, fs::perms::all);  // 0777, no sticky bit
  try {
    si::persist_newest(commits_, ckpt_, 0, &scratch_);
    FAIL() << "an open checkpoint directory was written";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(ckpt_), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(ckpt_ + "/" + si::kStateFile));
}

}  // namespace
}  // namespace erun
