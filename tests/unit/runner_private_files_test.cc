// common/private_files: what erun writes on a user's behalf is never written
// through a planted link, is private (0600 files, 0700 directories), and a
// directory another user can change is refused with a message naming it and
// what to do. Also the event log (--event-log), which opens its file this way.
#include "common/private_files.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "runner/observe/event_log.h"

namespace erun {
namespace {

namespace fs = std::filesystem;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class PrivateFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/erun-private-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    victim_ = dir_ + "/victim";
    std::ofstream(victim_) << "precious";
  }
  void TearDown() override { fs::remove_all(dir_); }
  mode_t mode_of(const std::string& p) const {
    struct stat st {};
    EXPECT_EQ(::lstat(p.c_str(), &st), 0) << p;
    return st.st_mode & 07777;
  }
  std::string dir_, victim_;
};

TEST_F(PrivateFiles, AppendCreatesA0600FileAndRefusesALink) {
  auto fd = open_private_append(dir_ + "/log", "--event-log");
  ASSERT_TRUE(fd) << fd.message();
  ::close(fd.value());
  EXPECT_EQ(mode_of(dir_ + "/log"), 0600u);
  fs::create_symlink(victim_, dir_ + "/link");
  auto bad = open_private_append(dir_ + "/link", "--event-log");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.message().find("--event-log " + dir_ + "/link is a symbolic link"), std::string::npos)
      << bad.message();
  EXPECT_EQ(slurp(victim_), "precious");
}

TEST_F(PrivateFiles, AppendRefusesAFileOfAnotherUser) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a file to another user";
  std::ofstream(dir_ + "/theirs") << "x";
  ASSERT_EQ(::chown((dir_ + "/theirs").c_str(), 65534, 65534), 0);
  auto bad = open_private_append(dir_ + "/theirs", "--output-filename file");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.message().find("owned by uid 65534"), std::string::npos) << bad.message();
}

TEST_F(PrivateFiles, EnsureDirCreates0700AndRefusesSharedOrLinkedDirectories) {
  ASSERT_TRUE(ensure_private_dir(dir_ + "/a/b", "checkpoint directory"));
  EXPECT_EQ(mode_of(dir_ + "/a/b"), 0700u);
  ASSERT_EQ(::chmod((dir_ + "/a/b").c_str(), 0777), 0);
  Status shared = ensure_private_dir(dir_ + "/a/b", "checkpoint directory");
  ASSERT_FALSE(shared);
  EXPECT_NE(shared.message().find("chmod go-w " + dir_ + "/a/b"), std::string::npos) << shared.message();
  EXPECT_TRUE(ensure_private_dir(dir_ + "/a/b", "x", DirPolicy{.refuse_shared_write = false}));
  fs::create_directory_symlink(dir_ + "/a", dir_ + "/linked");
  EXPECT_TRUE(ensure_private_dir(dir_ + "/linked", "checkpoint directory"));  // a link the user chose
  Status linked = ensure_private_dir(dir_ + "/linked", "--output-filename directory", DirPolicy{.refuse_link = true});
  ASSERT_FALSE(linked);
  EXPECT_NE(linked.message().find("symbolic link"), std::string::npos) << linked.message();
}

TEST_F(PrivateFiles, TempFilesAreNewPrivateAndRandomlyNamed) {
  int dfd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(dfd, 0);
  std::string a, b;
  auto fa = create_private_temp(dfd, dir_, ".t.", &a);
  auto fb = create_private_temp(dfd, dir_, ".t.", &b);
  ASSERT_TRUE(fa && fb);
  EXPECT_NE(a, b);
  EXPECT_EQ(a.rfind(".t.", 0), 0u);
  EXPECT_EQ(mode_of(dir_ + "/" + a), 0600u);
  ::close(fa.value());
  ::close(fb.value());
  ::close(dfd);
}

TEST_F(PrivateFiles, EventLogRefusesALinkAndWritesA0600File) {
  fs::create_symlink(victim_, dir_ + "/events.jsonl");
  EventLog bad;
  Status s = bad.open(dir_ + "/events.jsonl");
  EXPECT_FALSE(s);
  EXPECT_NE(s.message().find("symbolic link"), std::string::npos) << s.message();
  EXPECT_EQ(slurp(victim_), "precious");
  EventLog good;
  ASSERT_TRUE(good.open(dir_ + "/events2.jsonl"));
  good.emit(ev::JobStarted{});
  EXPECT_EQ(mode_of(dir_ + "/events2.jsonl"), 0600u);
  EXPECT_NE(slurp(dir_ + "/events2.jsonl").find("job_started"), std::string::npos);
}

}  // namespace
}  // namespace erun
