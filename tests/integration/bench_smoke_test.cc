// The benchmark harness must not rot: bench/run.sh --smoke runs every
// benchmark once at a tiny size (no torch, no docs written) and each prints
// its RESULT line.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "common/subprocess.h"
#include "support/erun_process.h"

namespace erun::testing {
namespace {

using namespace std::chrono_literals;

long mtime_of(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<long>(st.st_mtime) : -1;
}

TEST(BenchSmoke, EveryBenchmarkRunsOnceAndPrintsItsResult) {
  const std::string doc = source_path("docs/performance.md");
  const long doc_before = mtime_of(doc);
  SpawnOptions o;
  o.argv = {"bash", source_path("bench/run.sh"), "--smoke", "--no-install", "--no-doc", "--build-dir",
            build_path("")};
  o.cwd = source_path("");
  o.pipe_stderr = false;  // the harness's progress goes to the test log
  auto p = Subprocess::spawn(o);
  ASSERT_TRUE(p.is_ok()) << p.message();
  std::string out;
  // Under a minute alone; generous for a loaded 2-core machine.
  const bool eof = read_all_until(p->stdout_fd(), out, std::chrono::steady_clock::now() + 300s);
  auto status = eof ? p->wait_for(30s) : std::nullopt;
  if (!status) status = p->terminate(2s);
  ASSERT_TRUE(eof) << "bench/run.sh --smoke did not finish within 300 s:\n" << out;
  EXPECT_TRUE(status->ok()) << status->describe() << "\n" << out;

  std::vector<std::string> want = {
      "RESULT startup erun-init+barrier-np2",
      "RESULT startup erun-bintrue-np2",
      "RESULT recovery erun-inplace",
      "RESULT recovery erun-restart",
      "RESULT frozen erun-inplace",
      "RESULT scaleup erun",
      "RESULT allreduce erun-gloo-np2-1048576",
      "RESULT memcpy threads1",
      "RESULT control join64",
      "RESULT control plan100",
      "RESULT commit commit-1048576",
      "RESULT commit durable-1048576",
      "RESULT commit sync-2ranks-1048576",
  };
  if (::access("/usr/bin/mpirun", X_OK) == 0) want.push_back("RESULT startup mpirun-init+barrier-np2");
  for (const auto& w : want) EXPECT_NE(out.find(w), std::string::npos) << "missing '" << w << "' in:\n" << out;
  EXPECT_EQ(mtime_of(doc), doc_before) << "the smoke run must not write docs/performance.md";
}

}  // namespace
}  // namespace erun::testing
