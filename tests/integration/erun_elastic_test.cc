// In-place elasticity end to end: examples/train_mlp (the worker library:
// rendezvous, Gloo, State, ElasticSampler) under the real erun binary while
// hosts grow, a worker is SIGKILLed, a host's slots change and hosts leave.
// The run must end at exactly the model of an uninterrupted run (the example's
// gradient sums are exact, so the checksum is bit-for-bit), with every sample
// of every epoch processed exactly once, and leave no process behind. The
// same over a real sshd, in restart mode with durable commits, and with
// garbage and wrong-secret connections thrown at the running job's rendezvous.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <thread>

#include "support/erun_process.h"
#include "support/process_utils.h"
#include "support/sshd.h"

namespace erun::testing {
namespace {

using namespace std::chrono_literals;

size_t count_events(const std::string& path, const std::string& event) {
  std::ifstream in(path);
  std::string line;
  size_t n = 0;
  while (std::getline(in, line)) n += line.find("\"event\":\"" + event + "\"") != std::string::npos;
  return n;
}

std::string environ_of(pid_t pid) {
  std::string s = read_file("/proc/" + std::to_string(pid) + "/environ");
  std::replace(s.begin(), s.end(), '\0', '\n');
  return "\n" + s;
}

class ErunElastic : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // The reference: the same training, uninterrupted, in one process.
    const std::string out = uninterrupted_training_output();
    reference_ = new std::string(train_checksum(out));
    ASSERT_FALSE(reference_->empty()) << out;
  }
  static void TearDownTestSuite() {
    delete reference_;
    reference_ = nullptr;
  }
  void SetUp() override {
    ASSERT_TRUE(reference_ && !reference_->empty());
    program_ = build_path("examples/train_mlp");
    dir_.write("discover.sh", "#!/bin/sh\ncat " + dir_.file("hosts") + "\n", true);
  }
  std::vector<std::string> erun_args(std::vector<std::string> extra) {
    std::vector<std::string> a = {"--host-discovery-script", dir_.file("discover.sh"), "--discovery-interval", "0.2",
                                  "--event-log", dir_.file("events.jsonl"), "--term-grace", "2"};
    a.insert(a.end(), extra.begin(), extra.end());
    a.push_back(program_);
    a.insert(a.end(), kTrainMlpArgs.begin(), kTrainMlpArgs.end());
    return a;
  }
  bool wait_events(const std::string& event, size_t n, Duration timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (count_events(dir_.file("events.jsonl"), event) >= n) return true;
      std::this_thread::sleep_for(20ms);
    }
    return false;
  }
  // Waits until `text` occurs at least n times in the job's output.
  static bool wait_count(const ErunProcess& p, const std::string& text, size_t n, Duration timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (p.count(text) >= n) return true;
      std::this_thread::sleep_for(20ms);
    }
    return false;
  }
  // train_mlp processes themselves (argv[0] is the binary), optionally on one "host".
  std::vector<pid_t> workers(const std::string& host = "") {
    std::vector<pid_t> out;
    for (pid_t pid : pids_with_cmdline(program_)) {
      if (read_file("/proc/" + std::to_string(pid) + "/cmdline").rfind(program_ + std::string(1, '\0'), 0) != 0) {
        continue;
      }
      if (host.empty() || environ_of(pid).find("\nERUN_HOSTNAME=" + host + "\n") != std::string::npos) {
        out.push_back(pid);
      }
    }
    return out;
  }
  void expect_trained_exactly(ErunProcess& p) {
    ASSERT_NO_FATAL_FAILURE(erun::testing::expect_trained_exactly(p, *reference_));
    EXPECT_EQ(p.count("exactly-once=yes"), 10u) << p.out();
    std::vector<pid_t> left;
    EXPECT_TRUE(wait_no_process(program_, 20s, &left)) << describe_pids(left);
  }

  static std::string* reference_;
  std::string program_;
  TempDir dir_;
};
std::string* ErunElastic::reference_ = nullptr;

TEST_F(ErunElastic, InPlaceGrowKillSlotChangeShrinkEndsAtTheUninterruptedModel) {
  dir_.write("hosts", "node-a:2\n");
  // --stragglers off: node-b's pre-flight check, timed on a machine this
  // busy, held one of its two workers back once (a CI simulation: "2 -> 3",
  // then "3 -> 4" 10 s later); growing in one step is what this test reads.
  ErunProcess p(erun_args({"-np", "2", "--min-np", "1", "--max-np", "4", "--launcher", "local", "--blacklist-after", "5",
                           "--stragglers", "off"}));
  ASSERT_TRUE(wait_events("generation_joined", 1, 60s)) << p.err();

  dir_.write("hosts", "node-a:2\nnode-b:2\n");  // grow to 4
  // Every rank prints "reset: world size A -> B (generation G)" once a world forms.
  const std::string four = " -> 4 (generation";
  ASSERT_TRUE(wait_count(p, four, 4, 60s)) << p.out() << p.err();

  auto victims = workers("node-b");
  ASSERT_FALSE(victims.empty());
  const size_t joined = count_events(dir_.file("events.jsonl"), "generation_joined");
  ::kill(victims.front(), SIGKILL);  // the 3 survivors go on alone; the relaunched slot joins them
  ASSERT_TRUE(wait_events("generation_joined", joined + 1, 60s)) << p.err();
  ASSERT_TRUE(wait_count(p, four, 8, 60s)) << p.out() << p.err();  // back to 4 ranks

  size_t n = count_events(dir_.file("events.jsonl"), "generation_joined");
  dir_.write("hosts", "node-a:2\nnode-b:1\n");  // slots change: 3 ranks
  ASSERT_TRUE(wait_events("generation_joined", n + 1, 60s)) << p.err();

  n = count_events(dir_.file("events.jsonl"), "generation_joined");
  dir_.write("hosts", "node-b:1\n");  // node-a leaves, rank 0 with it
  ASSERT_TRUE(wait_events("generation_joined", n + 1, 60s)) << p.err();

  expect_trained_exactly(p);
  EXPECT_EQ(p.err().find("restarting all workers"), std::string::npos) << p.err();
  EXPECT_NE(p.err().find("recovering in place"), std::string::npos) << p.err();
  EXPECT_NE(p.err().find("the survivors go on alone"), std::string::npos) << p.err();
  EXPECT_NE(p.out().find("world size 2 -> 4"), std::string::npos) << p.out();
  // The replacement joined a later world of 4. The survivors train alone as 3 first ("3 -> 4") only when their
  // generation connects before the replacement registers; when it registers sooner, the driver announces the
  // 4-rank generation while theirs forms, they restore the last commit and meet it there ("2 -> 4" again). Both
  // keep everything up to the last commit, which expect_trained_exactly checks bit for bit.
  std::set<int> four_generations;
  const std::string out = p.out();
  const std::regex four_re("reset: world size ([0-9]+) -> 4 \\(generation ([0-9]+)\\)");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), four_re); it != std::sregex_iterator(); ++it) {
    four_generations.insert(std::stoi((*it)[2].str()));
  }
  EXPECT_GE(four_generations.size(), 2u) << out;
  EXPECT_NE(p.out().find("world size 3 -> 1"), std::string::npos) << p.out();
}

TEST_F(ErunElastic, RestartModeWithDurableCommitsResumesAtTheLastCommit) {
  dir_.write("hosts", "localhost:2\n");
  ErunProcess p(erun_args({"-np", "2", "--mode", "restart", "--checkpoint-dir", dir_.path()}));
  ASSERT_TRUE(wait_events("generation_started", 1, 60s)) << p.err();
  ASSERT_TRUE(p.wait_output("epoch 2 ", 120s)) << p.out() << p.err();
  auto victims = workers();
  ASSERT_FALSE(victims.empty());
  ::kill(victims.back(), SIGKILL);
  ASSERT_TRUE(wait_events("generation_started", 2, 60s)) << p.err();
  expect_trained_exactly(p);
  EXPECT_NE(p.err().find("restarting all workers"), std::string::npos) << p.err();
}

TEST_F(ErunElastic, HostileConnectionsToTheRendezvousAreRefusedWhileTheJobRuns) {
  dir_.write("hosts", "localhost:2\n");
  ErunProcess p(erun_args({"-np", "2"}));
  ASSERT_TRUE(wait_events("generation_joined", 1, 60s)) << p.err();
  auto ws = workers();
  ASSERT_FALSE(ws.empty());
  std::smatch m;
  std::string env = environ_of(ws.front());
  ASSERT_TRUE(std::regex_search(env, m, std::regex("\nERUN_RDZV_PORT=([0-9]+)\n")));
  int port = std::stoi(m[1].str());

  auto send_and_close = [&](const std::string& bytes) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    (void)!::write(fd, bytes.data(), bytes.size());
    std::this_thread::sleep_for(100ms);
    ::close(fd);
  };
  send_and_close("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  send_and_close(std::string(1 << 16, '\xff'));
  std::string huge_header(64, '\0');
  huge_header.replace(0, 4, "\x52\x55\x52\x45");
  send_and_close(huge_header);
  send_and_close("");

  expect_trained_exactly(p);
  // One burst: the first drop in full, the others counted in one line.
  EXPECT_EQ(p.count("rendezvous: dropped connection"), 1u) << p.err();
  EXPECT_EQ(p.count("more connections dropped"), 1u) << p.err();
  EXPECT_EQ(count_events(dir_.file("events.jsonl"), "generation_started"), 1u);
}

long rss_kib(long pid) {
  std::smatch m;
  std::string status = read_file("/proc/" + std::to_string(pid) + "/status");
  return std::regex_search(status, m, std::regex("VmRSS:\\s+([0-9]+) kB")) ? std::stol(m[1].str()) : -1;
}

// 5,000 junk connections from an unprivileged user while the job trains: one
// byte and close, or silent and open; the job ends exactly as undisturbed, the
// drops are logged per burst (not per connection), the driver's memory comes
// back, and with --launcher local the rendezvous listens on loopback only.
TEST_F(ErunElastic, FloodOfJunkConnectionsLeavesTheJobAndTheDriversMemoryUnharmed) {
  dir_.write("hosts", "localhost:2\n");
  ErunProcess p(erun_args({"-np", "2", "--launcher", "local"}));
  ASSERT_TRUE(wait_events("generation_joined", 1, 60s)) << p.err();
  auto ws = workers();
  ASSERT_FALSE(ws.empty());
  std::smatch m;
  std::string env = environ_of(ws.front());
  ASSERT_TRUE(std::regex_search(env, m, std::regex("\nERUN_RDZV_PORT=([0-9]+)\n")));
  int port = std::stoi(m[1].str());
  // Listening on 127.0.0.1 only (0100007F in /proc/net/tcp), state 0A (LISTEN).
  std::string tcp = read_file("/proc/net/tcp");
  EXPECT_NE(tcp.find(fmt::format("0100007F:{:04X} 00000000:0000 0A", port)), std::string::npos) << tcp;
  EXPECT_EQ(tcp.find(fmt::format("00000000:{:04X} 00000000:0000 0A", port)), std::string::npos);

  long before = rss_kib(p.pid());
  std::string flood = fmt::format(
      "import socket, time\n"
      "silent = []\n"
      "for i in range(5000):\n"
      "    s = socket.create_connection(('127.0.0.1', {}))\n"
      "    if i % 5 == 0 and len(silent) < 800:\n"
      "        silent.append(s)\n"
      "        continue\n"
      "    s.send(b'\\x00')\n"
      "    s.close()\n"
      "time.sleep(1.0)\n"
      "for s in silent: s.close()\n"
      "print('flood done', flush=True)\n",
      port);
  SpawnOptions o;
  o.argv = {"runuser", "-u", "nobody", "--", "/usr/bin/python3", "-c", flood};
  auto f = Subprocess::spawn(o);
  ASSERT_TRUE(f) << f.message();
  std::string fout;
  read_all_until(f->stdout_fd(), fout, std::chrono::steady_clock::now() + 120s);
  auto fs = f->wait_for(30s);
  ASSERT_TRUE(fs && fs->ok()) << fout;
  ASSERT_NE(fout.find("flood done"), std::string::npos);
  // The server closes the rest and trims; give it a moment.
  long after = -1;
  for (int i = 0; i < 50; ++i) {
    std::this_thread::sleep_for(100ms);
    after = rss_kib(p.pid());
    if (after >= 0 && after - before < 8 * 1024) break;
  }

  expect_trained_exactly(p);
  EXPECT_LT(after - before, 16 * 1024) << "driver RSS " << before << " kB before, " << after << " kB after";
  EXPECT_GE(p.count("rendezvous: dropped connection"), 1u) << p.err();
  EXPECT_LE(p.count("rendezvous: dropped connection"), 20u) << p.err();  // per burst, not per connection
  EXPECT_EQ(count_events(dir_.file("events.jsonl"), "generation_started"), 1u);
}

TEST_F(ErunElastic, InPlaceOverSshGrowSlotChangeKilledHostAndShrink) {
  std::unique_ptr<SshServer> server = SshServer::start();
  ERUN_REQUIRE_SSHD(server);
  dir_.write("hosts", "127.0.0.2:1\n127.0.0.3:1\n");
  std::vector<std::string> args = {"-np", "2", "--min-np", "1", "--max-np", "4", "--blacklist-after", "1",
                                   "--blacklist-cooldown-range", "600", "600"};
  for (auto& a : server->erun_args()) args.push_back(a);
  ErunProcess p(erun_args(args));
  ASSERT_TRUE(p.wait_output("epoch 0 ", 60s)) << p.out() << p.err();
  // Each step waits for the survivors' reset line: the generation has formed.
  dir_.write("hosts", "127.0.0.2:1\n127.0.0.3:1\n127.0.0.4:1\n");  // a host appears
  ASSERT_TRUE(p.wait_output("world size 2 -> 3", 60s)) << p.out() << p.err();
  dir_.write("hosts", "127.0.0.2:1\n127.0.0.3:1\n127.0.0.4:2\n");  // its slots change
  ASSERT_TRUE(p.wait_output("world size 3 -> 4", 60s)) << p.out() << p.err();
  // Every worker of 127.0.0.3 dies: with --blacklist-after 1 the host is
  // blacklisted and the job goes on in place without it.
  auto victims = workers("127.0.0.3");
  ASSERT_FALSE(victims.empty());
  // The reset callbacks get the world size of the commit the survivors roll
  // back to (3 or 4, depending on whether one was taken at 4) and the new 3.
  const size_t resets_to_3 = p.count("-> 3 (generation");
  for (pid_t v : victims) ::kill(v, SIGKILL);
  auto until = std::chrono::steady_clock::now() + 60s;
  while (p.count("-> 3 (generation") == resets_to_3 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_GT(p.count("-> 3 (generation"), resets_to_3) << p.out() << p.err();
  EXPECT_NE(p.err().find("127.0.0.3 blacklisted"), std::string::npos) << p.err();
  dir_.write("hosts", "127.0.0.2:1\n127.0.0.3:1\n");  // .4 leaves
  ASSERT_TRUE(p.wait_output("world size 3 -> 1", 60s)) << p.out() << p.err();
  expect_trained_exactly(p);
}

// The wall-clock times (Unix seconds) at which survivors printed their reset line.
std::vector<double> reset_times(const std::string& out) {
  std::vector<double> t;
  std::regex re("reset: world size [0-9]+ -> [0-9]+ \\(generation [0-9]+\\) at=([0-9.]+)");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator(); ++it) {
    t.push_back(std::stod((*it)[1].str()));
  }
  return t;
}

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

TEST_F(ErunElastic, FrozenWorkerIsLeftOutAndSurvivorsComputeWithinTheCollectiveTimeout) {
  constexpr double kCollectiveTimeout = 2;
  dir_.write("hosts", "node-a:4\n");
  ErunProcess p(erun_args({"-np", "4", "--min-np", "2", "--launcher", "local", "--collective-timeout", "2"}));
  ASSERT_TRUE(wait_events("generation_joined", 1, 60s)) << p.err();
  ASSERT_TRUE(p.wait_output("epoch 1 ", 120s)) << p.out() << p.err();
  auto ws = workers();
  ASSERT_EQ(ws.size(), 4u);
  double stopped_at = unix_now();
  ::kill(ws[2], SIGSTOP);  // alive, never arrives: only the collective timeout sees it
  // The 3 survivors compute again alone and the replacement joins them
  // later; or, when the replacement reaches the rendezvous before the
  // survivors' generation has connected (a busy machine), that generation is
  // given up and they grow straight back to 4. Either way the first reset
  // comes within the collective timeout and the job ends at world size 4.
  ASSERT_TRUE(p.wait_output("reset: world size 4 -> ", 60s)) << p.out() << p.err();
  ASSERT_TRUE(p.wait_output("-> 4 (generation", 60s)) << p.out() << p.err();
  auto t = reset_times(p.out());
  ASSERT_FALSE(t.empty()) << p.out();
  double took = t.front() - stopped_at;
  std::printf("frozen worker: survivors compute again %.2f s after SIGSTOP (collective timeout %.0f s)\n", took,
              kCollectiveTimeout);
  EXPECT_LT(took, kCollectiveTimeout + 1.0) << p.err();
  expect_trained_exactly(p);  // also: no process left, the frozen one included
  EXPECT_EQ(p.count("epoch 0 "), 1u) << p.out();  // never restarted from scratch
  EXPECT_NE(p.err().find("alive but not arriving; killing it"), std::string::npos) << p.err();
  EXPECT_EQ(count_events(dir_.file("events.jsonl"), "generation_started"), 3u);  // alone, then grown
  EXPECT_EQ(count_events(dir_.file("events.jsonl"), "worker_excluded"), 1u);
  // The survivors' time blocked on the frozen worker, up to the collective
  // timeout, is lost, not training: it lies between their last commit and
  // the reset, so it is rolled back with the steps since that commit.
  nlohmann::json summary;
  std::ifstream log(dir_.file("events.jsonl"));
  for (std::string line; std::getline(log, line);) {
    auto e = nlohmann::json::parse(line);
    if (e["event"] == "job_summary") summary = e;
  }
  ASSERT_TRUE(summary.is_object()) << p.err();
  EXPECT_GE(summary["rolled_back_s"].get<double>(), kCollectiveTimeout - 0.2) << summary.dump();
}

// The frozen worker alone on its simulated host (node-a:2, node-b:1): the
// survivors reach it only over erun's TCP transport, which cannot see its
// process. node-a's leader names it silent, its follower names no one; once
// both re-joined the driver leaves it out at once, instead of at the re-join
// deadline (collective timeout + 1 s after the re-form, 2 x timeout + 1 s
// after the SIGSTOP).
TEST_F(ErunElastic, FrozenWorkerAloneOnAnotherHostIsLeftOutOnceTheOthersReJoined) {
  dir_.write("hosts", "node-a:2\nnode-b:1\n");
  ErunProcess p(erun_args({"-np", "3", "--min-np", "2", "--launcher", "local", "--collective-timeout", "2"}));
  ASSERT_TRUE(wait_events("generation_joined", 1, 60s)) << p.err();
  ASSERT_TRUE(p.wait_output("epoch 1 ", 120s)) << p.out() << p.err();
  auto frozen = workers("node-b");
  auto survivors = workers("node-a");
  ASSERT_EQ(frozen.size(), 1u);
  ASSERT_EQ(survivors.size(), 2u);
  double stopped_at = unix_now();
  ::kill(frozen.front(), SIGSTOP);
  // 3 -> 2, or straight back to 3 when the replacement reaches the
  // rendezvous before the survivors' generation has connected (as in
  // FrozenWorkerIsLeftOutAndSurvivorsComputeWithinTheCollectiveTimeout).
  ASSERT_TRUE(p.wait_output("reset: world size 3 -> ", 60s)) << p.out() << p.err();
  auto t = reset_times(p.out());
  auto after = std::find_if(t.begin(), t.end(), [&](double at) { return at > stopped_at; });
  ASSERT_NE(after, t.end()) << p.out();
  std::printf("frozen worker on another host: survivors compute again %.2f s after SIGSTOP (collective timeout 2 s)\n",
              *after - stopped_at);
  // Left out on the reports, not at the deadline: the driver's log says so,
  // and the deadline's record never appears.
  const std::string err = p.err();
  EXPECT_NE(err.find("as silent over the network, and every other member of generation"), std::string::npos) << err;
  EXPECT_EQ(err.find("did not join generation"), std::string::npos) << err;
  for (pid_t pid : survivors) EXPECT_TRUE(pid_alive(pid)) << "node-a worker " << pid << " was killed\n" << err;
  expect_trained_exactly(p);  // the exact model; no process left, the frozen one included
  EXPECT_EQ(p.count("epoch 0 "), 1u) << p.out();  // never restarted from scratch
  EXPECT_EQ(count_events(dir_.file("events.jsonl"), "worker_excluded"), 1u);
}

// Two workers frozen at once, each alone on its host: node-a's leader names
// one of them silent, and nobody can name the other (its only neighbours are
// frozen or wait on a frozen one). Once node-a's workers re-joined and nothing
// changed for the settle time (0.5 s), both are left out together, instead
// of at the re-join deadline.
TEST_F(ErunElastic, TwoFrozenWorkersOnOtherHostsAreLeftOutTogether) {
  dir_.write("hosts", "node-a:2\nnode-b:1\nnode-c:1\n");
  ErunProcess p(erun_args({"-np", "4", "--min-np", "2", "--launcher", "local", "--collective-timeout", "2"}));
  ASSERT_TRUE(wait_events("generation_joined", 1, 60s)) << p.err();
  ASSERT_TRUE(p.wait_output("epoch 1 ", 120s)) << p.out() << p.err();
  auto frozen = workers("node-b");
  auto c = workers("node-c");
  frozen.insert(frozen.end(), c.begin(), c.end());
  auto survivors = workers("node-a");
  ASSERT_EQ(frozen.size(), 2u);
  ASSERT_EQ(survivors.size(), 2u);
  double stopped_at = unix_now();
  for (pid_t pid : frozen) ::kill(pid, SIGSTOP);
  // 4 -> 2, or a larger world when replacements reach the rendezvous before
  // the survivors' generation has connected.
  ASSERT_TRUE(p.wait_output("reset: world size 4 -> ", 60s)) << p.out() << p.err();
  auto t = reset_times(p.out());
  auto after = std::find_if(t.begin(), t.end(), [&](double at) { return at > stopped_at; });
  ASSERT_NE(after, t.end()) << p.out();
  std::printf("two frozen workers on other hosts: survivors compute again %.2f s after SIGSTOP (collective timeout "
              "2 s)\n",
              *after - stopped_at);
  const std::string err = p.err();
  EXPECT_NE(err.find("ranks 2,3 of generation"), std::string::npos) << err;
  EXPECT_EQ(err.find("did not join generation"), std::string::npos) << err;
  for (pid_t pid : survivors) EXPECT_TRUE(pid_alive(pid)) << "node-a worker " << pid << " was killed\n" << err;
  expect_trained_exactly(p);
  EXPECT_EQ(p.count("epoch 0 "), 1u) << p.out();
  EXPECT_EQ(count_events(dir_.file("events.jsonl"), "worker_excluded"), 2u);
}

TEST_F(ErunElastic, BelowMinNpSurvivorsWaitInTheRendezvousAndKeepTheirProgress) {
  dir_.write("hosts", "node-a:2\nnode-b:1\n");
  ErunProcess p(erun_args({"-np", "3", "--min-np", "3", "--max-np", "3", "--launcher", "local"}));
  ASSERT_TRUE(wait_events("generation_joined", 1, 60s)) << p.err();
  ASSERT_TRUE(p.wait_output("epoch 1 ", 120s)) << p.out() << p.err();
  auto survivors = workers("node-a");
  ASSERT_EQ(survivors.size(), 2u);
  dir_.write("hosts", "node-a:2\n");  // node-b leaves: 2 slots, fewer than --min-np 3
  ASSERT_TRUE(p.wait_output("keeping the 3 running workers until hosts return", 60s)) << p.err();
  auto victims = workers("node-b");
  ASSERT_EQ(victims.size(), 1u);
  ::kill(victims.front(), SIGKILL);
  ASSERT_TRUE(p.wait_output("survivors wait in the rendezvous", 60s)) << p.err();
  std::this_thread::sleep_for(2s);
  for (pid_t s : survivors) EXPECT_EQ(::kill(s, 0), 0) << "survivor " << s << " was stopped";
  dir_.write("hosts", "node-a:2\nnode-b:1\n");  // it returns
  ASSERT_TRUE(p.wait_output("reset: world size 3 -> 3", 60s)) << p.out() << p.err();
  for (pid_t s : survivors) EXPECT_EQ(::kill(s, 0), 0) << "survivor " << s << " was replaced";
  expect_trained_exactly(p);
  EXPECT_EQ(p.count("epoch 0 "), 1u) << p.out();
  EXPECT_EQ(p.err().find("stopping the workers"), std::string::npos) << p.err();
}

}  // namespace
}  // namespace erun::testing
