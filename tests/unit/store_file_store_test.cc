// FileKvStore: values published atomically under any key, visible to other
// threads as soon as set, get() bounded by its timeout.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "store/file_store.h"
#include "support/erun_process.h"

namespace erun {
namespace {

using namespace std::chrono_literals;

class FileStoreTest : public ::testing::Test {
 protected:
  testing::TempDir tmp_;
  const std::string dir_ = tmp_.path();
};

TEST_F(FileStoreTest, SetThenGetAnyKey) {
  FileKvStore store(dir_ + "/sub/dir");
  const std::vector<std::string> keys = {"a", "gen3/gloo/0", "..", ".hidden", "with space%", ""};
  for (size_t i = 0; i < keys.size(); ++i) {
    std::vector<char> v(i * 1000 + 1, static_cast<char>(i));
    store.set(keys[i], v);
    EXPECT_EQ(store.get(keys[i], 1s), v) << "key '" << keys[i] << "'";
  }
  EXPECT_TRUE(store.check(keys));
  EXPECT_FALSE(store.check({"a", "missing"}));
  store.set("a", {'x'});
  EXPECT_EQ(store.get("a", 1s), std::vector<char>{'x'});
  // No temp files left behind; only one file per key.
  size_t files = 0;
  for (auto& e : std::filesystem::directory_iterator(dir_ + "/sub/dir")) {
    EXPECT_NE(e.path().filename().string().rfind(".tmp", 0), 0u) << e.path();
    ++files;
  }
  EXPECT_EQ(files, keys.size());
}

TEST_F(FileStoreTest, GetWaitsForALaterSet) {
  FileKvStore store(dir_);
  std::thread writer([&] {
    std::this_thread::sleep_for(100ms);
    FileKvStore(dir_).set("late", {'o', 'k'});
  });
  EXPECT_EQ(store.get("late", 30s), (std::vector<char>{'o', 'k'}));
  writer.join();
}

TEST_F(FileStoreTest, GetTimesOutWithCommErrorNamingTheKey) {
  FileKvStore store(dir_);
  auto start = std::chrono::steady_clock::now();
  try {
    store.get("never", 200ms);
    FAIL() << "get of a missing key returned";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("never"), std::string::npos) << e.what();
  }
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, 200ms);
  EXPECT_LT(took, 10s);
}

TEST_F(FileStoreTest, UnwritableDirectoryIsACommError) {
  EXPECT_THROW(FileKvStore("/proc/erun-cannot-be-here"), CommError);
}

TEST_F(FileStoreTest, LinksAreNeverFollowedAndSharedDirectoriesAreRefused) {
  const std::string victim = dir_ + "/victim";
  std::ofstream(victim) << "precious";
  FileKvStore store(dir_ + "/s");
  std::filesystem::create_symlink(victim, dir_ + "/s/k");  // planted at a key's name
  for (int i = 0; i < 4; ++i) {
    std::filesystem::create_symlink(victim, dir_ + "/s/.tmp." + std::to_string(::getpid()) + "." + std::to_string(i));
  }
  // A link at the key is not read through...
  EXPECT_THROW(store.get("k", 50ms), CommError);
  // ...and set() replaces it instead of writing through it.
  store.set("k", {'v'});
  EXPECT_EQ(store.get("k", 1s), std::vector<char>{'v'});
  std::ifstream in(victim);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "precious");
  struct stat st {};
  ASSERT_EQ(::lstat((dir_ + "/s/k").c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  ASSERT_EQ(::chmod((dir_ + "/s").c_str(), 0777), 0);
  EXPECT_THROW(FileKvStore(dir_ + "/s"), CommError);
}

}  // namespace
}  // namespace erun
