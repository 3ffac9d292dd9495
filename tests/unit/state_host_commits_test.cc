// Host-memory commits (state/host_commits.h): each worker's newest commit in
// two files of a private directory, written so that a worker killed in the
// middle of a commit leaves the previous one whole, and read back by the
// State of a later worker when every worker that made it is gone.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "erun/erun.hpp"
#include "state/host_commits.h"
#include "state_fake_world.h"

namespace erun {
namespace {

namespace fs = std::filesystem;
namespace si = state_internal;
using testing::FakeContext;
using testing::FakeHub;
using testing::run_threads;

class HostCommitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/erun-host-commits-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    dir_ = root_ + "/job";
  }
  void TearDown() override { fs::remove_all(root_); }

  // One entry "w" holding `value` repeated `n` times.
  static std::vector<si::EntryRef> entries(const std::string& name, const std::vector<char>& data) {
    return {si::EntryRef{&name, &data}};
  }
  uint64_t newest_id() const {
    auto f = si::HostCommits::newest(dir_);
    return f ? f->snapshot.commit_id : 0;
  }
  std::vector<char> bytes_of(const std::string& path) const {
    std::ifstream in(path, std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(in), {});
  }
  void tear(const std::string& path) const {
    // What a worker killed in the middle of its write leaves: the right
    // size, half of it new and half old (here: zeros).
    auto b = bytes_of(path);
    std::fill(b.begin() + static_cast<long>(b.size() / 2), b.end(), 0);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(b.data(), static_cast<std::streamsize>(b.size()));
  }

  std::string root_, dir_;
  const std::string name_ = "w";
};

TEST_F(HostCommitsTest, TheNewestCommitIsReadBackAndFilesArePrivate) {
  si::HostCommits hc(dir_ + "/slot-0");
  for (uint64_t id = 1; id <= 3; ++id) {
    std::vector<char> data(1000, static_cast<char>(id));
    ASSERT_FALSE(hc.write(id, entries(name_, data)));
  }
  auto f = si::HostCommits::newest(dir_);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->snapshot.commit_id, 3u);
  ASSERT_EQ(f->snapshot.entries.size(), 1u);
  EXPECT_EQ(f->snapshot.entries[0].second, std::vector<char>(1000, 3));
  struct stat st {};
  ASSERT_EQ(::stat(dir_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  for (auto suffix : {".a", ".b"}) {
    ASSERT_EQ(::stat((dir_ + "/slot-0" + suffix).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
  }
}

TEST_F(HostCommitsTest, ACommitTornByADeathLeavesThePreviousOneWhole) {
  si::HostCommits hc(dir_ + "/slot-0");
  std::vector<char> one(4096, 1), two(4096, 2);
  ASSERT_FALSE(hc.write(1, entries(name_, one)));
  ASSERT_FALSE(hc.write(2, entries(name_, two)));
  // Commit 2 went to the other file than commit 1.
  auto f = si::HostCommits::newest(dir_);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->snapshot.commit_id, 2u);
  tear(f->path);
  f = si::HostCommits::newest(dir_);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->snapshot.commit_id, 1u);
  EXPECT_EQ(f->snapshot.entries[0].second, one);
}

// A replacement worker in the same slot overwrites the older of the files
// its predecessor left, never the newest.
TEST_F(HostCommitsTest, ANewWriterKeepsItsPredecessorsNewestCommit) {
  {
    si::HostCommits old(dir_ + "/slot-0");
    std::vector<char> d(64, 7);
    ASSERT_FALSE(old.write(6, entries(name_, d)));
    ASSERT_FALSE(old.write(7, entries(name_, d)));
  }
  si::HostCommits next(dir_ + "/slot-0");
  std::vector<char> d8(64, 8);
  ASSERT_FALSE(next.write(8, entries(name_, d8)));
  auto f = si::HostCommits::newest(dir_);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->snapshot.commit_id, 8u);
  tear(f->path);
  EXPECT_EQ(newest_id(), 7u);
}

TEST_F(HostCommitsTest, TheNewestOfEveryWorkersFilesWinsAndForeignFilesAreSkipped) {
  si::HostCommits a(dir_ + "/slot-h-0"), b(dir_ + "/slot-h-1");
  std::vector<char> d(16, 1);
  ASSERT_FALSE(a.write(4, entries(name_, d)));
  ASSERT_FALSE(b.write(5, entries(name_, d)));
  std::ofstream(dir_ + "/junk.a") << "ERUNSTAT but not really a commit, claims nothing";
  EXPECT_EQ(newest_id(), 5u);
  EXPECT_FALSE(si::HostCommits::newest(root_ + "/missing"));
}

TEST_F(HostCommitsTest, ALinkAtAFileNameIsRefusedAndItsTargetUntouched) {
  ASSERT_TRUE(fs::create_directory(dir_));
  ::chmod(dir_.c_str(), 0700);
  const std::string target = root_ + "/target";
  std::ofstream(target) << "keep";
  fs::create_symlink(target, dir_ + "/slot-0.a");
  si::HostCommits hc(dir_ + "/slot-0");
  std::vector<char> d(16, 1);
  EXPECT_THROW((void)hc.write(1, entries(name_, d)), Error);
  std::ifstream in(target);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(text, "keep");
}

// Host memory that cannot take the commit (here a file size limit stands in
// for a full /dev/shm): a clear error, and the previous commit stays.
TEST_F(HostCommitsTest, NoRoomIsAnErrorThatKeepsThePreviousCommit) {
  si::HostCommits hc(dir_ + "/slot-0");
  std::vector<char> small(1024, 1), big(1 << 20, 2);
  ASSERT_FALSE(hc.write(1, entries(name_, small)));
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit lim = old;
  lim.rlim_cur = 64 << 10;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &lim), 0);
  auto err = hc.write(2, entries(name_, big));
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, old_handler);
  ASSERT_TRUE(err);
  EXPECT_NE(err->find("host-memory commit 2 was not written"), std::string::npos) << *err;
  EXPECT_NE(err->find("the previous commit stays"), std::string::npos) << *err;
  auto f = si::HostCommits::newest(dir_);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->snapshot.commit_id, 1u);
  EXPECT_EQ(f->snapshot.entries[0].second, small);
}

// Before its first commit a worker checks that the host can take two copies
// of the state for every worker there, and says how to make room if not.
TEST_F(HostCommitsTest, TooLittleRoomIsSaidBeforeTheFirstCommit) {
  si::HostCommits hc(dir_ + "/slot-0");
  std::vector<char> d(16, 1);
  ASSERT_FALSE(hc.write(1, entries(name_, d)));
  std::vector<char> mib(1 << 20);
  EXPECT_FALSE(hc.room_warning(entries(name_, mib), 8));
  // 2 copies of 1 MiB for 2^30 workers: two pebibytes, more than any disk here.
  auto w = hc.room_warning(entries(name_, mib), 1 << 30);
  ASSERT_TRUE(w);
  EXPECT_NE(w->find("2 copies of the state"), std::string::npos) << *w;
  EXPECT_NE(w->find("1073741824 worker(s)"), std::string::npos) << *w;
  EXPECT_NE(w->find("--shm-size="), std::string::npos) << *w;
  EXPECT_NE(w->find("--no-host-commits"), std::string::npos) << *w;
}

// The State end to end: two ranks commit, then every worker is gone; the
// next workers (fresh values, no survivor) resume at the last commit.
TEST_F(HostCommitsTest, WorkersThatStartAfterEveryWorkerDiedResumeAtTheLastCommit) {
  struct Model {
    int64_t step = 0;
    std::vector<double> w = std::vector<double>(1000, 0.0);
  };
  {
    FakeHub hub(2);
    run_threads(2, [&](int slot) {
      FakeContext ctx(hub, slot);
      ctx.set_host_commit_stem(dir_ + "/slot-fake-" + std::to_string(slot));
      State st(ctx);
      Model m;
      st.register_value("step", &m.step);
      st.register_vector("w", &m.w);
      st.sync();
      for (int i = 0; i < 5; ++i) {
        m.step += 1;
        for (auto& x : m.w) x += 0.5;
        st.commit();
      }
      m.step = 999;  // progress after the last commit is lost, as in any failure
    });
  }
  FakeHub hub(2);
  std::vector<int64_t> steps(2);
  std::vector<double> w0(2);
  std::vector<uint64_t> ids(2);
  run_threads(2, [&](int slot) {
    FakeContext ctx(hub, slot);
    ctx.set_host_commit_stem(dir_ + "/slot-fake-" + std::to_string(slot));
    State st(ctx);
    Model m;
    st.register_value("step", &m.step);
    st.register_vector("w", &m.w);
    st.sync();
    steps[static_cast<size_t>(slot)] = m.step;
    w0[static_cast<size_t>(slot)] = m.w[0];
    ids[static_cast<size_t>(slot)] = st.commit_id();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(steps[static_cast<size_t>(r)], 5);
    EXPECT_EQ(w0[static_cast<size_t>(r)], 2.5);
    EXPECT_EQ(ids[static_cast<size_t>(r)], 5u);
  }
}

// A worker that joins a survivor holding a newer commit takes the
// survivor's, not the older one its host kept.
TEST_F(HostCommitsTest, ASurvivorsNewerCommitWinsOverHostMemory) {
  {
    si::HostCommits old(dir_ + "/slot-fake-1");
    int64_t step = 3;
    std::string name = "step";
    std::vector<char> b(sizeof step);
    std::memcpy(b.data(), &step, sizeof step);
    ASSERT_FALSE(old.write(3, entries(name, b)));
  }
  FakeHub solo(1), world(2);
  std::vector<int64_t> got(2);
  std::vector<uint64_t> ids(2);
  run_threads(2, [&](int slot) {
    int64_t step = 0;
    if (slot == 0) {  // the survivor: 8 commits, then the new generation
      FakeContext ctx(solo, 0);
      State st(ctx);
      st.register_value("step", &step);
      st.sync();
      for (int i = 0; i < 8; ++i) {
        step += 1;
        st.commit();
      }
      ctx.attach(world, 0);
      st.sync();
      got[0] = step;
      ids[0] = st.commit_id();
    } else {  // new on a host that kept commit 3
      FakeContext ctx(world, 1);
      ctx.set_host_commit_stem(dir_ + "/slot-fake-1");
      State st(ctx);
      st.register_value("step", &step);
      st.sync();
      got[1] = step;
      ids[1] = st.commit_id();
    }
  });
  EXPECT_EQ(got, (std::vector<int64_t>{8, 8}));
  EXPECT_EQ(ids, (std::vector<uint64_t>{8, 8}));
}

}  // namespace
}  // namespace erun
