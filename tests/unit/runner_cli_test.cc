#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>
#include <vector>

#include "runner/cli.h"

namespace erun {
namespace {

std::variant<DriverOptions, CliError, CliInfo> parse(std::vector<std::string> words) {
  words.insert(words.begin(), "erun");
  std::vector<const char*> argv;
  for (auto& w : words) argv.push_back(w.c_str());
  return parse_cli(static_cast<int>(argv.size()), argv.data());
}

DriverOptions ok(std::vector<std::string> words) {
  auto r = parse(words);
  if (auto* e = std::get_if<CliError>(&r)) ADD_FAILURE() << e->message;
  EXPECT_TRUE(std::holds_alternative<DriverOptions>(r));
  return std::holds_alternative<DriverOptions>(r) ? std::get<DriverOptions>(r) : DriverOptions{};
}

std::string error(std::vector<std::string> words) {
  auto r = parse(words);
  EXPECT_TRUE(std::holds_alternative<CliError>(r));
  return std::holds_alternative<CliError>(r) ? std::get<CliError>(r).message : "";
}

TEST(Cli, MpirunStyleNpAndCommandArgumentsStayTheCommands) {
  auto o = ok({"-np", "4", "./train", "--epochs", "5", "-v"});
  EXPECT_EQ(o.np, 4);
  EXPECT_EQ(o.min_np, 4);
  EXPECT_EQ(o.max_np, 4);
  EXPECT_FALSE(o.elastic);
  EXPECT_FALSE(o.verbose);  // -v after the program belongs to the program
  EXPECT_EQ(o.command, (std::vector<std::string>{"./train", "--epochs", "5", "-v"}));
  EXPECT_EQ(o.reset_limit, 0);
}

TEST(Cli, TheLogLevelIsWarnUnlessTheFlagsOrTheEnvironmentSayOtherwise) {
  const char* was = std::getenv("ERUN_LOG_LEVEL");
  const std::string saved = was ? was : "";
  ::unsetenv("ERUN_LOG_LEVEL");
  EXPECT_EQ(ok({"-np", "2", "./train"}).log_level, LogLevel::kWarn);
  EXPECT_EQ(ok({"--log-level", "info", "-np", "2", "./train", "--log-level", "x"}).log_level, LogLevel::kInfo);
  EXPECT_EQ(ok({"-np", "2", "--log-level", "error", "./train"}).log_level, LogLevel::kError);
  EXPECT_EQ(ok({"-v", "-np", "2", "./train"}).log_level, LogLevel::kDebug);
  ::setenv("ERUN_LOG_LEVEL", "info", 1);
  EXPECT_EQ(ok({"-np", "2", "./train"}).log_level, LogLevel::kInfo);
  EXPECT_EQ(ok({"--log-level", "warning", "-np", "2", "./train"}).log_level, LogLevel::kWarn);
  ::setenv("ERUN_LOG_LEVEL", "chatty", 1);  // not a level: the default
  EXPECT_EQ(ok({"-np", "2", "./train"}).log_level, LogLevel::kWarn);
  EXPECT_EQ(error({"--log-level", "chatty", "-np", "2", "./train"}),
            "--log-level chatty: expected error, warn, info or debug (or horovodrun's TRACE, DEBUG, INFO, WARNING, "
            "ERROR, FATAL)");
  // horovodrun's names, any case.
  EXPECT_EQ(ok({"--log-level", "TRACE", "-np", "2", "./train"}).log_level, LogLevel::kDebug);
  EXPECT_EQ(ok({"--log-level", "WARNING", "-np", "2", "./train"}).log_level, LogLevel::kWarn);
  EXPECT_EQ(ok({"--log-level", "Fatal", "-np", "2", "./train"}).log_level, LogLevel::kError);
  if (was) ::setenv("ERUN_LOG_LEVEL", saved.c_str(), 1);
  else ::unsetenv("ERUN_LOG_LEVEL");
}

TEST(Cli, HorovodrunFlagsAreMappedNotedOrRefused) {
  // Its spellings of -np, --min-np and --max-np; values of ignored flags are not the command.
  auto o = ok({"--num-proc", "8", "--min-num-proc", "4", "--max-num-proc=12", "--host-discovery-script", "./d.sh",
               "--fusion-threshold-mb", "32", "--gloo", "--network-interface", "eth0", "python", "train.py"});
  EXPECT_EQ(o.np, 8);
  EXPECT_EQ(o.min_np, 4);
  EXPECT_EQ(o.max_np, 12);
  EXPECT_EQ(o.command, (std::vector<std::string>{"python", "train.py"}));
  ASSERT_EQ(o.notes.size(), 3u);
  EXPECT_EQ(o.notes[0].rfind("--fusion-threshold-mb is ignored: ", 0), 0u) << o.notes[0];
  EXPECT_EQ(o.notes[1].rfind("--gloo is ignored: ", 0), 0u) << o.notes[1];
  EXPECT_EQ(o.notes[2].rfind("--network-interface is ignored: ", 0), 0u) << o.notes[2];
  EXPECT_TRUE(ok({"-np", "2", "./train"}).notes.empty());

  // Mapped onto erun's own flags, which win when both are given.
  o = ok({"-np", "2", "--start-timeout", "90", "--gloo-timeout-seconds", "45", "./train"});
  EXPECT_EQ(o.rendezvous_timeout, std::chrono::seconds(90));
  EXPECT_EQ(o.collective_timeout, std::chrono::seconds(45));
  o = ok({"-np", "2", "--start-timeout", "90", "--rendezvous-timeout", "20", "./train"});
  EXPECT_EQ(o.rendezvous_timeout, std::chrono::seconds(20));
  EXPECT_EQ(ok({"-np", "2", "--mpi", "./train"}).launcher, LauncherKind::kMpirun);
  EXPECT_EQ(error({"-np", "2", "--mpi", "--launcher", "ssh", "./train"}),
            "--mpi and --launcher ssh contradict each other: give one");
  EXPECT_NE(error({"-np", "2", "--mpi", "--min-np", "1", "./train"}).find("--launcher mpirun runs a static job"),
            std::string::npos);

  // Refused, with the reason.
  EXPECT_NE(error({"-np", "2", "--config-file", "h.yaml", "./train"}).find("does not read Horovod's YAML"),
            std::string::npos);
  EXPECT_NE(error({"-np", "2", "--mpi-args", "-x A", "./train"}).find("--mpi-args: erun passes no arguments"),
            std::string::npos);

  // -cb prints what this erun runs; --help lists the ignored flags in one paragraph.
  auto cb = parse({"-cb"});
  ASSERT_TRUE(std::holds_alternative<CliInfo>(cb));
  EXPECT_NE(std::get<CliInfo>(cb).text.find("[X] PyTorch"), std::string::npos);
  auto help = parse({"--help"});
  ASSERT_TRUE(std::holds_alternative<CliInfo>(help));
  const std::string& text = std::get<CliInfo>(help).text;
  EXPECT_NE(text.find("--start-timeout"), std::string::npos);
  EXPECT_NE(text.find("each with a one-line note"), std::string::npos);
  EXPECT_NE(text.find("--prefix-output-with-timestamp"), std::string::npos);
}

TEST(Cli, ElasticDefaults) {
  auto o = ok({"-np", "8", "--min-np", "4", "--host-discovery-script", "./d.sh", "./train"});
  EXPECT_TRUE(o.elastic);
  EXPECT_EQ(o.min_np, 4);
  EXPECT_EQ(o.max_np, 8);
  EXPECT_EQ(o.reset_limit, -1);
  EXPECT_EQ(o.discovery_script, "./d.sh");
  EXPECT_EQ(o.discovery_interval, std::chrono::seconds(1));
  EXPECT_EQ(o.elastic_timeout, std::chrono::seconds(600));
}

TEST(Cli, AllFlags) {
  auto o = ok({"--np=2", "--max-np", "6", "-H", "a:2,b:2", "--slots-per-host", "2", "--elastic-timeout", "30",
               "--reset-limit", "3", "--blacklist-cooldown-range", "5", "60", "--ssh-port", "2222",
               "--ssh-identity-file", "/k", "-x", "A=1", "-x", "B=2", "--output-filename", "/tmp/o",
               "--no-tag-output", "--event-log", "/tmp/e.jsonl", "--dry-run", "-v", "--discovery-interval",
               "0.5", "--launcher", "ssh", "--mode", "restart", "--", "prog", "-np", "3"});
  EXPECT_EQ(o.np, 2);
  EXPECT_EQ(o.max_np, 6);
  EXPECT_EQ(o.hosts, "a:2,b:2");
  EXPECT_EQ(o.reset_limit, 3);
  EXPECT_DOUBLE_EQ(o.cooldown_min_s, 5);
  EXPECT_DOUBLE_EQ(o.cooldown_max_s, 60);
  EXPECT_EQ(o.ssh_port, 2222);
  EXPECT_EQ(o.env, (std::vector<std::string>{"A=1", "B=2"}));
  EXPECT_FALSE(o.tag_output);
  EXPECT_TRUE(o.dry_run);
  EXPECT_TRUE(o.verbose);
  EXPECT_EQ(o.launcher, LauncherKind::kSsh);
  EXPECT_EQ(o.mode, WorkerMode::kRestart);
  EXPECT_EQ(o.discovery_interval, std::chrono::milliseconds(500));
  EXPECT_EQ(o.command, (std::vector<std::string>{"prog", "-np", "3"}));
}

TEST(Cli, ContradictionsAreOneClearLine) {
  EXPECT_NE(error({"-np", "2", "--min-np", "4", "--host-discovery-script", "d", "x"}).find("--min-np 4 is larger"),
            std::string::npos);
  EXPECT_NE(error({"-np", "8", "--max-np", "4", "x"}).find("--max-np 4 is smaller than -np 8"), std::string::npos);
  EXPECT_NE(error({"-np", "2", "-H", "a", "--hostfile", "f", "x"}).find("only one of"), std::string::npos);
  EXPECT_NE(error({"-np", "2"}).find("no command"), std::string::npos);
  EXPECT_NE(error({"./train"}).find("-np"), std::string::npos);
  EXPECT_NE(error({"-np", "0", "x"}).find("at least 1"), std::string::npos);
  EXPECT_NE(error({"-np", "x", "y"}).find("np"), std::string::npos);
  EXPECT_NE(error({"--bogus", "-np", "2", "x"}).find("bogus"), std::string::npos);
  EXPECT_NE(error({"-np", "2", "--tag-output", "--no-tag-output", "x"}).find("contradict"), std::string::npos);
  EXPECT_NE(error({"-np", "2", "--blacklist-cooldown-range", "9", "3", "x"}).find("MIN MAX"), std::string::npos);
  EXPECT_NE(error({"-np", "2", "--launcher", "rsh", "x"}).find("auto, local or ssh"), std::string::npos);
  EXPECT_NE(error({"-np", "2", "-x", "1BAD=2", "x"}).find("not a variable name"), std::string::npos);
  EXPECT_NE(error({"-np", "2", "--discovery-interval", "0", "x"}).find("positive"), std::string::npos);
  EXPECT_NE(error({"-np", "2", "--commit-replicas", "-1", "x"}).find("--commit-replicas -1: must be 0 or more"),
            std::string::npos);
}

// --slurm-grow takes a partition (its value is no program) and needs an
// allocation and --max-np.
TEST(Cli, SlurmGrow) {
  CliContext in_allocation;
  in_allocation.in_slurm_allocation = true;
  std::vector<std::string> words = {"erun", "--slurm-grow", "spare", "-np", "2", "--max-np", "4", "./train", "-x"};
  std::vector<const char*> argv;
  for (auto& w : words) argv.push_back(w.c_str());
  auto r = parse_cli(static_cast<int>(argv.size()), argv.data(), in_allocation);
  ASSERT_TRUE(std::holds_alternative<DriverOptions>(r)) << std::get<CliError>(r).message;
  const auto& o = std::get<DriverOptions>(r);
  EXPECT_EQ(o.slurm_grow, "spare");
  EXPECT_TRUE(o.slurm);
  EXPECT_EQ(o.command, (std::vector<std::string>{"./train", "-x"}));
  EXPECT_NE(error({"--slurm-grow", "spare", "-np", "2", "--max-np", "4", "./train"}).find("inside salloc or sbatch"),
            std::string::npos);
  words = {"erun", "--slurm-grow", "spare", "-np", "2", "./train"};
  argv.clear();
  for (auto& w : words) argv.push_back(w.c_str());
  r = parse_cli(static_cast<int>(argv.size()), argv.data(), in_allocation);
  ASSERT_TRUE(std::holds_alternative<CliError>(r));
  EXPECT_NE(std::get<CliError>(r).message.find("give --max-np"), std::string::npos) << std::get<CliError>(r).message;
}

TEST(Cli, CommitReplicas) {
  EXPECT_EQ(ok({"-np", "2", "x"}).commit_replicas, 1);
  EXPECT_EQ(ok({"-np", "2", "--commit-replicas", "0", "x"}).commit_replicas, 0);
  auto o = ok({"-np", "2", "--commit-replicas", "3", "./train", "--commit-replicas", "9"});
  EXPECT_EQ(o.commit_replicas, 3);
  EXPECT_EQ(o.command.back(), "9");  // the program's own argument stays its own
}

TEST(Cli, HelpAndVersion) {
  auto h = parse({"--help"});
  ASSERT_TRUE(std::holds_alternative<CliInfo>(h));
  EXPECT_NE(std::get<CliInfo>(h).text.find("--host-discovery-script"), std::string::npos);
  auto v = parse({"--version"});
  ASSERT_TRUE(std::holds_alternative<CliInfo>(v));
  EXPECT_NE(std::get<CliInfo>(v).text.find("erun "), std::string::npos);
}

}  // namespace
}  // namespace erun

namespace erun {
namespace {

TEST(Cli, CrashLoopLimitDefaultsToThreeAndZeroTurnsItOff) {
  EXPECT_EQ(ok({"-np", "2", "./train"}).crash_loop_limit, 3);
  EXPECT_EQ(ok({"--crash-loop-limit", "0", "-np", "2", "./train"}).crash_loop_limit, 0);
  EXPECT_EQ(ok({"--crash-loop-limit", "7", "-np", "2", "./train"}).crash_loop_limit, 7);
  EXPECT_NE(error({"--crash-loop-limit", "-1", "-np", "2", "./train"}).find("--crash-loop-limit must be 0 (off) or more"),
            std::string::npos);
}

TEST(Cli, HostCommitsAreOnUnlessTurnedOff) {
  EXPECT_TRUE(ok({"-np", "2", "./train"}).host_commits);
  auto o = ok({"-np", "2", "--no-host-commits", "./train", "--no-host-commits"});
  EXPECT_FALSE(o.host_commits);
  EXPECT_EQ(o.command, (std::vector<std::string>{"./train", "--no-host-commits"}));
}

TEST(Cli, MetricsAndStatusFlags) {
  auto o = ok({"-np", "2", "./train"});
  EXPECT_EQ(o.metrics_port, -1);
  EXPECT_EQ(o.metrics_addr, "127.0.0.1");  // this machine only unless told
  EXPECT_FALSE(o.no_status);
  o = ok({"-np", "2", "--metrics-port", "9400", "--metrics-addr", "0.0.0.0", "--no-status", "./train"});
  EXPECT_EQ(o.metrics_port, 9400);
  EXPECT_EQ(o.metrics_addr, "0.0.0.0");
  EXPECT_TRUE(o.no_status);
  EXPECT_NE(error({"-np", "2", "--metrics-port", "70000", "./train"}).find("--metrics-port 70000"), std::string::npos);
  EXPECT_NE(error({"-np", "2", "--metrics-port", "-3", "./train"}).find("--metrics-port"), std::string::npos);
  EXPECT_NE(error({"-np", "2", "--metrics-addr", "0.0.0.0", "./train"}).find("needs --metrics-port"),
            std::string::npos);
}

}  // namespace
}  // namespace erun
