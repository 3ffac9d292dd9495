// Durable commits against a hostile checkpoint directory: symbolic links
// planted at the target and at temp names, a directory writable by other
// users or owned by another user, a checkpoint file that is a link. In every
// case nothing outside the directory is touched, and a refusal is a clear
// erun::Error naming the directory and what to do.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "erun/erun.hpp"
#include "state_fake_world.h"

namespace erun {
namespace {

namespace fs = std::filesystem;
using testing::FakeContext;
using testing::FakeHub;

std::string make_temp_dir() {
  char tmpl[] = "/tmp/erun-hardening-XXXXXX";
  EXPECT_NE(::mkdtemp(tmpl), nullptr);
  return tmpl;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class DurableHardening : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = make_temp_dir();
    dir_ = root_ + "/ckpt";
    outside_ = root_ + "/outside";
    fs::create_directory(outside_);
    victim_ = outside_ + "/victim";
    std::ofstream(victim_) << "precious";
  }
  void TearDown() override { fs::remove_all(root_); }

  // Nothing outside the checkpoint directory changed.
  void expect_outside_untouched() {
    EXPECT_EQ(slurp(victim_), "precious");
    size_t n = 0;
    for (auto& e : fs::directory_iterator(outside_)) {
      ++n;
      EXPECT_EQ(e.path().filename(), "victim");
    }
    EXPECT_EQ(n, 1u);
  }

  std::string root_, dir_, outside_, victim_;
};

struct OneRank {
  FakeHub hub{1};
  FakeContext ctx{hub, 0};
  State st{ctx};
  int64_t step = 0;
  OneRank() { st.register_value("step", &step); }
};

TEST_F(DurableHardening, NewDirectoryAndFileArePrivate) {
  OneRank w;
  w.st.set_checkpoint_dir(dir_);
  w.step = 5;
  w.st.commit();
  struct stat st {};
  ASSERT_EQ(::stat(dir_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  ASSERT_EQ(::lstat((dir_ + "/erun-state.bin").c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0600u);
}

TEST_F(DurableHardening, LinkAtTheTargetIsReplacedNotFollowed) {
  OneRank w;
  w.st.set_checkpoint_dir(dir_);
  fs::create_symlink(victim_, dir_ + "/erun-state.bin");
  w.step = 7;
  w.st.commit();
  expect_outside_untouched();
  EXPECT_FALSE(fs::is_symlink(dir_ + "/erun-state.bin"));
  OneRank back;
  back.st.set_checkpoint_dir(dir_);
  EXPECT_EQ(back.step, 7);
}

TEST_F(DurableHardening, LinkAtTheTargetIsNotReadEither) {
  ASSERT_EQ(::mkdir(dir_.c_str(), 0700), 0);
  fs::create_symlink(victim_, dir_ + "/erun-state.bin");
  OneRank w;
  try {
    w.st.set_checkpoint_dir(dir_);
    FAIL() << "expected erun::Error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(dir_ + "/erun-state.bin"), std::string::npos) << msg;
    EXPECT_NE(msg.find("symbolic link"), std::string::npos) << msg;
  }
  expect_outside_untouched();
}

TEST_F(DurableHardening, LinksAtTempNamesAreNeverWrittenThroughAndStaleOnesGoWithoutTheirTarget) {
  ASSERT_EQ(::mkdir(dir_.c_str(), 0700), 0);
  // Every name an older erun or a guesser would use for this process.
  const std::string pid = std::to_string(::getpid());
  for (const std::string& n : {".erun-state.bin.tmp." + pid, ".erun-state.bin.tmp." + pid + ".0",
                               ".erun-state.bin.tmp." + pid + ".0000000000000000"}) {
    fs::create_symlink(victim_, dir_ + "/" + n);
  }
  fs::create_symlink(victim_, dir_ + "/.erun-state.bin.tmp.1");  // a "stale" one of another pid
  OneRank w;
  w.st.set_checkpoint_dir(dir_);  // removes the other pid's link, not the victim
  EXPECT_FALSE(fs::exists(fs::symlink_status(dir_ + "/.erun-state.bin.tmp.1")));
  for (int i = 0; i < 5; ++i) {
    ++w.step;
    w.st.commit();
  }
  expect_outside_untouched();
  OneRank back;
  back.st.set_checkpoint_dir(dir_);
  EXPECT_EQ(back.step, 5);
}

TEST_F(DurableHardening, DirectoryWritableByOthersIsRefused) {
  ASSERT_EQ(::mkdir(dir_.c_str(), 0700), 0);
  for (mode_t mode : {0777, 0770, 0722}) {
    ASSERT_EQ(::chmod(dir_.c_str(), mode), 0);
    OneRank w;
    try {
      w.st.set_checkpoint_dir(dir_);
      FAIL() << "expected erun::Error for mode " << std::oct << mode;
    } catch (const Error& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find("checkpoint directory " + dir_), std::string::npos) << msg;
      EXPECT_NE(msg.find("writable by other users"), std::string::npos) << msg;
      EXPECT_NE(msg.find("chmod go-w " + dir_), std::string::npos) << msg;
    }
  }
  // With the sticky bit others cannot remove or rename this user's files.
  ASSERT_EQ(::chmod(dir_.c_str(), 01777), 0);
  OneRank ok;
  EXPECT_NO_THROW(ok.st.set_checkpoint_dir(dir_));
}

TEST_F(DurableHardening, DirectoryThatBecomesWritableByOthersStopsTheCommit) {
  OneRank w;
  w.st.set_checkpoint_dir(dir_);
  w.step = 1;
  w.st.commit();
  ASSERT_EQ(::chmod(dir_.c_str(), 0777), 0);
  w.step = 2;
  EXPECT_THROW(w.st.commit(), Error);
  ASSERT_EQ(::chmod(dir_.c_str(), 0700), 0);
  OneRank back;
  back.st.set_checkpoint_dir(dir_);
  EXPECT_EQ(back.step, 1);  // the refused commit wrote nothing
}

TEST_F(DurableHardening, DirectoryOrFileOwnedByAnotherUserIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a directory to another user";
  ASSERT_EQ(::mkdir(dir_.c_str(), 0700), 0);
  ASSERT_EQ(::chown(dir_.c_str(), 65534, 65534), 0);
  {
    OneRank w;
    try {
      w.st.set_checkpoint_dir(dir_);
      FAIL() << "expected erun::Error";
    } catch (const Error& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find(dir_), std::string::npos) << msg;
      EXPECT_NE(msg.find("owned by uid 65534"), std::string::npos) << msg;
      EXPECT_NE(msg.find("use a directory you own"), std::string::npos) << msg;
    }
  }
  // Our directory, but a checkpoint file planted by another user.
  ASSERT_EQ(::chown(dir_.c_str(), 0, 0), 0);
  {
    OneRank w;
    w.st.set_checkpoint_dir(dir_);
    w.st.commit();
  }
  ASSERT_EQ(::chown((dir_ + "/erun-state.bin").c_str(), 65534, 65534), 0);
  OneRank w;
  EXPECT_THROW(w.st.set_checkpoint_dir(dir_), Error);
}

}  // namespace
}  // namespace erun
