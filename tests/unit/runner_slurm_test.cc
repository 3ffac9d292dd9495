// erun's Slurm and MPI launch options: --slurm and its automatic form,
// --launcher srun|mpirun, the srun step command and the mpirun command line.
#include <gtest/gtest.h>

#include <algorithm>

#include "runner/cli.h"
#include "runner/launch/launcher_srun.h"

namespace erun {
namespace {

std::variant<DriverOptions, CliError, CliInfo> parse(std::vector<const char*> words, bool in_allocation = false) {
  words.insert(words.begin(), "erun");
  CliContext c;
  c.in_slurm_allocation = in_allocation;
  return parse_cli(static_cast<int>(words.size()), words.data(), c);
}

bool contains(const std::vector<std::string>& v, const std::string& w) {
  return std::find(v.begin(), v.end(), w) != v.end();
}

TEST(RunnerSlurm, SlurmFlagNeedsNoNpAndRefusesExplicitHosts) {
  auto r = parse({"--slurm", "./train"});
  ASSERT_TRUE(std::holds_alternative<DriverOptions>(r));
  EXPECT_TRUE(std::get<DriverOptions>(r).slurm);
  EXPECT_EQ(std::get<DriverOptions>(r).np, 0);  // every slot of the allocation
  auto bad = parse({"--slurm", "-H", "a:2", "./train"});
  ASSERT_TRUE(std::holds_alternative<CliError>(bad));
  EXPECT_NE(std::get<CliError>(bad).message.find("--slurm"), std::string::npos);
}

TEST(RunnerSlurm, AnAllocationTurnsSlurmOnOnlyWhenNoHostsAreGiven) {
  EXPECT_TRUE(std::get<DriverOptions>(parse({"-np", "2", "./t"}, true)).slurm);
  EXPECT_FALSE(std::get<DriverOptions>(parse({"-np", "2", "./t"}, false)).slurm);
  EXPECT_FALSE(std::get<DriverOptions>(parse({"-H", "a:2", "./t"}, true)).slurm);
  auto script = std::get<DriverOptions>(parse({"-np", "2", "--host-discovery-script", "./d.sh", "./t"}, true));
  EXPECT_FALSE(script.slurm);
  // Explicit --slurm with a script: the script stays the source.
  auto both = parse({"--slurm", "-np", "2", "--host-discovery-script", "./d.sh", "./t"});
  ASSERT_TRUE(std::holds_alternative<DriverOptions>(both));
  EXPECT_TRUE(std::get<DriverOptions>(both).slurm);
}

TEST(RunnerSlurm, LauncherKindsAndTheStaticMpirunRules) {
  EXPECT_EQ(std::get<DriverOptions>(parse({"--launcher", "srun", "-np", "2", "./t"})).launcher, LauncherKind::kSrun);
  EXPECT_EQ(std::get<DriverOptions>(parse({"--launcher", "mpirun", "-np", "2", "./t"})).launcher,
            LauncherKind::kMpirun);
  EXPECT_TRUE(std::holds_alternative<CliError>(parse({"--launcher", "mpirun", "-np", "4", "--min-np", "2", "./t"})));
  EXPECT_TRUE(std::holds_alternative<CliError>(parse({"--launcher", "pbs", "-np", "2", "./t"})));
}

TEST(RunnerSlurm, MpirunCommandPassesHostsSlotsAndVariables) {
  DriverOptions o;
  o.command = {"./train", "--epochs", "3"};
  HostSet hosts({Host{"a", 4}, Host{"b", 2}});
  auto argv = mpirun_command(o, hosts, {"FOO=bar baz"});
  std::vector<std::string> want = {"mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "6", "-H", "a:4,b:2",
                                   "-x", "FOO=bar baz", "./train", "--epochs", "3"};
  EXPECT_EQ(argv, want);
  o.np = 3;
  EXPECT_EQ(mpirun_command(o, hosts, {})[4], "3");
}

TEST(RunnerSlurm, SrunStepRunsTheNodesAgentWithoutTheWorkerOrSecret) {
  AgentLaunchOptions agent;
  agent.agent_path = "/opt/erun/bin/erun";
  auto launcher = make_srun_launcher({}, agent);
  WorkerSpec spec;
  spec.host = "node07";
  spec.rank = 3;
  spec.generation = 2;
  spec.command = {"./train-program"};
  spec.env = {{"FOO", "env-value"}};
  spec.secret = "s3cr3t-value";
  auto argv = launcher->command_line(spec);
  ASSERT_GE(argv.size(), 4u);
  EXPECT_EQ(argv[0], "srun");
  for (const char* w : {"--overlap", "--nodes=1", "--ntasks=1", "--nodelist=node07", "--kill-on-bad-exit=1"})
    EXPECT_TRUE(contains(argv, w)) << w;
  auto at = std::find(argv.begin(), argv.end(), "/opt/erun/bin/erun");
  ASSERT_NE(at, argv.end());
  ASSERT_NE(at + 1, argv.end());
  EXPECT_EQ(*(at + 1), "--agent");
  for (const auto& w : argv) {
    EXPECT_EQ(w.find("s3cr3t-value"), std::string::npos) << w;
    EXPECT_EQ(w.find("env-value"), std::string::npos) << w;
    EXPECT_EQ(w.find("train-program"), std::string::npos) << w;
  }
  spec.host = "-oops";
  EXPECT_FALSE(static_cast<bool>(launcher->launch(spec)));
}

}  // namespace
}  // namespace erun
