// The same programs under a real Open MPI mpirun: erun::init() bootstraps from
// MPI, every collective matches a reference at np 2 and 4, the training example
// ends at the same checksum as a single-process run, and a SIGKILLed rank ends
// the job (non-zero) instead of hanging, leaving no process behind.
#include <gtest/gtest.h>
#include <signal.h>

#include <regex>

#include "common/subprocess.h"
#include "common/strings.h"
#include "support/erun_process.h"
#include "support/process_utils.h"

namespace erun::testing {
namespace {

using namespace std::chrono_literals;

struct Outcome {
  std::optional<ExitStatus> status;  // nullopt: still running at the deadline (killed)
  std::string output;                // stdout and stderr together
};

// Runs `command` through sh with stderr merged into stdout, bounded by `timeout`.
Outcome run_shell(const std::string& command, Duration timeout) {
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", "exec " + command + " 2>&1"};
  o.pipe_stdout = true;
  o.pipe_stderr = false;
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  env.emplace_back("OMPI_ALLOW_RUN_AS_ROOT=1");
  env.emplace_back("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1");
  // Loopback only, and no warnings about missing high-speed networks.
  env.emplace_back("OMPI_MCA_btl_tcp_if_include=lo");
  env.emplace_back("OMPI_MCA_oob_tcp_if_include=lo");
  o.env = env;
  auto p = Subprocess::spawn(o);
  Outcome out;
  if (!p) {
    out.output = p.message();
    return out;
  }
  auto deadline = std::chrono::steady_clock::now() + timeout;
  read_all_until(p->stdout_fd(), out.output, deadline);
  out.status = p->wait_for(std::max<Duration>(deadline - std::chrono::steady_clock::now(), Duration(0)));
  if (!out.status) p->terminate(2s);
  return out;
}

bool have_mpirun() { return run_shell("mpirun --version", 30s).status.value_or(ExitStatus{1, 0}).ok(); }

std::string mpirun(int np) { return "mpirun --oversubscribe --bind-to none -np " + std::to_string(np) + " "; }

std::string checksum_line(const std::string& output) {
  std::smatch m;
  std::regex re("final accuracy=\\S+ loss=\\S+ checksum=[0-9a-f]+");
  return std::regex_search(output, m, re) ? m[0].str() : "";
}

class MpiTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
#if !ERUN_HAVE_MPI
    GTEST_SKIP() << "erun built without MPI (ERUN_WITH_MPI=OFF)";
#endif
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not found (install openmpi-bin)";
  }
};

TEST_P(MpiTest, CollectivesMatchTheReferenceForEveryTypeAndOp) {
  int np = GetParam();
  auto r = run_shell(mpirun(np) + build_path("tests/programs/mpi_collectives"), 240s);
  ASSERT_TRUE(r.status) << "mpirun did not end in time:\n" << r.output;
  EXPECT_EQ(r.status->shell_code(), 0) << r.output;
  EXPECT_NE(r.output.find("mpi_collectives: OK size=" + std::to_string(np)), std::string::npos) << r.output;
}

TEST_P(MpiTest, TrainingExampleEndsAtTheSameModelAsASingleProcess) {
  int np = GetParam();
  const std::string program = build_path("examples/train_mlp") + " --samples 4000 --epochs 2";
  auto single = run_shell(program, 120s);
  ASSERT_TRUE(single.status && single.status->ok()) << single.output;
  std::string want = checksum_line(single.output);
  ASSERT_FALSE(want.empty()) << single.output;

  auto r = run_shell(mpirun(np) + program, 240s);
  ASSERT_TRUE(r.status) << "mpirun did not end in time:\n" << r.output;
  EXPECT_EQ(r.status->shell_code(), 0) << r.output;
  EXPECT_EQ(checksum_line(r.output), want) << r.output;
  EXPECT_NE(r.output.find("world=" + std::to_string(np)), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("(elastic)"), std::string::npos) << "an MPI job must not call itself elastic";
}

INSTANTIATE_TEST_SUITE_P(Np, MpiTest, ::testing::Values(2, 4), [](const auto& info) {
  return "np" + std::to_string(info.param);
});

TEST(MpiFault, SigkilledRankEndsTheJobWithoutHanging) {
#if !ERUN_HAVE_MPI
  GTEST_SKIP() << "erun built without MPI";
#endif
  if (!have_mpirun()) GTEST_SKIP() << "mpirun not found";
  const std::string marker = build_path("tests/programs/mpi_collectives");
  auto t0 = std::chrono::steady_clock::now();
  auto r = run_shell(mpirun(3) + marker + " --die-rank 1", 120s);
  double took = seconds(std::chrono::steady_clock::now() - t0);
  ASSERT_TRUE(r.status) << "mpirun hung after a rank was SIGKILLed:\n" << r.output;
  EXPECT_NE(r.status->shell_code(), 0) << r.output;
  EXPECT_NE(r.output.find("rank 1: killing myself"), std::string::npos) << r.output;
  // Open MPI names the dead rank and the signal.
  EXPECT_NE(r.output.find("signal 9"), std::string::npos) << r.output;
  std::vector<pid_t> left;
  EXPECT_TRUE(wait_no_process(marker + " --die-rank", 30s, &left)) << describe_pids(left);
  std::printf("job ended %.2f s after start (exit %s)\n", took, r.status->describe().c_str());
}

}  // namespace
}  // namespace erun::testing
