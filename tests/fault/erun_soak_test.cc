// The short fault soak (bench/soak.py): random faults (SIGKILL, SIGSTOP, hosts
// removed and added, slot changes, discovery failing or printing junk) against
// one running in-place job of examples/train_mlp under the real erun. The
// script checks exit 0, the exact model, no restart from epoch 0, no process
// left; this test runs it with a fixed seed and asserts it passed.
#include <gtest/gtest.h>

#include "common/subprocess.h"
#include "support/erun_process.h"
#include "support/process_utils.h"

namespace erun::testing {
namespace {

using namespace std::chrono_literals;

TEST(ErunSoak, SixRandomFaultsEndAtTheExactModelWithoutRestartingFromScratch) {
  TempDir dir;
  SpawnOptions o;
  o.argv = {"/usr/bin/python3", source_path("bench/soak.py"), "--build", build_path(""), "--faults", "6",
            "--seed", "7", "--json", dir.file("summary.json")};
  o.pipe_stderr = false;
  auto p = Subprocess::spawn(o);
  ASSERT_TRUE(p) << p.message();
  std::string out;
  read_all_until(p->stdout_fd(), out, std::chrono::steady_clock::now() + 280s);
  auto s = p->wait_for(10s);
  ASSERT_TRUE(s) << "soak did not finish\n" << out;
  EXPECT_EQ(s->shell_code(), 0) << out;
  std::string summary = read_file(dir.file("summary.json"));
  EXPECT_NE(summary.find("\"passed\": true"), std::string::npos) << summary << out;
  EXPECT_NE(summary.find("\"restarts_from_epoch_0\": 0"), std::string::npos) << summary;
}

}  // namespace
}  // namespace erun::testing
