// A frozen host under the real erun binary, in place, with two simulated hosts
// of two workers (--launcher local, so each host's workers share memory and
// the host leaders talk over erun's TCP transport): both workers of node-b are
// SIGSTOPped. node-a's second worker times out in shared memory while its
// leader waits for node-b in the cross-host step; it must not report its
// healthy leader, so the driver kills only node-b's frozen workers (together,
// once node-a's workers re-joined: node-a's leader named node-b's leader
// silent) and both node-a workers keep running and finish the job.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <regex>
#include <sstream>

#include "support/erun_process.h"
#include "support/process_utils.h"

namespace erun::testing {
namespace {

using namespace std::chrono_literals;

std::vector<pid_t> workers_on(const std::string& program, const std::string& host) {
  std::vector<pid_t> out;
  for (pid_t pid : pids_with_cmdline(program)) {
    if (read_file("/proc/" + std::to_string(pid) + "/cmdline").rfind(program + std::string(1, '\0'), 0) != 0) continue;
    std::string env = read_file("/proc/" + std::to_string(pid) + "/environ");
    std::replace(env.begin(), env.end(), '\0', '\n');
    if (("\n" + env).find("\nERUN_HOSTNAME=" + host + "\n") != std::string::npos) out.push_back(pid);
  }
  return out;
}

TEST(ErunFrozenHost, TheSurvivingHostKeepsItsLeader) {
  TempDir dir;
  const std::string program = build_path("examples/train_mlp");
  dir.write("hosts", "node-a:2\nnode-b:2\n");
  dir.write("discover.sh", "#!/bin/sh\ncat " + dir.file("hosts") + "\n", true);
  ErunProcess p({"--host-discovery-script", dir.file("discover.sh"), "--discovery-interval", "0.2", "--term-grace",
                 "2", "-np", "4", "--min-np", "2", "--launcher", "local", "--collective-timeout", "3", program,
                 "--samples", "8000", "--epochs", "10", "--batch", "256", "--commit-every", "5", "--step-ms", "40"});
  ASSERT_TRUE(p.wait_output("epoch 1 ", 120s)) << p.out() << p.err();
  auto survivors = workers_on(program, "node-a");
  auto frozen = workers_on(program, "node-b");
  ASSERT_EQ(survivors.size(), 2u);
  ASSERT_EQ(frozen.size(), 2u);
  for (pid_t pid : frozen) ::kill(pid, SIGSTOP);
  // The frozen workers are left out together once node-a's workers re-joined;
  // a replacement host's workers join later and the job finishes.
  ASSERT_TRUE(p.wait_output("ranks 2,3 of generation", 60s)) << p.out() << p.err();
  // A wrongly blamed leader would have been killed when its follower re-joined, before this.
  for (pid_t pid : survivors) EXPECT_TRUE(pid_alive(pid)) << "node-a worker " << pid << " was killed\n" << p.err();
  auto s = p.wait(300s);
  ASSERT_TRUE(s) << "erun did not finish\n" << p.out() << p.err();
  EXPECT_EQ(s->shell_code(), 0) << p.err();
  // What node-a's second worker said, and that nobody reported a node-a worker.
  // Both node-a ranks have the same deadline: either the follower times out
  // on its leader, marked busy across hosts, or the leader's own timeout comes
  // first and it aborts the host's communicator. Neither names the leader.
  const std::string out = p.out();
  EXPECT_TRUE(out.find("busy in its cross-host step as this host's leader") != std::string::npos ||
              out.find("rank 0 aborted the communicator") != std::string::npos)
      << out;
  EXPECT_EQ(p.err().find("reported by"), std::string::npos) << p.err();
  std::istringstream err(p.err());
  for (std::string line; std::getline(err, line);) {
    if (line.find("killing") == std::string::npos) continue;
    EXPECT_FALSE(std::regex_search(line, std::regex("gen [0-9]+ node-a rank [0-9]+: ")))
        << "a node-a worker was killed: " << line;
  }
  // The model's run: every epoch's samples exactly once, never restarted from scratch.
  EXPECT_EQ(p.count("exactly-once=yes"), 10u) << p.out();
  EXPECT_EQ(p.count("epoch 0 "), 1u) << p.out();
  std::vector<pid_t> left;
  EXPECT_TRUE(wait_no_process(program, 10s, &left)) << describe_pids(left);
  for (pid_t pid : frozen) ::kill(pid, SIGCONT);  // in case any survived the test's failure
}

}  // namespace
}  // namespace erun::testing
