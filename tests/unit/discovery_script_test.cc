#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "discovery/discovery.h"

namespace erun {
namespace {

using namespace std::chrono_literals;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "erun-disc-XXXXXX").string();
    ERUN_CHECK(::mkdtemp(tmpl.data()) != nullptr);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string write(const std::string& name, const std::string& text, bool executable = true) const {
    auto p = file(name);
    std::ofstream(p) << text;
    ::chmod(p.c_str(), executable ? 0755 : 0644);
    return p;
  }

 private:
  fs::path path_;
};

double since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Alive and not a zombie (an orphan's zombie may wait for a slow init to reap it).
bool alive(pid_t pid) {
  if (::kill(pid, 0) != 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  auto close = line.rfind(')');
  return close == std::string::npos || close + 2 >= line.size() || line[close + 2] != 'Z';
}

bool wait_until(const std::function<bool()>& cond, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return cond();
}

pid_t read_pid(const std::string& path) {
  std::ifstream in(path);
  long pid = 0;
  in >> pid;
  return static_cast<pid_t>(pid);
}

// ---- ScriptDiscovery with real scripts ----

TEST(ScriptDiscovery, GoodOutput) {
  TempDir dir;
  auto script = dir.write("d.sh",
                          "#!/bin/sh\n"
                          "echo '# from the test'\n"
                          "echo 'node1:4'\n"
                          "echo ''\n"
                          "echo 'node2'\n"
                          "echo '[::1]:2  # loopback'\n");
  ScriptDiscovery d(script, 10s, 2);
  auto r = d.discover();
  ASSERT_TRUE(r) << r.message();
  EXPECT_THAT(r->hosts(), ElementsAre(Host{"node1", 4}, Host{"node2", 2}, Host{"::1", 2}));
  EXPECT_EQ(d.describe(), "script " + script);
}

TEST(ScriptDiscovery, RunsThroughShellWithArguments) {
  TempDir dir;
  auto script = dir.write("d.sh", "#!/bin/sh\necho \"$1:$2\"\n");
  ScriptDiscovery d(script + " hostx 7", 10s, 1);
  auto r = d.discover();
  ASSERT_TRUE(r) << r.message();
  EXPECT_THAT(r->hosts(), ElementsAre(Host{"hostx", 7}));
}

TEST(ScriptDiscovery, NonZeroExitShowsStatusAndStderrTail) {
  TempDir dir;
  auto script = dir.write("d.sh",
                          "#!/bin/sh\n"
                          "echo node1:2\n"
                          "for i in 1 2 3 4 5 6 7 8; do echo \"noise $i\" >&2; done\n"
                          "echo 'cannot reach the inventory service' >&2\n"
                          "exit 3\n");
  ScriptDiscovery d(script, 10s, 1);
  auto r = d.discover();
  ASSERT_FALSE(r);
  EXPECT_THAT(r.message(), HasSubstr("exit code 3"));
  EXPECT_THAT(r.message(), HasSubstr("cannot reach the inventory service"));
  EXPECT_THAT(r.message(), HasSubstr(script));
  EXPECT_THAT(r.message(), Not(HasSubstr("noise 1")));  // only the last lines
}

TEST(ScriptDiscovery, HangPastTimeoutKillsWholeGroup) {
  TempDir dir;
  auto script = dir.write("d.sh",
                          "#!/bin/sh\n"
                          "sleep 1000 &\n"
                          "echo $! > " + dir.file("child.pid") + "\n"
                          "echo $$ > " + dir.file("main.pid") + "\n"
                          "echo node1:1\n"
                          "echo 'looking up hosts...' >&2\n"
                          "sleep 1000\n");
  ScriptDiscovery d(script, 1s, 1);
  auto t0 = std::chrono::steady_clock::now();
  auto r = d.discover();
  double took = since(t0);
  ASSERT_FALSE(r);
  EXPECT_THAT(r.message(), HasSubstr("--discovery-timeout"));
  EXPECT_THAT(r.message(), HasSubstr("looking up hosts"));
  EXPECT_GE(took, 0.9);
  EXPECT_LT(took, 1.0 + 5.0);
  pid_t child = read_pid(dir.file("child.pid"));
  pid_t main_pid = read_pid(dir.file("main.pid"));
  ASSERT_GT(child, 0);
  ASSERT_GT(main_pid, 0);
  EXPECT_TRUE(wait_until([&] { return !alive(child) && !alive(main_pid); }, 5000ms))
      << "left behind: child " << child << " main " << main_pid;
}

TEST(ScriptDiscovery, BackgroundChildHoldingStdoutDoesNotHangAndIsKilled) {
  TempDir dir;
  auto script = dir.write("d.sh",
                          "#!/bin/sh\n"
                          "sleep 1000 &\n"
                          "echo $! > " + dir.file("child.pid") + "\n"
                          "echo node1:3\n"
                          "exit 0\n");
  ScriptDiscovery d(script, 20s, 1);
  auto t0 = std::chrono::steady_clock::now();
  auto r = d.discover();
  ASSERT_TRUE(r) << r.message();
  EXPECT_THAT(r->hosts(), ElementsAre(Host{"node1", 3}));
  EXPECT_LT(since(t0), 10.0);
  pid_t child = read_pid(dir.file("child.pid"));
  ASSERT_GT(child, 0);
  EXPECT_TRUE(wait_until([&] { return !alive(child); }, 5000ms));
}

TEST(ScriptDiscovery, JunkOutputIsAParseErrorWithLineNumber) {
  TempDir dir;
  auto script = dir.write("d.sh", "#!/bin/sh\necho node1:2\necho 'Hello, world!'\n");
  ScriptDiscovery d(script, 10s, 1);
  auto r = d.discover();
  ASSERT_FALSE(r);
  EXPECT_THAT(r.message(), HasSubstr("bad output"));
  EXPECT_THAT(r.message(), HasSubstr("line 2 \"Hello, world!\""));
}

TEST(ScriptDiscovery, NotExecutableSaysChmod) {
  TempDir dir;
  auto script = dir.write("d.sh", "#!/bin/sh\necho node1\n", /*executable=*/false);
  ScriptDiscovery d(script, 10s, 1);
  auto r = d.discover();
  ASSERT_FALSE(r);
  EXPECT_THAT(r.message(), HasSubstr("chmod +x"));
}

TEST(ScriptDiscovery, NotFound) {
  TempDir dir;
  ScriptDiscovery d(dir.file("missing.sh"), 10s, 1);
  auto r = d.discover();
  ASSERT_FALSE(r);
  EXPECT_THAT(r.message(), HasSubstr("not found"));
  ScriptDiscovery in_path("erun-no-such-discovery-command-xyz", 10s, 1);
  auto r2 = in_path.discover();
  ASSERT_FALSE(r2);
  EXPECT_THAT(r2.message(), HasSubstr("exit code 127"));
  EXPECT_THAT(r2.message(), HasSubstr("not found"));
}

TEST(ScriptDiscovery, LargeStderrAndStdoutAtOnce) {
  TempDir dir;
  // 400 KB on stderr before any stdout: both pipes must be read at the same time.
  auto script = dir.write("d.sh",
                          "#!/bin/sh\n"
                          "i=0; while [ $i -lt 4000 ]; do\n"
                          "  echo 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx' >&2\n"
                          "  echo \"h$i:1\"\n"
                          "  i=$((i+1))\n"
                          "done\n");
  ScriptDiscovery d(script, 60s, 1);
  auto r = d.discover();
  ASSERT_TRUE(r) << r.message().substr(0, 500);
  EXPECT_EQ(r->size(), 4000u);
  EXPECT_EQ(r->hosts().back().name, "h3999");
}

TEST(ScriptDiscovery, KilledBySignalIsReported) {
  TempDir dir;
  auto script = dir.write("d.sh", "#!/bin/sh\nkill -9 $$\n");
  ScriptDiscovery d(script, 10s, 1);
  auto r = d.discover();
  ASSERT_FALSE(r);
  EXPECT_THAT(r.message(), HasSubstr("signal 9"));
}

// ---- scripts/discover_hosts.sh, the example script ----

std::string example_script() { return std::string(ERUN_SOURCE_DIR) + "/scripts/discover_hosts.sh"; }

TEST(ExampleScript, HostsFile) {
  TempDir dir;
  auto hosts = dir.write("hosts.txt", "# operators edit this\nnode1:4  # rack 1\n\n  node2\n", false);
  ScriptDiscovery d("ERUN_HOSTS_FILE=" + hosts + " " + example_script(), 10s, 2);
  auto r = d.discover();
  ASSERT_TRUE(r) << r.message();
  EXPECT_THAT(r->hosts(), ElementsAre(Host{"node1", 4}, Host{"node2", 2}));
}

TEST(ExampleScript, MissingHostsFileFails) {
  TempDir dir;
  ScriptDiscovery d("ERUN_HOSTS_FILE=" + dir.file("nope.txt") + " " + example_script() + " file",
                    10s, 1);
  auto r = d.discover();
  ASSERT_FALSE(r);
  EXPECT_THAT(r.message(), HasSubstr("exit code 1"));
  EXPECT_THAT(r.message(), HasSubstr("cannot read hosts file"));
}

TEST(ExampleScript, Slurm) {
  TempDir dir;
  // A stand-in for scontrol that expands the one list this test uses.
  dir.write("scontrol",
            "#!/bin/sh\n"
            "[ \"$1 $2\" = 'show hostnames' ] && [ \"$3\" = 'n[1-2]' ] || exit 9\n"
            "echo n1; echo n2\n");
  ScriptDiscovery d("PATH=" + dir.path().string() + ":$PATH SLURM_JOB_NODELIST='n[1-2]' "
                    "SLURM_NTASKS_PER_NODE=4 " + example_script() + " slurm",
                    10s, 1);
  auto r = d.discover();
  ASSERT_TRUE(r) << r.message();
  EXPECT_THAT(r->hosts(), ElementsAre(Host{"n1", 4}, Host{"n2", 4}));
}

TEST(ExampleScript, Static) {
  ScriptDiscovery d("ERUN_STATIC_HOSTS=a:2,b " + example_script() + " static", 10s, 3);
  auto r = d.discover();
  ASSERT_TRUE(r) << r.message();
  EXPECT_THAT(r->hosts(), ElementsAre(Host{"a", 2}, Host{"b", 3}));
}

// ---- DiscoveryLoop with FakeDiscovery ----

HostSet hs(std::initializer_list<Host> hosts) { return HostSet(std::vector<Host>(hosts)); }

// The loop runs discoveries one after another, so once call n+1 has started,
// the result of call n has been applied.
void wait_applied(const FakeDiscovery& fake, int calls) {
  ASSERT_TRUE(wait_until([&] { return fake.calls() >= calls + 1; }, 10000ms))
      << "calls " << fake.calls();
}

TEST(DiscoveryLoop, FirstRunsOnCallerThread) {
  FakeDiscovery fake;
  fake.set(hs({{"a", 2}}));
  DiscoveryLoop loop(fake, 1h);
  ASSERT_TRUE(loop.first());
  EXPECT_EQ(fake.calls(), 1);
  auto s = loop.snapshot();
  EXPECT_EQ(s.version, 1);
  EXPECT_EQ(s.hosts, hs({{"a", 2}}));
  EXPECT_TRUE(s.last_error.empty());
}

TEST(DiscoveryLoop, FirstFailureIsReturned) {
  FakeDiscovery fake;
  fake.set_error("script exploded");
  DiscoveryLoop loop(fake, 1h);
  auto st = loop.first();
  ASSERT_FALSE(st);
  EXPECT_EQ(st.message(), "script exploded");
  auto s = loop.snapshot();
  EXPECT_EQ(s.version, 0);
  EXPECT_EQ(s.last_error, "script exploded");
  EXPECT_EQ(s.failures_in_a_row, 1);
}

TEST(DiscoveryLoop, FirstEmptyResultCountsAsAChange) {
  FakeDiscovery fake;
  DiscoveryLoop loop(fake, 1h);
  ASSERT_TRUE(loop.first());
  EXPECT_EQ(loop.snapshot().version, 1);
  EXPECT_TRUE(loop.snapshot().hosts.empty());
}

TEST(DiscoveryLoop, KeepsPreviousSetOnErrorAndVersionBumpsOnlyOnChange) {
  FakeDiscovery fake;
  fake.set(hs({{"a", 2}, {"b", 2}}));
  DiscoveryLoop loop(fake, 1ms);
  ASSERT_TRUE(loop.first());
  auto t_first = loop.snapshot().updated;
  loop.start();

  wait_applied(fake, fake.calls() + 2);  // same hosts again: no new version
  EXPECT_EQ(loop.snapshot().version, 1);
  EXPECT_EQ(loop.snapshot().updated, t_first);

  fake.set_error("discovery script ./d.sh failed with exit code 1");
  int c = fake.calls();
  wait_applied(fake, c + 3);
  auto s = loop.snapshot();
  EXPECT_EQ(s.version, 1);
  EXPECT_EQ(s.hosts, hs({{"a", 2}, {"b", 2}}));
  EXPECT_EQ(s.last_error, "discovery script ./d.sh failed with exit code 1");
  EXPECT_GE(s.failures_in_a_row, 2);

  fake.set(hs({{"a", 2}, {"b", 2}}));  // recovers with the same set: still no new version
  c = fake.calls();
  wait_applied(fake, c + 1);
  s = loop.snapshot();
  EXPECT_EQ(s.version, 1);
  EXPECT_TRUE(s.last_error.empty());
  EXPECT_EQ(s.failures_in_a_row, 0);

  fake.set(hs({{"a", 2}, {"c", 1}}));
  s = loop.wait_for_change(1, 10s);
  EXPECT_EQ(s.version, 2);
  EXPECT_EQ(s.hosts, hs({{"a", 2}, {"c", 1}}));
  loop.stop();
}

TEST(DiscoveryLoop, WaitForChangeTimesOut) {
  FakeDiscovery fake;
  fake.set(hs({{"a", 1}}));
  DiscoveryLoop loop(fake, 1h);
  ASSERT_TRUE(loop.first());
  auto t0 = std::chrono::steady_clock::now();
  auto s = loop.wait_for_change(1, 100ms);
  EXPECT_EQ(s.version, 1);
  EXPECT_GE(since(t0), 0.09);
}

TEST(DiscoveryLoop, PokeRunsDiscoveryNow) {
  FakeDiscovery fake;
  fake.set(hs({{"a", 1}}));
  DiscoveryLoop loop(fake, 1h);
  ASSERT_TRUE(loop.first());
  loop.start();
  fake.set(hs({{"a", 1}, {"b", 1}}));
  loop.poke();
  auto s = loop.wait_for_change(1, 10s);
  EXPECT_EQ(s.version, 2);
  EXPECT_EQ(fake.calls(), 2);
  loop.stop();
}

TEST(DiscoveryLoop, StartWithoutFirstDiscoversImmediately) {
  FakeDiscovery fake;
  fake.set(hs({{"a", 1}}));
  DiscoveryLoop loop(fake, 1h);
  loop.start();
  auto s = loop.wait_for_change(0, 10s);
  EXPECT_EQ(s.version, 1);
}

TEST(DiscoveryLoop, StopIsPromptWhileSleeping) {
  FakeDiscovery fake;
  DiscoveryLoop loop(fake, 1h);
  ASSERT_TRUE(loop.first());
  loop.start();
  auto t0 = std::chrono::steady_clock::now();
  loop.stop();
  EXPECT_LT(since(t0), 2.0);
  int c = fake.calls();
  loop.poke();  // no thread any more: nothing runs
  EXPECT_EQ(fake.calls(), c);
}

TEST(DiscoveryLoop, DestructorStops) {
  FakeDiscovery fake;
  auto t0 = std::chrono::steady_clock::now();
  {
    DiscoveryLoop loop(fake, 1h);
    loop.start();
  }
  EXPECT_LT(since(t0), 2.0);
}

TEST(DiscoveryLoop, StopWhileScriptHangsWaitsAtMostItsTimeout) {
  TempDir dir;
  auto script = dir.write("d.sh", "#!/bin/sh\necho $$ > " + dir.file("main.pid") +
                                      "\nsleep 1000\n");
  ScriptDiscovery d(script, 1500ms, 1);
  DiscoveryLoop loop(d, 1ms);
  loop.start();
  ASSERT_TRUE(wait_until([&] { return read_pid(dir.file("main.pid")) > 0; }, 10000ms));
  pid_t pid = read_pid(dir.file("main.pid"));
  auto t0 = std::chrono::steady_clock::now();
  loop.stop();
  EXPECT_LT(since(t0), 1.5 + 5.0);
  EXPECT_TRUE(wait_until([&] { return !alive(pid); }, 5000ms));
}

TEST(DiscoveryLoop, WarnsOncePerDistinctErrorAndLogsRecovery) {
  auto previous = spdlog::default_logger();
  std::ostringstream log;
  auto logger = std::make_shared<spdlog::logger>(
      "disc-test", std::make_shared<spdlog::sinks::ostream_sink_mt>(log));
  logger->set_level(spdlog::level::info);
  spdlog::set_default_logger(logger);

  FakeDiscovery fake;
  fake.set(hs({{"a", 1}}));
  {
    DiscoveryLoop loop(fake, 1ms);
    ASSERT_TRUE(loop.first());
    loop.start();
    fake.set_error("error one");
    wait_applied(fake, fake.calls() + 4);
    fake.set_error("error two");
    wait_applied(fake, fake.calls() + 4);
    fake.set(hs({{"a", 1}}));
    wait_applied(fake, fake.calls() + 2);
    loop.stop();
  }
  spdlog::set_default_logger(previous);
  auto text = log.str();
  auto count = [&](const std::string& needle) {
    size_t n = 0;
    for (auto pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("error one"), 1u) << text;
  EXPECT_EQ(count("error two"), 1u) << text;
  EXPECT_EQ(count("works again"), 1u) << text;
}

}  // namespace
}  // namespace erun
