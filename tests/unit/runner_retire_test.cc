// AgentRetirer against a real agent (forked, on pipes, the test as its first
// driver) that holds its worker through --driver-grace after losing that
// driver: the retirer's tries fail as an unreachable host's would (a process
// that says what ssh says and exits 255) or hang (a host whose sshd is
// stopped) until the host "comes back", then one reaches the agent's attach
// socket and the worker stops. An agent already gone needs no retiring; a
// host never back is reported when the job ends.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <string>

#include "agent/agent.h"
#include "agent/protocol.h"
#include "common/net.h"
#include "runner/launch/agent_retirer.h"
#include "support/agent_child.h"
#include "support/erun_process.h"

namespace erun {
namespace {

using namespace std::chrono_literals;
using agent::testing::alive;
using agent::testing::Child;
using agent::testing::wait_gone;

constexpr const char* kSecret = "retire-test-secret";

// An agent that lost its driver and holds one worker (`sleep 300`).
struct HeldAgent {
  Child agent;
  std::string attach_path;
  pid_t worker = -1;

  void start() {
    agent = Child::fork_with_pipes([](int in, int out) {
      agent::AgentOptions o;
      o.in_fd = in;
      o.out_fd = out;
      o.host = "testhost";
      o.heartbeat_timeout = 30s;
      o.driver_grace = 60s;
      return agent::run_agent(o);
    });
    auto& ch = *agent.channel;
    ASSERT_TRUE(ch.write_all(std::string(kSecret) + "\n"));
    auto hello = ch.wait_for<agent::Hello>();
    ASSERT_TRUE(hello);
    attach_path = hello->attach_path;
    ASSERT_TRUE(ch.send(agent::Recorded{}));
    agent::Start s;
    s.id = 1;
    s.argv = {"/bin/sh", "-c", "exec sleep 300"};
    s.cwd = "/";
    s.term_grace_ms = 1000;
    ASSERT_TRUE(ch.send(s));
    auto started = ch.wait_for<agent::Started>();
    ASSERT_TRUE(started);
    worker = static_cast<pid_t>(started->pid);
    ch.close();  // its driver is gone for it
    std::this_thread::sleep_for(200ms);
    ASSERT_TRUE(alive(worker));
  }
};

// The socket on this machine, as the local launcher's tries reach it.
Result<Subprocess> connect_to(const std::string& path) {
  using R = Result<Subprocess>;
  net::Address a;
  if (!net::unix_address(path, &a)) return R::error("bad path");
  net::Socket s = net::connect_unix(a, std::chrono::steady_clock::now() + 2s);
  if (!s.ok()) return R::error(s.outcome.text());
  int in = ::dup(s.fd.get());
  return R(Subprocess::channel(in, s.fd.release()));
}

Result<Subprocess> spawn_sh(const std::string& script) {
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", script};
  o.pipe_stdin = true;
  o.pipe_stdout = true;
  o.pipe_stderr = true;
  return Subprocess::spawn(o);
}

AgentRetirer::Options fast() {
  AgentRetirer::Options o;
  o.try_limit = 1s;
  o.first_gap = 100ms;
  o.tick = 20ms;
  return o;
}

TEST(AgentRetirer, KeepsTryingAnUnreachableHostAndRetiresTheAgentOnceItIsBack) {
  HeldAgent held;
  ASSERT_NO_FATAL_FAILURE(held.start());
  std::atomic<int> tries{0};
  std::atomic<bool> back{false};
  AgentRetirer r(
      [&](const std::string& host, const std::string& path) -> Result<Subprocess> {
        EXPECT_EQ(host, "node-b");
        ++tries;
        if (!back) return spawn_sh("echo 'ssh: connect to host node-b port 22: No route to host' >&2; exit 255");
        return connect_to(path);
      },
      fast());
  r.set_driver(kSecret, 1);
  r.add("node-b", held.attach_path, "silent for 5001 ms");
  r.add("node-b", held.attach_path, "twice");  // the same agent: one entry
  std::this_thread::sleep_for(1500ms);
  EXPECT_GE(tries.load(), 3) << "it stopped trying";
  EXPECT_EQ(r.left(), 1u);
  EXPECT_EQ(r.last_outcome(held.attach_path), AgentRetirer::Outcome::kUnreachable);
  EXPECT_TRUE(alive(held.worker));
  back = true;
  const auto back_at = std::chrono::steady_clock::now();
  EXPECT_TRUE(wait_gone(held.worker, 5s)) << "the held worker outlived the host's return";
  EXPECT_LT(std::chrono::steady_clock::now() - back_at, 3s);
  // The answer is read at the retirer's next look (the worker may stop first).
  for (int i = 0; i < 100 && r.left() > 0; ++i) std::this_thread::sleep_for(20ms);
  EXPECT_EQ(r.last_outcome(held.attach_path), AgentRetirer::Outcome::kRetired);
  EXPECT_EQ(r.left(), 0u);
  EXPECT_EQ(held.agent.wait(10s), 1);
  EXPECT_EQ(r.finish(1s), 0u);
}

// A try that hangs (sshd stopped: the TCP connection opens, nothing answers)
// is killed at its limit and tried again.
TEST(AgentRetirer, ATryThatHangsIsKilledAtItsLimitAndTriedAgain) {
  HeldAgent held;
  ASSERT_NO_FATAL_FAILURE(held.start());
  std::atomic<int> tries{0};
  AgentRetirer r(
      [&](const std::string&, const std::string& path) -> Result<Subprocess> {
        if (++tries == 1) return spawn_sh("exec sleep 100");
        return connect_to(path);
      },
      fast());
  r.set_driver(kSecret, 1);
  r.add("node-b", held.attach_path, "silent");
  EXPECT_TRUE(wait_gone(held.worker, 6s));
  for (int i = 0; i < 100 && r.left() > 0; ++i) std::this_thread::sleep_for(20ms);
  EXPECT_EQ(tries.load(), 2);
  EXPECT_EQ(r.last_outcome(held.attach_path), AgentRetirer::Outcome::kRetired);
}

// An agent that ended meanwhile (its socket refuses, or `erun --agent
// --attach` exits 1): nothing to retire, no more tries.
TEST(AgentRetirer, AnAgentAlreadyGoneIsDone) {
  testing::TempDir dir;
  std::atomic<int> tries{0};
  AgentRetirer r(
      [&](const std::string&, const std::string& path) -> Result<Subprocess> {
        ++tries;
        return connect_to(path);
      },
      fast());
  r.set_driver(kSecret, 1);
  r.add("node-b", dir.file("attach"), "silent");
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ(r.left(), 0u);
  EXPECT_EQ(tries.load(), 1);
  EXPECT_EQ(r.last_outcome(dir.file("attach")), AgentRetirer::Outcome::kGone);

  AgentRetirer pump([&](const std::string&, const std::string&) { return spawn_sh("exit 1"); }, fast());
  pump.set_driver(kSecret, 1);
  pump.add("node-c", "/nowhere/attach", "silent");
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ(pump.left(), 0u);
  EXPECT_EQ(pump.last_outcome("/nowhere/attach"), AgentRetirer::Outcome::kGone);
}

// A newer driver holds the agent: the old one's RETIRE is refused, and it
// stops trying.
TEST(AgentRetirer, AnAgentANewerDriverHoldsIsLeftAlone) {
  HeldAgent held;
  ASSERT_NO_FATAL_FAILURE(held.start());
  {
    std::string path = held.attach_path;
    Child next = Child::fork_with_pipes([path](int in, int out) { return agent::run_attach_pump(path, in, out); });
    ASSERT_TRUE(next.channel->write_all(std::string(kSecret) + "\n"));
    ASSERT_TRUE(next.channel->send(agent::Attach{4, "", 0}));
    ASSERT_TRUE(next.channel->wait_for<agent::State>());
    AgentRetirer r([&](const std::string&, const std::string& p) { return connect_to(p); }, fast());
    r.set_driver(kSecret, 2);
    r.add("node-b", held.attach_path, "silent");
    std::this_thread::sleep_for(500ms);
    EXPECT_EQ(r.left(), 0u);
    EXPECT_EQ(r.last_outcome(held.attach_path), AgentRetirer::Outcome::kSuperseded);
    EXPECT_TRUE(alive(held.worker));
  }
}

// The job ends while the host is still cut off: finish() gives up after its
// limit and says how many agents it could not reach.
TEST(AgentRetirer, AHostNeverBackIsLeftWhenTheJobEnds) {
  AgentRetirer r([&](const std::string&, const std::string&) { return spawn_sh("exit 255"); }, fast());
  r.set_driver(kSecret, 1);
  r.add("node-b", "/x/attach", "silent");
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(r.finish(600ms), 1u);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  r.add("node-c", "/y/attach", "after the end");  // ignored: it stopped
  EXPECT_EQ(r.left(), 1u);
}

}  // namespace
}  // namespace erun
