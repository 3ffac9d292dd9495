// Host-memory commits (state/host_commits.h): each worker's newest commit in
// two files of a private directory, written so that a worker killed in the
// middle of a commit leaves the previous one whole, and read back by the
// State of a later worker when every worker that made it is gone.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <thread>

#include "erun/erun.hpp"
#include "commits/commit_files.h"
#include "commits/host_commits.h"
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
    return {si::EntryRef::of(name, data)};
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

  // Runs fn with files limited to 64 KiB: a full /dev/shm, as far as a
  // growing commit file can tell.
  template <typename Fn>
  static void with_no_room(Fn&& fn) {
    struct rlimit old {};
    ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
    auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = old;
    lim.rlim_cur = 64 << 10;
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &lim), 0);
    fn();
    ::setrlimit(RLIMIT_FSIZE, &old);
    ::signal(SIGXFSZ, old_handler);
  }

  // What a writer of DIR/name that came before (and is gone) left: commits
  // 6 and 7.
  void predecessor_wrote_6_and_7(const std::string& name) {
    si::HostCommits old(dir_ + "/" + name);
    std::vector<char> d(64, 7);
    ASSERT_FALSE(old.write(6, entries(name_, d)));
    ASSERT_FALSE(old.write(7, entries(name_, d)));
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
  ASSERT_NO_FATAL_FAILURE(predecessor_wrote_6_and_7("slot-0"));
  si::HostCommits next(dir_ + "/slot-0");
  std::vector<char> d8(64, 8);
  ASSERT_FALSE(next.write(8, entries(name_, d8)));
  auto f = si::HostCommits::newest(dir_);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->snapshot.commit_id, 8u);
  tear(f->path);
  EXPECT_EQ(newest_id(), 7u);
}

// A sharded State that goes back to an older commit (a newer one was not
// whole across the job) writes that commit again in its new layout, then
// goes on to newer ones. The file its entries now point into is the one
// written last, though the other holds a higher id (the abandoned commit):
// the next write must go over the abandoned one. (Writing over the file
// written last, and growing its mapping, crashed a survivor mid-copy.)
TEST_F(HostCommitsTest, AfterGoingBackToAnOlderCommitTheFileWrittenLastIsKept) {
  si::HostCommits hc(dir_ + "/slot-0");
  std::vector<char> six(64, 6), seven(64, 7);
  ASSERT_FALSE(hc.write(6, entries(name_, six)));
  ASSERT_FALSE(hc.write(7, entries(name_, seven)));
  std::vector<char> six_again(4096, 16);  // commit 6 in a new layout, larger
  std::vector<const char*> placed;
  ASSERT_FALSE(hc.write(6, entries(name_, six_again), &placed));
  ASSERT_EQ(placed.size(), 1u);
  const std::vector<char> seen(placed[0], placed[0] + six_again.size());
  EXPECT_EQ(seen, six_again);
  std::vector<char> eight(1 << 20, 8);  // larger again: a file that grows is mapped anew
  ASSERT_FALSE(hc.write(8, entries(name_, eight)));
  // The bytes of the commit written again are where the State reads them.
  EXPECT_EQ(std::vector<char>(placed[0], placed[0] + six_again.size()), six_again);
  auto f = si::HostCommits::newest(dir_);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->snapshot.commit_id, 8u);
  tear(f->path);
  f = si::HostCommits::newest(dir_);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->snapshot.commit_id, 6u);
  EXPECT_EQ(f->snapshot.entries[0].second, six_again);
}

// A pair may hold one commit twice: a sharded State's reshard (or a buddy
// push after it) writes the commit again in its new layout. A new writer of
// the pair (another keeper of the same pusher, a replacement in the slot)
// writes over the layout written first, never the newer one.
TEST_F(HostCommitsTest, ANewWriterOfOneCommitInTwoLayoutsKeepsTheOneWrittenLast) {
  std::vector<char> five(64, 5), six_first(64, 6), six_again(4096, 16);
  {
    si::HostCommits first(dir_ + "/slot-0");
    ASSERT_FALSE(first.write(5, entries(name_, five)));       // .a
    ASSERT_FALSE(first.write(6, entries(name_, six_first)));  // .b
    ASSERT_FALSE(first.write(6, entries(name_, six_again)));  // .a: the new layout
  }
  si::HostCommits next(dir_ + "/slot-0");
  std::vector<char> seven(64, 7);
  ASSERT_FALSE(next.write(7, entries(name_, seven)));
  auto a = si::HostCommits::read(dir_ + "/slot-0.a");
  auto b = si::HostCommits::read(dir_ + "/slot-0.b");
  ASSERT_TRUE(a && b);
  EXPECT_EQ(b->commit_id, 7u) << "written over the new layout";
  EXPECT_EQ(a->commit_id, 6u);
  EXPECT_EQ(a->entries[0].second, six_again);
}

// A durable copy keeps the commit its job's erun-state.bin names, whoever
// wrote it and whatever was written since: a new writer of the pair, and a
// writer whose newer commit was not agreed on, write over the other file.
TEST_F(HostCommitsTest, AKeptCommitIsNeverWrittenOver) {
  ASSERT_NO_FATAL_FAILURE(predecessor_wrote_6_and_7("rank-1"));
  si::HostCommits next(dir_ + "/rank-1");
  next.keep_commit(6);  // 7 was not agreed on
  std::vector<char> d9(64, 9);
  ASSERT_FALSE(next.write(9, entries(name_, d9)));  // over 7, though 6 is older
  ASSERT_FALSE(next.write(10, entries(name_, d9)));  // over 9, not over 6
  auto [a, b] = next.held_ids();
  EXPECT_EQ(std::min(a, b), 6u);
  EXPECT_EQ(std::max(a, b), 10u);
  next.keep_commit(10);
  ASSERT_FALSE(next.write(11, entries(name_, d9)));  // 6 may go now
  std::tie(a, b) = next.held_ids();
  EXPECT_EQ(std::min(a, b), 10u);
  EXPECT_EQ(std::max(a, b), 11u);
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
  std::optional<std::string> err;
  with_no_room([&] { err = hc.write(2, entries(name_, big)); });
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
// survivor's, not the older one its host kept, whose data it does not even
// read: the old file holds an entry that no worker registers, which a load
// would refuse.
TEST_F(HostCommitsTest, ASurvivorsNewerCommitWinsOverHostMemory) {
  {
    si::HostCommits old(dir_ + "/slot-fake-1");
    int64_t step = 3;
    std::string name = "step", stray = "gone";
    std::vector<char> b(sizeof step);
    std::memcpy(b.data(), &step, sizeof step);
    ASSERT_FALSE(old.write(3, {si::EntryRef::of(name, b), si::EntryRef::of(stray, b)}));
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

// A writer killed after it claimed a file for its next commit (the claim
// comes first, the trailer last) leaves that file torn: the other file's
// commit is the newest whole one.
TEST_F(HostCommitsTest, AClaimWithoutItsTrailerIsTorn) {
  si::HostCommits hc(dir_ + "/slot-0");
  std::vector<char> one(4096, 1), two(4096, 2);
  ASSERT_FALSE(hc.write(1, entries(name_, one)));
  ASSERT_FALSE(hc.write(2, entries(name_, two)));
  auto f = si::HostCommits::newest(dir_);
  ASSERT_TRUE(f);
  const std::string older = f->path.back() == 'a' ? dir_ + "/slot-0.b" : dir_ + "/slot-0.a";
  // What commit 3 does first, and all a worker killed at once leaves.
  auto b = bytes_of(older);
  const uint64_t three = 3;
  std::memcpy(b.data() + 16, &three, sizeof three);
  std::ofstream(older, std::ios::binary | std::ios::trunc).write(b.data(), static_cast<std::streamsize>(b.size()));
  EXPECT_EQ(newest_id(), 2u);
  EXPECT_FALSE(si::HostCommits::read(older));
  // The claimed id is what a new worker reports (common/commit_files.h)...
  auto claimed = claimed_commits(dir_);
  ASSERT_FALSE(claimed.empty());
  EXPECT_EQ(claimed[0].id, 3u);
  // ...and a new writer of the slot keeps the whole commit 2, overwriting the torn file.
  si::HostCommits next(dir_ + "/slot-0");
  std::vector<char> four(4096, 4);
  ASSERT_FALSE(next.write(4, entries(name_, four)));
  EXPECT_EQ(si::HostCommits::read(older)->commit_id, 4u);
  EXPECT_EQ(si::HostCommits::read(f->path)->commit_id, 2u);
}

// Device entries are filled after the write, by their copies from the GPU
// (State: DeviceSlot::commit_into), here by threads. The commit is whole only
// once every filler said done(); until then the previous one is the newest,
// a kill leaves it so, and the next write is refused rather than reusing a
// file a copy may still land in.
TEST_F(HostCommitsTest, EntriesFilledLaterMakeTheCommitWholeOnlyWhenAllLanded) {
  si::HostCommits hc(dir_ + "/slot-0");
  std::vector<char> one(4096, 1);
  ASSERT_FALSE(hc.write(1, entries(name_, one)));
  const std::string d1 = "d1", d2 = "d2";
  std::vector<char> two(100, 2);
  std::vector<si::EntryRef> refs = {si::EntryRef::of(name_, two), si::EntryRef::filled_later(d1, 3 << 20),
                                    si::EntryRef::filled_later(d2, 5)};
  std::vector<const char*> placed;
  std::shared_ptr<si::Completion> landed;
  ASSERT_FALSE(hc.write(2, refs, &placed, 0, &landed));
  ASSERT_TRUE(landed);
  ASSERT_EQ(placed.size(), 3u);
  EXPECT_FALSE(landed->complete());
  EXPECT_FALSE(hc.holds(2));
  EXPECT_TRUE(hc.holds(1));
  EXPECT_EQ(newest_id(), 1u);
  auto refused = hc.write(3, entries(name_, one));
  ASSERT_TRUE(refused);
  EXPECT_NE(refused->find("still being copied"), std::string::npos) << *refused;

  std::thread filler([&] {
    std::memset(const_cast<char*>(placed[1]), 7, 3 << 20);
    landed->done();
  });
  filler.join();
  EXPECT_FALSE(landed->complete());
  EXPECT_EQ(newest_id(), 1u) << "one filler is still to land";
  std::memcpy(const_cast<char*>(placed[2]), "hello", 5);
  landed->done();
  EXPECT_TRUE(landed->complete());
  auto f = si::HostCommits::newest(dir_);
  ASSERT_TRUE(f);
  ASSERT_EQ(f->snapshot.commit_id, 2u);
  ASSERT_EQ(f->snapshot.entries.size(), 3u);
  EXPECT_EQ(f->snapshot.entries[0].second, two);
  EXPECT_EQ(f->snapshot.entries[1].second, std::vector<char>(3 << 20, 7));
  EXPECT_EQ(std::string(f->snapshot.entries[2].second.begin(), f->snapshot.entries[2].second.end()), "hello");
  EXPECT_TRUE(hc.holds(2));
  // The next commit goes to the other file: commit 2 stays whole.
  ASSERT_FALSE(hc.write(3, entries(name_, one)));
  EXPECT_EQ(newest_id(), 3u);
  EXPECT_EQ(si::HostCommits::read(f->path)->commit_id, 2u);
}

// A commit whose entries are still to land must not look whole because the
// file's older bytes happen to hold its id where its trailer goes.
TEST_F(HostCommitsTest, OldBytesAtTheTrailerNeverMakeAPendingCommitWhole) {
  si::HostCommits hc(dir_ + "/slot-0");
  std::vector<uint64_t> threes(512, 3);  // 4 KiB of the id 3
  std::vector<char> old(sizeof(uint64_t) * threes.size());
  std::memcpy(old.data(), threes.data(), old.size());
  ASSERT_FALSE(hc.write(1, entries(name_, old)));  // file a
  std::vector<char> two(64, 2);
  ASSERT_FALSE(hc.write(2, entries(name_, two)));  // file b
  const std::string d = "d";
  std::vector<si::EntryRef> refs = {si::EntryRef::filled_later(d, 64)};
  std::vector<const char*> placed;
  std::shared_ptr<si::Completion> landed;
  ASSERT_FALSE(hc.write(3, refs, &placed, 0, &landed));  // file a again: its trailer lies in commit 1's data
  EXPECT_EQ(newest_id(), 2u);
  std::memset(const_cast<char*>(placed[0]), 5, 64);
  landed->done();
  EXPECT_EQ(newest_id(), 3u);
}

// Fillers that will not all land (a CUDA error after some copies started):
// the commit stays torn even if a late filler says done(), and the writer
// goes on into that file.
TEST_F(HostCommitsTest, AnAbandonedCommitStaysTornAndTheNextWriteGoesOn) {
  si::HostCommits hc(dir_ + "/slot-0");
  std::vector<char> one(64, 1);
  ASSERT_FALSE(hc.write(1, entries(name_, one)));
  const std::string d = "d";
  std::vector<si::EntryRef> refs = {si::EntryRef::filled_later(d, 64)};
  std::vector<const char*> placed;
  std::shared_ptr<si::Completion> landed;
  ASSERT_FALSE(hc.write(2, refs, &placed, 0, &landed));
  hc.abandon();
  landed->done();
  EXPECT_FALSE(landed->complete());
  EXPECT_EQ(newest_id(), 1u);
  std::vector<char> three(64, 3);
  ASSERT_FALSE(hc.write(3, entries(name_, three)));
  EXPECT_EQ(newest_id(), 3u);
  std::set<uint64_t> whole;
  for (auto suffix : {".a", ".b"}) {
    if (auto snap = si::HostCommits::read(dir_ + "/slot-0" + suffix)) whole.insert(snap->commit_id);
  }
  EXPECT_EQ(whole, (std::set<uint64_t>{1, 3}));
}

// What the GPU path registers with CUDA (MappingPinner), as a fake that
// keeps the ranges pinned: every mapping is pinned when made (or when the
// pinner comes), unpinned before it is unmapped (a file that grows is mapped
// anew), and none is left pinned when the writer goes. A refused pin leaves
// the files usable.
class FakePinner : public si::MappingPinner {
 public:
  bool pin(void* p, size_t n) override {
    ++pins;
    if (refuse) return false;
    EXPECT_EQ(pinned.count(static_cast<char*>(p)), 0u);
    pinned[static_cast<char*>(p)] = n;
    return true;
  }
  void unpin(void* p) override {
    EXPECT_EQ(pinned.erase(static_cast<char*>(p)), 1u) << "unpinned what was not pinned";
  }
  bool covers(const char* p, size_t n) const {
    for (const auto& [at, len] : pinned) {
      if (p >= at && p + n <= at + len) return true;
    }
    return false;
  }
  std::map<char*, size_t> pinned;
  int pins = 0;
  bool refuse = false;
};

TEST_F(HostCommitsTest, CommitFilesArePinnedForDeviceCopiesAndUnpinnedBeforeUnmapped) {
  // Only files in memory are pinned (a device copy into pinned pages of a
  // file on disk could be dropped): /dev/shm, as under erun.
  char tmpl[] = "/dev/shm/erun-host-commits-test-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string shm = tmpl;
  struct Cleanup {
    std::string dir;
    ~Cleanup() { fs::remove_all(dir); }
  } cleanup{shm};
  auto pinner = std::make_shared<FakePinner>();
  {
    si::HostCommits hc(shm + "/slot-0");
    std::vector<char> small(4096, 1);
    ASSERT_FALSE(hc.write(1, entries(name_, small)));  // file a mapped before any pinner
    EXPECT_TRUE(hc.set_pinner(pinner));
    EXPECT_EQ(pinner->pinned.size(), 1u);
    const std::string d = "d";
    for (uint64_t id = 2; id <= 6; ++id) {
      // Growing entries: each file is mapped anew.
      std::vector<si::EntryRef> refs = {si::EntryRef::filled_later(d, size_t{1} << (16 + id))};
      std::vector<const char*> placed;
      std::shared_ptr<si::Completion> landed;
      ASSERT_FALSE(hc.write(id, refs, &placed, 0, &landed));
      EXPECT_TRUE(pinner->covers(placed[0], refs[0].size)) << "commit " << id;
      EXPECT_LE(pinner->pinned.size(), 2u);
      landed->done();
    }
    auto f = si::HostCommits::newest(shm);
    ASSERT_TRUE(f);
    EXPECT_EQ(f->snapshot.commit_id, 6u);
    EXPECT_GE(pinner->pins, 5);
  }
  EXPECT_TRUE(pinner->pinned.empty()) << "a mapping was left pinned";

  pinner->refuse = true;
  {
    si::HostCommits hc(shm + "/slot-1");
    EXPECT_TRUE(hc.set_pinner(pinner));  // nothing mapped yet
    std::vector<char> data(8192, 9);
    ASSERT_FALSE(hc.write(7, entries(name_, data)));
    EXPECT_FALSE(hc.set_pinner(pinner));
    EXPECT_EQ(si::HostCommits::read(shm + "/slot-1.a")->commit_id, 7u);
  }
  // Files on disk are never pinned.
  if (struct statfs st {}; ::statfs(root_.c_str(), &st) == 0 && st.f_type != TMPFS_MAGIC) {
    pinner->refuse = false;
    const int pins = pinner->pins;
    si::HostCommits hc(dir_ + "/slot-2");
    hc.set_pinner(pinner);
    std::vector<char> data(8192, 9);
    ASSERT_FALSE(hc.write(8, entries(name_, data)));
    EXPECT_EQ(pinner->pins, pins);
  }
}

// Real deaths in the middle of real commits: a child process writes 8 MiB
// commits as fast as it can and is SIGKILLed at random moments, 25 times,
// each time by a new child in the same slot. After each kill the newest
// whole commit is never older than the one before, and every byte of it is
// that commit's (no mix of two commits).
TEST_F(HostCommitsTest, WorkersKilledInTheMiddleOfCommitsLeaveOnlyWholeCommits) {
  const std::string stem = dir_ + "/slot-0";
  const size_t bytes = size_t{8} << 20;
  uint64_t last = 0, start = 1;
  unsigned seed = 12345;
  for (int round = 0; round < 25; ++round) {
    // Odd rounds kill only after the child's first whole commit, so that a
    // loaded machine (every kill landing before any commit) cannot leave the
    // test with nothing to check; even rounds may kill the first one too.
    int started[2];
    ASSERT_EQ(::pipe(started), 0);
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(started[0]);
      si::HostCommits hc(stem);
      std::vector<char> data(bytes);
      const std::string name = "w";
      for (uint64_t id = start;; ++id) {
        std::memset(data.data(), static_cast<int>(id % 251), data.size());
        if (hc.write(id, entries(name, data))) ::_exit(3);
        if (id == start) {
          char one = 1;
          if (::write(started[1], &one, 1) != 1) ::_exit(4);
        }
      }
    }
    ::close(started[1]);
    if (round % 2 == 1) {
      pollfd p{started[0], POLLIN, 0};
      ASSERT_EQ(::poll(&p, 1, 20000), 1) << "the writer made no whole commit in 20 s";
    }
    seed = seed * 1103515245u + 12345u;
    ::usleep(2000 + (seed >> 8) % 30000);
    ::kill(pid, SIGKILL);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ::close(started[0]);  // open until the kill: the child's one byte never meets a closed pipe
    ASSERT_TRUE(WIFSIGNALED(status)) << "the writer failed: " << status;
    auto f = si::HostCommits::newest(dir_);
    if (!f) continue;  // killed before its first commit was whole
    const uint64_t id = f->snapshot.commit_id;
    EXPECT_GE(id, last) << "round " << round;
    ASSERT_EQ(f->snapshot.entries.size(), 1u);
    const auto& got = f->snapshot.entries[0].second;
    ASSERT_EQ(got.size(), bytes);
    const char want = static_cast<char>(id % 251);
    EXPECT_EQ(std::count(got.begin(), got.end(), want), static_cast<long>(bytes)) << "commit " << id;
    last = id;
    start = id + 1000;  // the next child's ids, newer than any this one wrote
  }
  EXPECT_GT(last, 0u);
}

// With host-memory commits a registered buffer is copied once per commit,
// straight into the host file, and restore() and sync() read it from there.
TEST_F(HostCommitsTest, RegisteredBuffersCommitIntoHostMemoryAndRestoreFromIt) {
  FakeHub hub(2);
  std::vector<std::vector<float>> got(2);
  run_threads(2, [&](int slot) {
    FakeContext ctx(hub, slot);
    ctx.set_host_commit_stem(dir_ + "/slot-fake-" + std::to_string(slot));
    State st(ctx);
    std::vector<float> w(100000, static_cast<float>(slot));  // the ranks start apart
    int64_t step = 0;
    st.register_buffer("w", w.data(), w.size() * sizeof(float));
    st.register_value("step", &step);
    st.sync();  // rank 0's values everywhere
    EXPECT_EQ(w[5], 0.0f);
    for (int i = 1; i <= 3; ++i) {
      for (auto& x : w) x += 1.0f;
      step = i;
      st.commit();
    }
    for (auto& x : w) x = -7.0f;  // progress after the commit
    step = 99;
    st.restore();
    got[static_cast<size_t>(slot)] = w;
    EXPECT_EQ(step, 3);
  });
  for (auto& w : got) EXPECT_EQ(w, std::vector<float>(100000, 3.0f));
  // The files hold it too, whole.
  auto f = si::HostCommits::newest(dir_);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->snapshot.commit_id, 3u);
  std::vector<char> three(100000 * sizeof(float));
  std::vector<float> threes(100000, 3.0f);
  std::memcpy(three.data(), threes.data(), three.size());
  bool found = false;
  for (auto& [name, b] : f->snapshot.entries) {
    if (name == "w") {
      found = true;
      EXPECT_EQ(b, three);
    }
  }
  EXPECT_TRUE(found);
}

// register_pieces with host-memory commits: the ranges go straight into the
// host file (a large one at an odd offset there, which the streaming copy
// must not trip over), restore() reads them back from it, a new rank syncs
// them, and a host that cannot take a commit keeps it in worker memory.
TEST_F(HostCommitsTest, PiecesCommitIntoHostMemoryAndRestoreAndSyncFromIt) {
  FakeHub solo(1), world(2);
  std::vector<std::string> got(2);
  auto register_blob = [](State& st, std::string& head, std::vector<char>& body, std::string& out) {
    st.register_pieces("blob", [&] {
      State::Pieces p;
      p.ranges = {{head.data(), head.size()}, {body.data(), body.size()}};
      return p;
    }, [&](const char* data, size_t size) { out.assign(data, size); });
  };
  run_threads(2, [&](int slot) {
    std::string head = "abc";  // 3 bytes: the body starts unaligned in the file
    std::vector<char> body(2 << 20, 'x');
    std::string& out = got[static_cast<size_t>(slot)];
    if (slot == 0) {
      FakeContext ctx(solo, 0);
      ctx.set_host_commit_stem(dir_ + "/slot-fake-0");
      State st(ctx);
      register_blob(st, head, body, out);
      st.sync();
      std::fill(body.begin(), body.end(), '1');
      st.commit();  // into host memory
      std::fill(body.begin(), body.end(), '2');
      with_no_room([&] { st.commit(); });  // the other file cannot grow: worker memory keeps commit 2
      std::fill(body.begin(), body.end(), '9');
      st.restore();
      EXPECT_EQ(out, "abc" + std::string(2 << 20, '2'));
      EXPECT_EQ(newest_id(), 1u);
      for (char c : {'3', '4'}) {
        std::fill(body.begin(), body.end(), c);
        st.commit();  // room again: back into host memory
      }
      std::fill(body.begin(), body.end(), '9');
      st.restore();  // from the host file
      EXPECT_EQ(out, "abc" + std::string(2 << 20, '4'));
      ctx.attach(world, 0);
      st.sync();
    } else {
      FakeContext ctx(world, 1);
      ctx.set_host_commit_stem(dir_ + "/slot-fake-1");
      State st(ctx);
      register_blob(st, head, body, out);
      st.sync();
    }
  });
  EXPECT_EQ(got[1], "abc" + std::string(2 << 20, '4'));
  // The file the new rank wrote after its sync holds the commit whole.
  auto f = si::HostCommits::read(dir_ + "/slot-fake-1.a");
  if (!f) f = si::HostCommits::read(dir_ + "/slot-fake-1.b");
  ASSERT_TRUE(f);
  EXPECT_EQ(f->commit_id, 4u);
  ASSERT_EQ(f->entries.size(), 1u);
  EXPECT_EQ(std::string(f->entries[0].second.begin(), f->entries[0].second.end()), "abc" + std::string(2 << 20, '4'));
}

// A new rank syncs from a rank whose buffer commit lives in host memory.
TEST_F(HostCommitsTest, ABufferCommittedToHostMemorySyncsToANewRank) {
  FakeHub solo(1), world(2);
  std::vector<std::vector<double>> got(2);
  run_threads(2, [&](int slot) {
    std::vector<double> w(5000, -1.0);
    if (slot == 0) {
      FakeContext ctx(solo, 0);
      ctx.set_host_commit_stem(dir_ + "/slot-fake-0");
      State st(ctx);
      st.register_buffer("w", w.data(), w.size() * sizeof(double));
      st.sync();
      for (int i = 0; i < 4; ++i) {
        for (auto& x : w) x = i + 0.25;
        st.commit();
      }
      for (auto& x : w) x = 42.0;  // uncommitted: rolled back by the sync
      ctx.attach(world, 0);
      st.sync();
      got[0] = w;
    } else {
      FakeContext ctx(world, 1);
      ctx.set_host_commit_stem(dir_ + "/slot-fake-1");
      State st(ctx);
      st.register_buffer("w", w.data(), w.size() * sizeof(double));
      st.sync();
      got[1] = w;
    }
  });
  EXPECT_EQ(got[0], std::vector<double>(5000, 3.25));
  EXPECT_EQ(got[1], std::vector<double>(5000, 3.25));
}

// A host that cannot take a commit: the buffer's commit stays in worker
// memory, and restore() still returns to it.
TEST_F(HostCommitsTest, ABufferWhoseHostCommitFailsIsKeptInWorkerMemory) {
  FakeHub hub(1);
  FakeContext ctx(hub, 0);
  ctx.set_host_commit_stem(dir_ + "/slot-fake-0");
  State st(ctx);
  std::vector<char> w(1 << 20, 1);
  st.register_buffer("w", w.data(), w.size());
  st.sync();
  st.commit();  // into host memory
  std::fill(w.begin(), w.end(), 2);
  with_no_room([&] { st.commit(); });  // the other file cannot grow: worker memory keeps commit 2
  std::fill(w.begin(), w.end(), 3);
  st.restore();
  EXPECT_EQ(w, std::vector<char>(1 << 20, 2));
  EXPECT_EQ(newest_id(), 1u);
  std::fill(w.begin(), w.end(), 4);
  st.commit();  // room again: back into host memory
  std::fill(w.begin(), w.end(), 5);
  st.restore();
  EXPECT_EQ(w, std::vector<char>(1 << 20, 4));
  EXPECT_EQ(newest_id(), 3u);
}

// Two States of one worker keep their commits apart, and a new worker's
// States each restore their own after every worker died; a State made after
// another was destroyed in the same worker starts afresh instead of
// adopting that one's commits.
TEST_F(HostCommitsTest, EachStateOfAWorkerHasItsOwnHostCommits) {
  const std::string stem = dir_ + "/slot-fake-0";
  {
    FakeHub hub(1);
    FakeContext ctx(hub, 0);
    ctx.set_host_commit_stem(stem);
    {
      int64_t a = 0;
      std::vector<char> b(1000, 0);
      State sa(ctx), sb(ctx);
      sa.register_value("a", &a);
      sb.register_buffer("b", b.data(), b.size());
      sa.sync();
      sb.sync();
      for (int i = 1; i <= 3; ++i) {
        a = 10 * i;
        sa.commit();
      }
      std::fill(b.begin(), b.end(), 7);
      sb.commit();
    }
    EXPECT_TRUE(fs::exists(stem + ".a"));
    EXPECT_TRUE(fs::exists(stem + "-s1.a"));
    auto first = si::HostCommits::newest(dir_, 0), second = si::HostCommits::newest(dir_, 1);
    ASSERT_TRUE(first && second);
    EXPECT_EQ(first->snapshot.commit_id, 3u);
    EXPECT_EQ(first->snapshot.entries[0].first, "a");
    EXPECT_EQ(second->snapshot.commit_id, 1u);
    EXPECT_EQ(second->snapshot.entries[0].first, "b");
  }
  EXPECT_EQ(si::HostCommits::ordinal_of("slot-h-0.a"), 0);
  EXPECT_EQ(si::HostCommits::ordinal_of("slot-h-0-s1.b"), 1);
  EXPECT_EQ(si::HostCommits::ordinal_of("slot-node-s2-3-s12.a"), 12);
  FakeHub hub(1);
  FakeContext ctx(hub, 0);  // a new worker in the slot
  ctx.set_host_commit_stem(stem);
  {
    int64_t a = -1;
    std::vector<char> b(1000, 0);
    State sa(ctx), sb(ctx);
    sa.register_value("a", &a);
    sb.register_buffer("b", b.data(), b.size());
    sa.sync();
    sb.sync();
    EXPECT_EQ(a, 30);
    EXPECT_EQ(b, std::vector<char>(1000, 7));
  }
  // The same worker's next State of number 0 does not take the destroyed
  // one's commit 3, and empties its files.
  int64_t a = -1;
  State again(ctx);
  again.register_value("a", &a);
  again.sync();
  EXPECT_EQ(a, -1);
  EXPECT_EQ(again.commit_id(), 0u);
  EXPECT_FALSE(si::HostCommits::newest(dir_, 0));
  again.commit();
  EXPECT_EQ(si::HostCommits::newest(dir_, 0)->snapshot.commit_id, 1u);
}

}  // namespace
}  // namespace erun
