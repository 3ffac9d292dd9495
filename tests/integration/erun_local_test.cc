// erun end to end on this machine: the real binary, real workers, real
// discovery scripts. Restart mode (programs that do not use the library).
#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>
#include <regex>
#include <set>

#include "support/erun_process.h"
#include "support/process_utils.h"

namespace erun::testing {
namespace {

using namespace std::chrono_literals;

std::vector<std::string> json_events(const std::string& path, const std::string& event) {
  std::vector<std::string> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find("\"event\":\"" + event + "\"") != std::string::npos) out.push_back(line);
  }
  return out;
}

std::string field(const std::string& json_line, const std::string& name) {
  std::smatch m;
  std::regex re("\"" + name + "\":\"?([^,\"}]*)");
  return std::regex_search(json_line, m, re) ? m[1].str() : "";
}

TEST(ErunLocal, TrueSucceedsAndFalseFailsWithItsExitCodeAndRootCause) {
  ErunProcess ok({"-np", "4", "/bin/true"});
  auto s = ok.wait(60s);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->shell_code(), 0) << ok.err();

  ErunProcess bad({"-np", "2", "sh", "-c", "echo boom-$RANK >&2; exit $((3 + RANK))"});
  s = bad.wait(60s);
  ASSERT_TRUE(s);
  EXPECT_TRUE(s->shell_code() == 3 || s->shell_code() == 4) << s->describe();
  EXPECT_NE(bad.err().find("root cause"), std::string::npos) << bad.err();
  EXPECT_NE(bad.err().find("boom-"), std::string::npos) << bad.err();
}

TEST(ErunLocal, TagsOutputLinesAndSetsTorchrunVariables) {
  ErunProcess p({"-np", "3", "-x", "FOO=bar", "sh", "-c",
                 "echo \"v $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $FOO $MASTER_ADDR $ERUN_GENERATION "
                 "$TORCHELASTIC_RESTART_COUNT\"; echo err-$RANK >&2"});
  auto s = p.wait(60s);
  ASSERT_TRUE(s);
  ASSERT_EQ(s->shell_code(), 0) << p.err();
  for (int r = 0; r < 3; ++r) {
    std::string want = "[" + std::to_string(r) + "]<stdout>:v " + std::to_string(r) + " 3 " + std::to_string(r) +
                       " 3 bar 127.0.0.1 1 0";
    EXPECT_NE(p.out().find(want), std::string::npos) << want << "\n" << p.out();
    EXPECT_NE(p.out().find("[" + std::to_string(r) + "]<stderr>:err-" + std::to_string(r)), std::string::npos);
  }
  ErunProcess untagged({"-np", "1", "--no-tag-output", "echo", "plain"});
  ASSERT_TRUE(untagged.wait(60s));
  EXPECT_EQ(untagged.out(), "plain\n");
}

TEST(ErunLocal, PerRankOutputFiles) {
  TempDir dir;
  ErunProcess p({"-np", "2", "--output-filename", dir.file("logs"), "sh", "-c", "echo out-$RANK; echo err-$RANK >&2"});
  ASSERT_TRUE(p.wait(60s));
  EXPECT_EQ(read_file(dir.file("logs/rank.1/stdout")), "out-1\n");
  EXPECT_EQ(read_file(dir.file("logs/rank.0/stderr")), "err-0\n");
}

TEST(ErunLocal, SecretReachesWorkersButNoCommandLine) {
  TempDir dir;
  std::string marker = "secret-probe-424242";
  ErunProcess p({"-np", "2", "sh", "-c",
                 "printf %s \"$ERUN_SECRET\" > " + dir.file("secret") + ".$RANK; sleep 424242"});
  ASSERT_TRUE(wait_file_lines(dir.file("secret.1"), 0, 30s));
  std::string secret;
  for (int i = 0; i < 100 && secret.size() < 32; ++i) {
    secret = read_file(dir.file("secret.1"));
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_GE(secret.size(), 32u);
  EXPECT_TRUE(pids_with_cmdline(secret).empty()) << describe_pids(pids_with_cmdline(secret));
  p.signal(SIGTERM);
  auto s = p.wait(60s);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->shell_code(), 128 + SIGTERM);
  EXPECT_TRUE(wait_no_process("424242", 10s));
}

TEST(ErunLocal, SigintAndSigtermLeaveNoProcess) {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    std::string marker = std::to_string(313000 + sig);
    ErunProcess p({"-np", "3", "sh", "-c", "trap '' TERM; echo up-$RANK; sleep " + marker + "; sleep " + marker});
    ASSERT_TRUE(p.wait_output("up-2", 30s)) << p.err();
    ASSERT_TRUE(p.wait_output("up-0", 30s));
    p.signal(sig);
    auto s = p.wait(60s);
    ASSERT_TRUE(s) << "erun did not exit after signal " << sig;
    EXPECT_EQ(s->shell_code(), 128 + sig);
    std::vector<pid_t> left;
    EXPECT_TRUE(wait_no_process(marker, 15s, &left)) << describe_pids(left);
  }
}

TEST(ErunLocal, SigkilledErunLeavesNoWorkerBehind) {
  std::string marker = "515151";
  ErunProcess p({"-np", "2", "sh", "-c", "echo up-$RANK; sleep " + marker});
  ASSERT_TRUE(p.wait_output("up-1", 30s));
  ASSERT_TRUE(p.wait_output("up-0", 30s));
  p.signal(SIGKILL);
  ASSERT_TRUE(p.wait(30s));
  std::vector<pid_t> left;
  EXPECT_TRUE(wait_no_process(marker, 20s, &left)) << describe_pids(left);
}

TEST(ErunLocal, DryRunPrintsThePlanAndLaunchesNothing) {
  TempDir dir;
  ErunProcess p({"-np", "3", "-H", "localhost:2,127.0.0.5:2", "--dry-run", "touch", dir.file("launched")});
  auto s = p.wait(30s);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->shell_code(), 0) << p.err();
  // One agent command per host, then each rank's program, env and directory.
  EXPECT_NE(p.out().find("agent on 127.0.0.5 (remote): ssh "), std::string::npos) << p.out();
  EXPECT_NE(p.out().find(" -- 127.0.0.5 'exec "), std::string::npos) << p.out();
  EXPECT_NE(p.out().find("agent on localhost (local): "), std::string::npos) << p.out();
  EXPECT_NE(p.out().find("rank 2 on 127.0.0.5 slot 0:\n  program: touch "), std::string::npos) << p.out();
  EXPECT_NE(p.out().find("rank 0 on localhost slot 0:\n"), std::string::npos) << p.out();
  EXPECT_NE(p.out().find("    ERUN_RANK=2\n"), std::string::npos) << p.out();
  EXPECT_NE(p.out().find("    ERUN_SECRET=<redacted"), std::string::npos) << p.out();
  size_t agents = 0;
  for (size_t at = p.out().find("agent on "); at != std::string::npos; at = p.out().find("agent on ", at + 1)) ++agents;
  EXPECT_EQ(agents, 2u) << p.out();
  EXPECT_EQ(p.out().find("_erun_"), std::string::npos);  // no shell supervisor
  EXPECT_TRUE(read_file(dir.file("launched")).empty());
  EXPECT_FALSE(std::ifstream(dir.file("launched")).good());
}

TEST(ErunLocal, BadInputGetsExitCode2OrAClearStartFailure) {
  ErunProcess p({"-np", "2", "--min-np", "3", "--host-discovery-script", "x", "true"});
  auto s = p.wait(30s);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->shell_code(), 2);
  EXPECT_NE(p.err().find("--min-np 3 is larger than -np 2"), std::string::npos) << p.err();

  TempDir dir;
  dir.write("d.sh", "#!/bin/sh\necho 'localhost:2'\necho 'bad host:x'\n", true);
  ErunProcess q({"-np", "2", "--host-discovery-script", dir.file("d.sh"), "true"});
  s = q.wait(30s);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->shell_code(), 1);
  EXPECT_NE(q.err().find("line 2"), std::string::npos) << q.err();
}

// The elastic loop in restart mode, with the torchrun-style example: grow,
// shrink, a SIGKILLed worker, and a discovery script that fails, hangs and
// prints junk in between; the job still ends with every epoch done once.
class ErunElasticRestart : public ::testing::Test {
 protected:
  void SetUp() override {
    worker_ = build_path("examples/restart_worker");
    ASSERT_TRUE(std::ifstream(worker_).good()) << worker_ << " not built";
    dir_.write("hosts", "node-a:2\n");
    dir_.write("mode", "ok\n");
    // The script's behaviour is switched by the test through the "mode" file.
    dir_.write("discover.sh",
               "#!/bin/sh\n"
               "case $(cat " + dir_.file("mode") + ") in\n"
               "  fail) echo 'discovery broke' >&2; exit 3;;\n"
               "  hang) sleep 30;;\n"
               "  junk) echo 'node-a:2'; echo '!!not a host!!';;\n"
               "  *) cat " + dir_.file("hosts") + ";;\n"
               "esac\n",
               true);
  }
  std::vector<std::string> args(int epochs, int step_ms) {
    return {"-np", "2", "--min-np", "2", "--max-np", "4", "--launcher", "local", "--host-discovery-script",
            dir_.file("discover.sh"), "--discovery-interval", "0.2", "--discovery-timeout", "1",
            "--event-log", dir_.file("events.jsonl"), "--term-grace", "2", "--blacklist-after", "5",
            worker_, "--checkpoint", dir_.file("ckpt"), "--epochs", std::to_string(epochs), "--steps-per-epoch",
            "4", "--step-ms", std::to_string(step_ms)};
  }
  bool wait_generation(int gen, Duration timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (static_cast<int>(json_events(dir_.file("events.jsonl"), "generation_started").size()) >= gen) return true;
      std::this_thread::sleep_for(50ms);
    }
    return false;
  }
  std::string worker_;
  TempDir dir_;
};

TEST_F(ErunElasticRestart, GrowsShrinksSurvivesKillAndBadDiscovery) {
  ErunProcess p(args(60, 100));
  ASSERT_TRUE(wait_generation(1, 30s)) << p.err();
  ASSERT_TRUE(p.wait_output("rank 1/2", 30s)) << p.out() << p.err();

  // Grow: a second "host" appears.
  dir_.write("hosts", "node-a:2\nnode-b:2\n");
  ASSERT_TRUE(wait_generation(2, 30s)) << p.err();
  ASSERT_TRUE(p.wait_output("rank 3/4", 30s)) << p.out() << p.err();

  // Discovery misbehaves: the job keeps its 4 workers.
  for (const char* mode : {"fail", "junk", "hang"}) {
    dir_.write("mode", std::string(mode) + "\n");
    std::this_thread::sleep_for(1500ms);
  }
  dir_.write("mode", "ok\n");
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ(json_events(dir_.file("events.jsonl"), "generation_started").size(), 2u) << p.err();
  EXPECT_NE(p.err().find("discovery broke"), std::string::npos) << p.err();

  // A worker is SIGKILLed: everyone restarts from the checkpoint.
  // The worker itself (argv[0] is the binary), not its supervisor shell.
  std::vector<pid_t> victims;
  for (pid_t pid : pids_with_cmdline("restart_worker --checkpoint")) {
    if (read_file("/proc/" + std::to_string(pid) + "/cmdline").rfind(worker_ + std::string(1, '\0'), 0) == 0) {
      victims.push_back(pid);
    }
  }
  ASSERT_FALSE(victims.empty());
  ::kill(victims.back(), SIGKILL);
  ASSERT_TRUE(wait_generation(3, 30s)) << p.err();
  ASSERT_TRUE(p.wait_output("restart 2", 30s)) << p.out();

  // Shrink: node-b goes away.
  dir_.write("hosts", "node-a:2\n");
  ASSERT_TRUE(wait_generation(4, 30s)) << p.err();

  auto s = p.wait(240s);
  ASSERT_TRUE(s) << "job did not finish";
  EXPECT_EQ(s->shell_code(), 0) << p.err();
  EXPECT_NE(p.out().find("done epochs=60"), std::string::npos) << p.out();
  auto gens = json_events(dir_.file("events.jsonl"), "generation_started");
  ASSERT_GE(gens.size(), 4u);
  EXPECT_EQ(field(gens[0], "size"), "2");
  EXPECT_EQ(field(gens[1], "size"), "4");
  EXPECT_EQ(field(gens[2], "size"), "4");
  EXPECT_EQ(field(gens[3], "size"), "2");
  EXPECT_TRUE(wait_no_process("restart_worker --checkpoint " + dir_.file("ckpt"), 10s));
}

TEST_F(ErunElasticRestart, WaitsForMinNpThenGivesUpAfterTheElasticTimeout) {
  dir_.write("hosts", "node-a:1\n");
  auto a = args(2, 10);
  a.insert(a.begin(), {"--elastic-timeout", "2"});
  ErunProcess p(a);
  auto s = p.wait(60s);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->shell_code(), 1);
  EXPECT_NE(p.err().find("--elastic-timeout"), std::string::npos) << p.err();
  EXPECT_TRUE(json_events(dir_.file("events.jsonl"), "generation_started").empty());
}

}  // namespace
}  // namespace erun::testing
