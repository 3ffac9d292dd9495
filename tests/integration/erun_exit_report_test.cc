// erun end to end: the root-cause report of a failed worker shows its last
// stderr lines from its agent's exit report, even when the driver could not
// forward them. Here erun's stdout is a small pipe that nobody reads (a
// stopped pager, a stuck terminal): the forwarding thread blocks on it, the
// worker's stderr never reaches the driver's own tail, and the report still
// names the worker's last words, its partial last line included; the
// rank's --output-filename files, written by its agent, are complete too
// before anyone reads erun's stdout. An agent
// of another protocol version (the report's layout changed with version 2)
// fails its host with a line naming both versions.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <fmt/format.h>

#include "agent/protocol.h"
#include "support/erun_process.h"
#include "support/process_utils.h"

namespace erun::testing {
namespace {

using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;

// Reads what `fd` has within `limit` into `text` until it contains `want`.
bool read_until(int fd, std::string& text, const std::string& want, Duration limit) {
  auto deadline = SteadyClock::now() + limit;
  while (text.find(want) == std::string::npos) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
    char chunk[4096];
    ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n <= 0) return false;
    text.append(chunk, static_cast<size_t>(n));
  }
  return true;
}

TEST(ErunExitReport, RootCauseAndOutputFilesDoNotWaitForAStuckStdout) {
  TempDir dir;
  SpawnOptions o;
  // The worker fills erun's stdout (not so far that the driver drops
  // output), then says its last words on stderr.
  o.argv = {erun_binary(), "--launcher", "local", "-np", "1", "--output-filename", dir.file("logs"), "sh", "-c",
            "seq 1 10000; echo 'first words' >&2; printf 'last words' >&2; exit 3"};
  auto p = Subprocess::spawn(o);
  ASSERT_TRUE(p.is_ok()) << p.message();
  ASSERT_GE(::fcntl(p->stdout_fd(), F_SETPIPE_SZ, 4096), 0);
  ::fcntl(p->stderr_fd(), F_SETFL, ::fcntl(p->stderr_fd(), F_GETFL) | O_NONBLOCK);

  std::string err;
  ASSERT_TRUE(read_until(p->stderr_fd(), err, "root cause:", 60s)) << err;
  // The report's lines follow at once; stdout is still unread.
  bool reported = read_until(p->stderr_fd(), err, "  last words", 5s);
  std::string out_file = read_file(dir.file("logs/rank.0/stdout"));
  std::string err_file = read_file(dir.file("logs/rank.0/stderr"));

  std::string out;
  auto deadline = SteadyClock::now() + 60s;
  (void)read_all_until(p->stdout_fd(), out, deadline);
  (void)read_all_until(p->stderr_fd(), err, deadline);
  auto status = p->wait_for(30s);
  ASSERT_TRUE(status);
  EXPECT_EQ(status->shell_code(), 3) << err;
  EXPECT_TRUE(reported) << "the root-cause report lacks the worker's last stderr lines while erun's stdout was "
                           "stuck:\n"
                        << err;
  EXPECT_NE(err.find("root cause: gen 1 localhost rank 0 exited with exit code 3"), std::string::npos) << err;
  EXPECT_NE(err.find("last stderr lines of rank 0:"), std::string::npos) << err;
  EXPECT_NE(err.find("  first words"), std::string::npos) << err;
  EXPECT_EQ(err_file, "first words\nlast words");
  EXPECT_EQ(out_file.size(), 48894u);  // seq 1 10000
  EXPECT_EQ(out_file.substr(out_file.size() > 12 ? out_file.size() - 12 : 0), "\n9999\n10000\n");
  // Forwarding itself went on once stdout was read.
  EXPECT_NE(out.find("[0]<stdout>:10000\n"), std::string::npos);
  EXPECT_NE(out.find("[0]<stderr>:last words"), std::string::npos)
      << out.substr(out.size() > 500 ? out.size() - 500 : 0);
}

TEST(ErunExitReport, DryRunNamesEachRanksOutputFilesOnItsHost) {
  char cwd[4096];
  ASSERT_NE(::getcwd(cwd, sizeof cwd), nullptr);
  ErunProcess p({"-np", "3", "-H", "localhost:2,127.0.0.5:2", "--output-filename", "logs", "--dry-run", "true"});
  ASSERT_TRUE(p.wait(60s));
  // A relative directory is erun's, sent absolute to every agent.
  EXPECT_NE(p.out().find(std::string("  output files (on 127.0.0.5): ") + cwd + "/logs/rank.2/stdout, stderr\n"),
            std::string::npos)
      << p.out();
}

TEST(ErunExitReport, AnAgentOfAnotherProtocolVersionFailsItsHostNamingBothVersions) {
  TempDir dir;
  // A version-1 agent: its HELLO (type 1, version 1, host "old", pid 0), then silence.
  dir.write("old-agent",
            "#!/bin/sh\n"
            "printf '\\024\\000\\000\\000\\001\\001\\000\\000\\000\\003\\000\\000\\000old"
            "\\000\\000\\000\\000\\000\\000\\000\\000'\n"
            "exec sleep 60\n",
            true);
  ErunProcess p({"--launcher", "local", "--agent-path", dir.file("old-agent"), "-np", "1", "/bin/true"});
  auto status = p.wait(60s);
  ASSERT_TRUE(status) << p.err();
  EXPECT_EQ(status->shell_code(), 255) << p.err();
  EXPECT_NE(p.err().find(fmt::format("agent on localhost lost: it speaks agent protocol 1 and this erun speaks {} "
                                     "(different erun versions): install the same erun on every host",
                                     agent::kProtocolVersion)),
            std::string::npos)
      << p.err();
}

}  // namespace
}  // namespace erun::testing
