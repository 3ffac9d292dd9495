// Durable commits: DIR/erun-state.bin written atomically by rank 0, read back
// by a new State; corrupt or truncated files are rejected, and leftovers of a
// crashed writer never hide the previous good commit.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>

#include "erun/erun.hpp"
#include "state_fake_world.h"

namespace erun {
namespace {

namespace fs = std::filesystem;
using testing::FakeContext;
using testing::FakeHub;
using testing::run_threads;

class StateDurable : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/erun-state-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string file() const { return dir_ + "/erun-state.bin"; }
  std::vector<char> read(const std::string& path) const {
    std::ifstream in(path, std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(in), {});
  }
  void write(const std::string& path, const std::vector<char>& bytes) const {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }

  // A worker's state: a step counter, a vector and a string.
  struct Model {
    int64_t step = 0;
    std::vector<float> w{0.f, 0.f};
    std::string tag = "init";
    void attach(State& st) {
      st.register_value("step", &step);
      st.register_vector("w", &w);
      st.register_string("tag", &tag);
    }
  };

  // Commits `commits` steps in a fresh State on a world of one.
  void train(int commits) {
    FakeHub hub(1);
    FakeContext ctx(hub, 0);
    State st(ctx);
    Model m;
    m.attach(st);
    st.set_checkpoint_dir(dir_);
    for (int i = 0; i < commits; ++i) {
      ++m.step;
      m.w.push_back(static_cast<float>(m.step));
      m.tag = "step-" + std::to_string(m.step);
      st.commit();
    }
  }

  std::string dir_;
};

TEST_F(StateDurable, ARestartedWorkerResumesAtTheLastCommit) {
  train(3);
  ASSERT_TRUE(fs::exists(file()));
  FakeHub hub(1);
  FakeContext ctx(hub, 0);
  State st(ctx);
  Model m;
  m.attach(st);
  st.set_checkpoint_dir(dir_);
  EXPECT_EQ(st.commit_id(), 3u);
  EXPECT_EQ(m.step, 3);
  EXPECT_EQ(m.w, (std::vector<float>{0.f, 0.f, 1.f, 2.f, 3.f}));
  EXPECT_EQ(m.tag, "step-3");
  m.step = 100;
  st.restore();
  EXPECT_EQ(m.step, 3);
  // Later commits continue the numbering.
  st.commit();
  EXPECT_EQ(st.commit_id(), 4u);
  // No temp file is left behind.
  for (auto& e : fs::directory_iterator(dir_)) EXPECT_EQ(e.path().filename(), "erun-state.bin");
}

TEST_F(StateDurable, OnlyRankZeroWritesAndSyncSpreadsTheResumedCommit) {
  train(2);
  FakeHub hub(3);
  std::vector<int64_t> steps(3);
  std::vector<uint64_t> ids(3);
  run_threads(3, [&](int r) {
    FakeContext ctx(hub, r);
    State st(ctx);
    Model m;
    m.attach(st);
    // Only rank 0 sees the directory (as on a host-local disk).
    if (r == 0) st.set_checkpoint_dir(dir_);
    st.sync();
    steps[static_cast<size_t>(r)] = m.step;
    ids[static_cast<size_t>(r)] = st.commit_id();
    ++m.step;
    st.commit();
  });
  EXPECT_EQ(steps, std::vector<int64_t>(3, 2));
  EXPECT_EQ(ids, std::vector<uint64_t>(3, 2));
  FakeHub hub1(1);
  FakeContext ctx(hub1, 0);
  State st(ctx);
  Model m;
  m.attach(st);
  st.set_checkpoint_dir(dir_);
  EXPECT_EQ(st.commit_id(), 3u);
  EXPECT_EQ(m.step, 3);
}

TEST_F(StateDurable, CorruptFileIsRejectedWithAClearMessage) {
  train(2);
  std::vector<char> bytes = read(file());
  bytes[bytes.size() / 2] ^= 0x40;
  write(file(), bytes);
  FakeHub hub(1);
  FakeContext ctx(hub, 0);
  State st(ctx);
  Model m;
  m.attach(st);
  try {
    st.set_checkpoint_dir(dir_);
    FAIL() << "expected erun::Error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(file()), std::string::npos) << msg;
    EXPECT_NE(msg.find("checksum"), std::string::npos) << msg;
    EXPECT_NE(msg.find("remove it"), std::string::npos) << msg;
  }
  EXPECT_EQ(m.step, 0);
  EXPECT_EQ(st.commit_id(), 0u);
}

TEST_F(StateDurable, TruncatedFileIsRejected) {
  train(2);
  std::vector<char> bytes = read(file());
  for (size_t keep : {size_t{0}, size_t{10}, bytes.size() - 1}) {
    write(file(), std::vector<char>(bytes.begin(), bytes.begin() + static_cast<long>(keep)));
    FakeHub hub(1);
    FakeContext ctx(hub, 0);
    State st(ctx);
    Model m;
    m.attach(st);
    EXPECT_THROW(st.set_checkpoint_dir(dir_), Error) << "kept " << keep << " bytes";
  }
}

TEST_F(StateDurable, NotAStateFileIsRejected) {
  write(file(), std::vector<char>(100, 'x'));
  FakeHub hub(1);
  FakeContext ctx(hub, 0);
  State st(ctx);
  try {
    st.set_checkpoint_dir(dir_);
    FAIL() << "expected erun::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("magic"), std::string::npos) << e.what();
  }
}

TEST_F(StateDurable, PartialTempFileFromACrashDoesNotHideThePreviousCommit) {
  train(2);
  std::vector<char> good = read(file());
  // A writer that crashed half way through commit 3.
  std::string tmp = dir_ + "/.erun-state.bin.tmp.999999";
  write(tmp, std::vector<char>(good.begin(), good.begin() + static_cast<long>(good.size() / 2)));
  FakeHub hub(1);
  FakeContext ctx(hub, 0);
  State st(ctx);
  Model m;
  m.attach(st);
  st.set_checkpoint_dir(dir_);
  EXPECT_EQ(st.commit_id(), 2u);
  EXPECT_EQ(m.tag, "step-2");
  EXPECT_FALSE(fs::exists(tmp)) << "rank 0 removes a crashed writer's temp file";
}

TEST_F(StateDurable, CrashBetweenTempWriteAndRenameLeavesThePreviousCommit) {
  train(3);
  std::vector<char> third = read(file());
  fs::remove(file());
  train(2);
  // Commit 3 fully written and synced to its temp file, then the process died
  // before rename(): the target still holds commit 2.
  std::string tmp = dir_ + "/.erun-state.bin.tmp.999998";
  write(tmp, third);
  FakeHub hub(1);
  FakeContext ctx(hub, 0);
  State st(ctx);
  Model m;
  m.attach(st);
  st.set_checkpoint_dir(dir_);
  EXPECT_EQ(st.commit_id(), 2u);
  EXPECT_EQ(m.step, 2);
}

TEST_F(StateDurable, EntryOfAnotherTypeIsAnErrorNamingIt) {
  train(1);
  FakeHub hub(1);
  FakeContext ctx(hub, 0);
  State st(ctx);
  int32_t step = 0;  // was int64_t when written
  std::vector<float> w;
  std::string tag;
  st.register_value("step", &step);
  st.register_vector("w", &w);
  st.register_string("tag", &tag);
  try {
    st.set_checkpoint_dir(dir_);
    FAIL() << "expected erun::Error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("'step'"), std::string::npos) << msg;
  }
}

TEST_F(StateDurable, UnknownEntryInTheFileIsAnError) {
  train(1);
  FakeHub hub(1);
  FakeContext ctx(hub, 0);
  State st(ctx);
  int64_t step = 0;
  std::string tag;
  st.register_value("step", &step);
  st.register_string("tag", &tag);  // "w" is missing
  try {
    st.set_checkpoint_dir(dir_);
    FAIL() << "expected erun::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'w'"), std::string::npos) << e.what();
  }
}

TEST_F(StateDurable, LargeBufferRoundTrip) {
  std::vector<uint32_t> big((16u << 20) / sizeof(uint32_t));
  std::iota(big.begin(), big.end(), 3u);
  {
    FakeHub hub(1);
    FakeContext ctx(hub, 0);
    State st(ctx);
    st.register_buffer("big", big.data(), big.size() * sizeof(uint32_t));
    st.set_checkpoint_dir(dir_);
    st.commit();
  }
  std::vector<uint32_t> back(big.size(), 0);
  FakeHub hub(1);
  FakeContext ctx(hub, 0);
  State st(ctx);
  st.register_buffer("big", back.data(), back.size() * sizeof(uint32_t));
  st.set_checkpoint_dir(dir_);
  EXPECT_EQ(back, big);
}

}  // namespace
}  // namespace erun
