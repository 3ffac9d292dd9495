// A host that goes silent, with real isolation: one "host" is a network
// namespace of the test's own (tests/support/netns.h) with its own sshd, the
// other is this machine at the namespace link's outer address. Mid-training
// the namespace's link is cut, or (link up) every packet to and from it is
// dropped: no reset, no ICMP, its worker stays alive but unreachable. The job
// must carry on without it and end 0 at exactly the model of an undisturbed
// run (examples/train_mlp's exact checksum), never restarting from epoch 0;
// the driver must declare the host lost through its agent's heartbeats
// (within --heartbeat-timeout and a margin, long before --collective-timeout
// or SSH keep-alives) and the survivors must hear of it from the driver
// (PEERS_LOST); the agent in the namespace, hearing nothing from the driver
// either, must stop its worker while still cut off; and once the link is
// back nothing of the old job may be left running in the namespace. Needs
// root and ip(8) and sshd (and for the drop, tc(8) with netem or tbf); skips
// without them.
#include <gtest/gtest.h>

#include <signal.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "support/erun_process.h"
#include "support/netns.h"
#include "support/process_utils.h"
#include "support/sshd.h"

namespace erun::testing {
namespace {

using namespace std::chrono_literals;

// The processes in the namespace other than its listening sshd.
std::vector<pid_t> job_processes(const NetNamespace& ns) {
  std::vector<pid_t> out;
  for (pid_t pid : ns.pids()) {
    std::string cmd = cmdline_of(pid);
    if (cmd.empty()) continue;  // gone meanwhile
    if (cmd.find("sshd -D -e -f") != std::string::npos) continue;
    out.push_back(pid);
  }
  return out;
}

enum class Loss { kLinkCut, kTrafficDropped };

// The namespace's processes of erun's own (agent, watchdog, worker): the job
// processes other than sshd's.
std::vector<pid_t> erun_processes(const NetNamespace& ns) {
  std::vector<pid_t> out;
  for (pid_t pid : job_processes(ns)) {
    if (cmdline_of(pid).rfind("sshd", 0) != 0) out.push_back(pid);
  }
  return out;
}

// Waits until `list()` is empty; what is left when the time is up.
template <typename List>
std::vector<pid_t> wait_empty(List list, Duration timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<pid_t> left = list();
  while (!left.empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(200ms);
    left = list();
  }
  return left;
}

// The test's two hosts: this machine at the link's outer address and the
// namespace, each with an sshd of the test's own on one port. Skips (the
// caller checks IsSkipped()) without sshd.
struct Hosts {
  std::unique_ptr<SshServer> here, there;
  // erun's arguments that reach both.
  std::vector<std::string> ssh_args() const {
    return {"--ssh-port", std::to_string(here->port()), "--ssh-identity-file", here->identity_file(),
            // Host keys checked: each server's key for its own addresses.
            "--ssh-option", "IdentitiesOnly=yes",
            "--ssh-option", "UserKnownHostsFile=" + here->known_hosts_file() + " " + there->known_hosts_file()};
  }
};
void start_hosts(const NetNamespace& ns, Hosts* hosts) {
  SshServerOptions outer;
  outer.addresses = {ns.outer_address()};
  hosts->here = SshServer::start(outer);
  ERUN_REQUIRE_SSHD(hosts->here);
  SshServerOptions inner;
  inner.addresses = {ns.inner_address()};
  inner.netns = ns.name();
  inner.port = hosts->here->port();  // erun uses one SSH port for every host
  inner.keys_from = hosts->here.get();
  hosts->there = SshServer::start(inner);
  ERUN_REQUIRE_SSHD(hosts->there);
}

void lose_a_host_mid_training(Loss loss) {
  auto ns = NetNamespace::create();
  ERUN_REQUIRE_NETNS(ns);
  if (loss == Loss::kTrafficDropped) {
    if (std::string why = ns->drop_skip_reason(); !why.empty()) GTEST_SKIP() << why;
  }
  Hosts hosts;
  ASSERT_NO_FATAL_FAILURE(start_hosts(*ns, &hosts));
  if (::testing::Test::IsSkipped()) return;

  const std::string program = build_path("examples/train_mlp");
  const std::string reference = train_checksum(uninterrupted_training_output());
  ASSERT_FALSE(reference.empty());

  TempDir dir;
  // Rank 0 (the one that prints) and rank 1 here, rank 2 in the namespace.
  // --collective-timeout 60: far beyond the driver's detection, so survivors
  // computing again proves they were told, not timed out. --blacklist-after 1:
  // the lost host is not tried again during the run.
  constexpr int kHeartbeatTimeout = 3;
  std::vector<std::string> args = hosts.ssh_args();
  args.insert(args.end(), {
      "--term-grace", "2", "-np", "3", "--min-np", "2",
      "-H", ns->outer_address() + ":2," + ns->inner_address() + ":1",
      "--driver-address", ns->outer_address(), "--collective-timeout", "60", "--blacklist-after", "1",
      "--heartbeat-timeout", std::to_string(kHeartbeatTimeout), "--event-log", dir.file("events.jsonl"), program});
  args.insert(args.end(), kTrainMlpArgs.begin(), kTrainMlpArgs.end());
  ErunProcess p(args);
  ASSERT_TRUE(p.wait_output("epoch 2 ", 120s)) << p.out() << p.err();
  ASSERT_FALSE(erun_processes(*ns).empty()) << "no worker of the job in the namespace";

  auto lost_at = std::chrono::steady_clock::now();
  ASSERT_TRUE((loss == Loss::kLinkCut ? ns->cut() : ns->drop()).is_ok());
  ASSERT_TRUE(p.wait_output("agent on " + ns->inner_address() + " lost: silent for", 30s)) << p.err();
  auto detected = std::chrono::steady_clock::now() - lost_at;
  ::testing::Test::RecordProperty(
      "host_lost_after_ms", static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(detected).count()));
  EXPECT_LT(detected, std::chrono::seconds(kHeartbeatTimeout) + 3s) << p.err();
  // The host's agent heard nothing from the driver either: it stops its
  // worker (term grace 2 s) and exits while the host is still cut off.
  std::vector<pid_t> running = wait_empty([&] { return erun_processes(*ns); }, 30s);
  EXPECT_TRUE(running.empty()) << "still running in the cut-off namespace:\n" << describe_pids(running);

  ASSERT_NO_FATAL_FAILURE(expect_trained_exactly(p, reference));
  EXPECT_EQ(p.count("exactly-once=yes"), 10u) << p.out();
  EXPECT_EQ(p.count("epoch 0 "), 1u) << p.out();  // never restarted from scratch
  // The survivors were told by the driver and re-joined for that reason.
  EXPECT_NE(p.err().find("telling the survivors that rank 2 is gone"), std::string::npos) << p.err();
  const std::string logs = p.out() + p.err();  // workers' stderr is forwarded with a [rank] prefix
  EXPECT_NE(logs.find("the driver reports rank 2 of generation "), std::string::npos) << logs;
  std::string events = read_file(dir.file("events.jsonl"));
  EXPECT_NE(events.find("\"event\":\"peers_lost\""), std::string::npos) << events;

  // The link comes back: the old SSH session in the namespace finds its
  // client gone and ends.
  ASSERT_TRUE(ns->restore().is_ok());
  std::vector<pid_t> left = wait_empty([&] { return job_processes(*ns); }, 120s);
  EXPECT_TRUE(left.empty()) << "left running in the namespace:\n" << describe_pids(left);
}

TEST(ErunNetns, AHostCutOffMidTrainingLeavesTheOthersToFinishAtTheSameModel) {
  lose_a_host_mid_training(Loss::kLinkCut);
}

TEST(ErunNetns, AHostWhoseTrafficIsDroppedMidTrainingLeavesTheOthersToFinishAtTheSameModel) {
  lose_a_host_mid_training(Loss::kTrafficDropped);
}

}  // namespace
}  // namespace erun::testing

namespace erun::testing {
namespace {

// A host whose link is slow (a token bucket of 1 Mbit/s each way on its
// namespace's link) joins a running job: its worker's pre-flight link probe
// (1 MiB each way with a worker on this machine) does not finish within its
// 1 s bound, so it is held back before it is admitted, with no failure and
// no wait for the job. Its link restored, the slot is tried again after the
// cooldown and joins; the job ends 0 at exactly the model of an undisturbed
// run. Needs tc(8) with tbf besides what the tests above need.
TEST(ErunNetns, ANewHostWithASlowLinkIsHeldBackAtItsPreflightProbeAndJoinsOnceItIsFast) {
  auto ns = NetNamespace::create();
  ERUN_REQUIRE_NETNS(ns);
  if (std::string why = ns->drop_skip_reason(); !why.empty()) GTEST_SKIP() << why;
  Hosts hosts;
  ASSERT_NO_FATAL_FAILURE(start_hosts(*ns, &hosts));
  if (::testing::Test::IsSkipped()) return;
  const std::string reference = train_checksum(uninterrupted_training_output());
  ASSERT_FALSE(reference.empty());

  TempDir dir;
  dir.write("hosts", ns->outer_address() + ":2\n");
  dir.write("discover.sh", "#!/bin/sh\ncat " + dir.file("hosts") + "\n", true);
  std::vector<std::string> args = hosts.ssh_args();
  args.insert(args.end(), {
      "--host-discovery-script", dir.file("discover.sh"), "--discovery-interval", "0.2",
      "--term-grace", "2", "-np", "2", "--min-np", "2", "--max-np", "3", "--driver-address", ns->outer_address(),
      "--blacklist-cooldown-range", "3", "3", "--event-log", dir.file("events.jsonl"),
      build_path("examples/train_mlp")});
  args.insert(args.end(), kTrainMlpArgs.begin(), kTrainMlpArgs.end());
  args.insert(args.end(), {"--step-ms", "100"});  // a longer run; the model does not depend on it
  ErunProcess p(args);
  ASSERT_TRUE(p.wait_output("epoch 1 ", 120s)) << p.out() << p.err();
  ASSERT_TRUE(ns->limit("1mbit").is_ok());
  dir.write("hosts", ns->outer_address() + ":2\n" + ns->inner_address() + ":1\n");
  ASSERT_TRUE(p.wait_output(ns->inner_address() + " rank 2: held back: its link probe", 60s)) << p.err();
  EXPECT_EQ(p.out().find("world size 2 -> 3"), std::string::npos) << "admitted before the check ended";
  ASSERT_TRUE(ns->restore().is_ok());
  ASSERT_TRUE(p.wait_output("world size 2 -> 3", 90s)) << p.out() << p.err();
  ASSERT_NO_FATAL_FAILURE(expect_trained_exactly(p, reference));
  EXPECT_EQ(p.count("epoch 0 "), 1u) << p.out();
  const std::string events = read_file(dir.file("events.jsonl"));
  EXPECT_NE(events.find("\"check\":\"link\""), std::string::npos) << events;
  EXPECT_EQ(events.find("\"reason\":\"worker failed\""), std::string::npos) << events;
}

}  // namespace
}  // namespace erun::testing

namespace erun::testing {
namespace {

// A partition that heals, as a fault injector does it, with erun's default
// --driver-grace (60 s): two hosts of 2 slots, -np 4 --min-np 2. Mid-training
// the namespace host goes silent (its link cut, or every process in it
// SIGSTOPped, sshd included); the job goes on at 2 ranks. Its agent, cut off
// from the driver, keeps its workers for a new erun (it cannot tell a
// partition from an erun that died). Once the host is back, nothing of
// before the cut may stay: the driver reaches the agent again and retires it
// within one heartbeat timeout of the return (it is not left for the grace);
// the host, tried again while unreachable, sits out the same cooldown each
// time (not 4, 8, 16 s) and rejoins within one cooldown of its return; the
// job ends at exactly the uninterrupted model, and 5 s after erun exits
// nothing of the job is left in the namespace or in /dev/shm.
enum class Silence { kLinkCut, kStopped };

std::vector<std::string> shm_entries_naming(const std::string& a, const std::string& b) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    std::string name = e.path().filename().string();
    if (name.find(a) != std::string::npos || name.find(b) != std::string::npos) out.push_back(name);
  }
  return out;
}

void partition_heals(Silence how) {
  auto ns = NetNamespace::create();
  ERUN_REQUIRE_NETNS(ns);
  Hosts hosts;
  ASSERT_NO_FATAL_FAILURE(start_hosts(*ns, &hosts));
  if (::testing::Test::IsSkipped()) return;
  const std::string reference = train_checksum(uninterrupted_training_output());
  ASSERT_FALSE(reference.empty());
  const std::string inner = ns->inner_address(), outer = ns->outer_address();

  TempDir dir;
  dir.write("hosts", outer + ":2\n" + inner + ":2\n");
  dir.write("discover.sh", "#!/bin/sh\ncat " + dir.file("hosts") + "\n", true);
  constexpr int kHeartbeatTimeout = 5;  // erun's default
  constexpr int kCooldown = 4;
  std::vector<std::string> args = hosts.ssh_args();
  args.insert(args.end(), {
      "--driver-grace", "60", "--host-discovery-script", dir.file("discover.sh"), "--discovery-interval", "0.5",
      "-np", "4", "--min-np", "2", "--driver-address", outer, "--term-grace", "2",
      // Shorter than the defaults (10 s, 10 s) only to keep the test short.
      "--blacklist-cooldown-range", std::to_string(kCooldown), "60", "--ssh-connect-timeout", "3",
      "--event-log", dir.file("events.jsonl"), build_path("examples/train_mlp")});
  args.insert(args.end(), kTrainMlpArgs.begin(), kTrainMlpArgs.end());
  args.insert(args.end(), {"--step-ms", "150"});  // a longer run; the model does not depend on it
  ErunProcess p(args);
  ASSERT_TRUE(p.wait_output("epoch 2 ", 120s)) << p.out() << p.err();
  const std::vector<pid_t> before = erun_processes(*ns);
  ASSERT_GE(before.size(), 3u) << "agent, watchdog and workers expected in the namespace:\n" << describe_pids(before);

  std::vector<pid_t> stopped;
  if (how == Silence::kLinkCut) {
    ASSERT_TRUE(ns->cut().is_ok());
  } else {
    stopped = ns->pids();
    for (pid_t pid : stopped) ::kill(pid, SIGSTOP);
  }
  ASSERT_TRUE(p.wait_output("agent on " + inner + " lost: silent for", 30s)) << p.err();
  // Out long enough for tries to relaunch it to fail while it is unreachable.
  ASSERT_TRUE(p.wait_output(inner + " still cannot be reached: it sits out another " + std::to_string(kCooldown) +
                                " s",
                            40s))
      << p.err();
  for (pid_t pid : before) EXPECT_TRUE(pid_alive(pid)) << "gone while cut off: " << pid;

  if (how == Silence::kLinkCut) {
    ASSERT_TRUE(ns->restore().is_ok());
  } else {
    for (pid_t pid : stopped) ::kill(pid, SIGCONT);
  }
  const auto back_at = std::chrono::steady_clock::now();
  const std::string rejoin_mark = "world size 2 -> 4";
  ASSERT_EQ(p.count(rejoin_mark), 0u) << p.out();
  std::vector<pid_t> left = wait_empty(
      [&] {
        std::vector<pid_t> alive;
        for (pid_t pid : before) {
          if (pid_alive(pid)) alive.push_back(pid);
        }
        return alive;
      },
      std::chrono::seconds(kHeartbeatTimeout));
  const auto gone_after = std::chrono::steady_clock::now() - back_at;
  ::testing::Test::RecordProperty(
      "stale_gone_after_ms", static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(gone_after).count()));
  EXPECT_TRUE(left.empty()) << "still running " << kHeartbeatTimeout << " s after the host came back:\n"
                            << describe_pids(left) << p.err();
  // Retired by the driver; a host stopped long enough may also have its
  // agent taken for frozen by the agent's own watchdog once it runs again
  // (then the retirer finds it gone).
  bool retired = false, gone = false;
  for (int i = 0; i < kHeartbeatTimeout * 10 && !retired && !gone; ++i) {
    retired = p.err().find("agent on " + inner + ": reached again") != std::string::npos;
    gone = p.err().find("agent on " + inner + ": ended already") != std::string::npos;
    if (!retired && !gone) std::this_thread::sleep_for(100ms);
  }
  EXPECT_TRUE(retired || (how == Silence::kStopped && gone)) << p.err();

  // Rejoins: relaunched at the end of its cooldown (the new worker's start
  // and admission take a few seconds more).
  const Duration rejoin_limit = std::chrono::seconds(kCooldown) + 25s - (std::chrono::steady_clock::now() - back_at);
  EXPECT_TRUE(p.wait_output(rejoin_mark, rejoin_limit)) << "the host did not rejoin:\n" << p.out() << p.err();
  ::testing::Test::RecordProperty(
      "rejoined_after_ms",
      static_cast<int>(
          std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - back_at).count()));
  // It never sat out more than the shortest cooldown for the outage.
  EXPECT_EQ(p.err().find("blacklisted for " + std::to_string(2 * kCooldown) + " s"), std::string::npos) << p.err();

  ASSERT_NO_FATAL_FAILURE(expect_trained_exactly(p, reference));
  EXPECT_EQ(p.count("epoch 0 "), 1u) << p.out();  // never restarted from scratch
  std::this_thread::sleep_for(5s);
  std::vector<pid_t> after = job_processes(*ns);
  EXPECT_TRUE(after.empty()) << "left in the namespace 5 s after erun exited:\n" << describe_pids(after);
  std::vector<std::string> shm = shm_entries_naming(inner, outer);
  EXPECT_TRUE(shm.empty()) << "left in /dev/shm: " << shm.front();
}

TEST(ErunNetns, AHealedPartitionLeavesNothingOfTheCutHostBehindAndItRejoins) { partition_heals(Silence::kLinkCut); }

TEST(ErunNetns, AHostStoppedAndResumedLeavesNothingBehindAndItRejoins) { partition_heals(Silence::kStopped); }

}  // namespace
}  // namespace erun::testing
