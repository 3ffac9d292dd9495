// The agent's own logic (agent_internal.h's Agent, the code `erun --agent`
// runs) on a fake Env (agent_fake_env.h): no process, signal or file is
// real, and time moves only when the agent would wait. The test speaks the
// driver's side of the channel and scripts the host's events: a worker
// exits, the driver's connection closes, a SIGTERM arrives, time passes.
// agent_workers_test and the integration tests run the same agent with real
// processes.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>

#include "agent/agent_internal.h"
#include "agent_fake_env.h"

namespace erun::agent {
namespace {

using testing::FakeAgentEnv;
using namespace std::chrono_literals;

constexpr int kExitCode3 = 3 << 8;  // wait statuses, as waitpid() gives them
constexpr int kKilledByTerm = SIGTERM;

// The agent on a fake Env, and the driver's ends of its channel.
class Harness {
 public:
  explicit Harness(AgentOptions o) {
    auto [agent_in, to_agent] = env.make_pipe();
    auto [from_agent, agent_out] = env.make_pipe();
    to_agent_ = to_agent;
    from_agent_ = from_agent;
    o.in_fd = agent_in;
    o.out_fd = agent_out;
    o.host = "hostA";
    agent = std::make_unique<internal::Agent>(o, env);
    (void)env.write(to_agent_, "job-secret\n");
  }

  void send(const Message& m) { (void)env.write(to_agent_, encode(m)); }
  // The driver goes: its end of the channel closes (erun killed, ssh cut).
  void close_driver() { env.close_fd(to_agent_); }

  // Steps the agent until `done` holds (true) or it ended or `limit` of its
  // time passed (false). With `heartbeats`, the driver says HEARTBEAT every
  // second of that time.
  bool step_until(const std::function<bool()>& done, Duration limit, bool heartbeats = true) {
    const TimePoint end = env.now() + limit;
    // A bound on the rounds too: an agent whose poll always finds something
    // ready would never let the fake time pass.
    for (int round = 0; round < 100000; ++round) {
      read_frames();
      if (done()) return true;
      if (env.now() >= end || !running) return false;
      if (heartbeats && to_agent_ >= 0 && env.now() - last_heartbeat_ >= 1s) {
        send(Heartbeat{});
        last_heartbeat_ = env.now();
      }
      running = agent->step();
    }
    ADD_FAILURE() << "the agent's loop never waited";
    return false;
  }
  // Steps the agent through `d` of its time.
  void pass(Duration d, bool heartbeats = true) {
    const TimePoint end = env.now() + d;
    (void)step_until([&] { return env.now() >= end; }, d + 1s, heartbeats);
  }

  template <typename T>
  std::vector<T> received() {
    read_frames();
    std::vector<T> out;
    for (const Message& m : frames_) {
      if (auto* t = std::get_if<T>(&m)) out.push_back(*t);
    }
    return out;
  }
  template <typename T>
  bool got() {
    return !received<T>().empty();
  }
  // Steps until the driver got a T.
  template <typename T>
  bool step_until_got(Duration limit = 1s) {
    return step_until([&] { return got<T>(); }, limit);
  }
  // Steps until a signal went to worker `pid`'s session.
  bool step_until_signalled(pid_t pid, Duration limit, bool heartbeats = true) {
    return step_until([&] { return !env.signals_to(-pid).empty(); }, limit, heartbeats);
  }
  // begin(), then worker 1 started; its pid.
  pid_t begin_with_worker(const std::string& commit_dir = "") {
    EXPECT_TRUE(agent->begin());
    return start_worker(1, commit_dir);
  }

  // Starts worker `id` (rank id - 1) with ERUN_COMMIT_DIR=`commit_dir`; its pid.
  pid_t start_worker(uint64_t id, const std::string& commit_dir = "") {
    Start s;
    s.id = id;
    s.generation = 1;
    s.rank = static_cast<int32_t>(id - 1);
    s.argv = {"/usr/bin/train"};
    s.cwd = "/";
    if (!commit_dir.empty()) s.env.push_back({"ERUN_COMMIT_DIR", commit_dir});
    send(s);
    EXPECT_TRUE(step_until([&] { return started(id) != 0; }, 1s));
    return started(id);
  }
  pid_t started(uint64_t id) {
    for (const Started& s : received<Started>()) {
      if (s.id == id) return static_cast<pid_t>(s.pid);
    }
    return 0;
  }

  FakeAgentEnv env;
  std::unique_ptr<internal::Agent> agent;
  bool running = true;

 private:
  void read_frames() {
    if (from_agent_ < 0) return;
    reader_.feed(env.take(from_agent_));
    while (true) {
      auto m = reader_.next();
      if (!m || !m->has_value()) return;
      frames_.push_back(std::move(**m));
    }
  }

  int to_agent_ = -1, from_agent_ = -1;
  TimePoint last_heartbeat_{};
  FrameReader reader_;
  std::vector<Message> frames_;
};

AgentOptions options() {
  AgentOptions o;
  o.heartbeat_timeout = 5s;
  return o;
}

// With --drain-timeout: SIGTERM is a notice to leave.
AgentOptions draining() {
  AgentOptions o = options();
  o.drain_timeout = 60s;
  return o;
}

TEST(AgentEnv, BeginsWithHelloAndTheWatchdog) {
  Harness h(options());
  ASSERT_TRUE(h.agent->begin());
  ASSERT_TRUE(h.step_until([&] { return h.got<Hello>(); }, 1s));
  EXPECT_EQ(h.received<Hello>()[0].host, "hostA");
  EXPECT_EQ(h.received<Hello>()[0].pid, 4242);
  EXPECT_EQ(h.env.helpers, std::vector<std::string>{"watchdog"});
  EXPECT_TRUE(h.env.processes.empty());
}

TEST(AgentEnv, AWorkersExitIsReportedWithItsStatusAndLastStderrLines) {
  Harness h(options());
  ASSERT_TRUE(h.agent->begin());
  const pid_t first = h.start_worker(1);
  const pid_t second = h.start_worker(2);
  ASSERT_NE(first, 0);
  ASSERT_NE(second, 0);
  ASSERT_EQ(h.env.processes.size(), 2u);
  EXPECT_EQ(h.env.process(first).options.argv, std::vector<std::string>{"/usr/bin/train"});
  EXPECT_TRUE(h.env.process(first).options.new_session);

  (void)h.env.write(h.env.process(first).err_w, "step 7\nloss is nan\n");
  h.env.exit(first, kExitCode3);
  ASSERT_TRUE(h.step_until_got<Exited>());
  Exited e = h.received<Exited>()[0];
  EXPECT_EQ(e.id, 1u);
  EXPECT_EQ(e.code, 3);
  EXPECT_EQ(e.signal, 0);
  EXPECT_EQ(e.stderr_tail, (std::vector<std::string>{"step 7", "loss is nan"}));
  // The rest of its session goes with it; the watchdog forgets it.
  EXPECT_EQ(h.env.signals_to(-first), std::vector<int>{SIGKILL});
  EXPECT_NE(h.env.watchdog_lines().find(fmt::format("R {}\n", first)), std::string::npos);

  h.env.exit(second, SIGKILL);
  ASSERT_TRUE(h.step_until([&] { return h.received<Exited>().size() == 2; }, 1s));
  e = h.received<Exited>()[1];
  EXPECT_EQ(e.id, 2u);
  EXPECT_EQ(e.signal, SIGKILL);
  EXPECT_TRUE(h.running);  // the agent waits for the driver's next word
}

// A watchdog that ends is replaced, and the new one has the workers and
// the directories in its channel before it runs: an agent killed right
// after starting it would otherwise leave a watchdog that knows nothing.
TEST(AgentEnv, ANewWatchdogStartsKnowingTheWorkersAndTheDirectories) {
  Harness h(options());
  const pid_t pid = h.begin_with_worker("/dev/shm/erun-job-test");
  ASSERT_NE(pid, 0);
  ASSERT_EQ(h.env.watchdog_starts.size(), 1u);
  h.env.end_watchdog();
  h.pass(10ms);
  ASSERT_EQ(h.env.watchdog_starts.size(), 2u) << "no new watchdog";
  const std::string& first = h.env.watchdog_starts.back();
  EXPECT_NE(first.find(fmt::format("A {} ", pid)), std::string::npos) << first;
  EXPECT_NE(first.find("C /dev/shm/erun-job-test\n"), std::string::npos) << first;
  EXPECT_NE(first.find("G "), std::string::npos) << first;
}

TEST(AgentEnv, ALostDriversWorkersRunThroughTheGraceThenStopAndTheHostMemoryGoes) {
  AgentOptions o = options();
  o.driver_grace = 30s;
  Harness h(o);
  h.send(Recorded{});  // a job record names this agent: a new driver could find it
  const pid_t pid = h.begin_with_worker("/dev/shm/erun-job-test");
  ASSERT_NE(pid, 0);
  EXPECT_EQ(h.env.held_dirs, std::vector<std::string>{"/dev/shm/erun-job-test"});
  (void)h.env.watchdog_lines();

  h.close_driver();
  const TimePoint lost = h.env.now();
  h.pass(100ms, /*heartbeats=*/false);
  EXPECT_TRUE(h.env.stderr_detached);  // the driver's stderr is let go
  EXPECT_NE(h.env.watchdog_lines().find("G 30000\n"), std::string::npos);  // keep the memory that long

  // Through the grace, the worker runs on and nothing is removed.
  h.pass(29s, /*heartbeats=*/false);
  EXPECT_TRUE(h.env.signals_to(-pid).empty());
  EXPECT_TRUE(h.env.released_dirs.empty());
  EXPECT_TRUE(h.running);

  // Then no driver took the job over: the worker is stopped.
  ASSERT_TRUE(h.step_until_signalled(pid, 2s, false));
  EXPECT_GE(h.env.now() - lost, 30s);
  EXPECT_EQ(h.env.signals_to(-pid), std::vector<int>{SIGTERM});
  h.env.exit(pid, kKilledByTerm);
  EXPECT_FALSE(h.step_until([] { return false; }, 10s, false));
  EXPECT_FALSE(h.running);
  h.agent->finish();
  EXPECT_EQ(h.agent->exit_code(), 1);
  EXPECT_EQ(h.env.released_dirs, std::vector<std::string>{"/dev/shm/erun-job-test"});
  EXPECT_NE(std::find(h.env.removed.begin(), h.env.removed.end(), "/tmp/erun-agent-000001/attach"),
            h.env.removed.end());
}

TEST(AgentEnv, ALostDriverWithoutGraceStopsTheWorkersAtOnce) {
  Harness h(options());
  const pid_t pid = h.begin_with_worker("/dev/shm/erun-job-test");
  h.close_driver();
  ASSERT_TRUE(h.step_until_signalled(pid, 1s, false));
  EXPECT_EQ(h.env.signals_to(-pid), std::vector<int>{SIGTERM});
  EXPECT_FALSE(h.env.stderr_detached);
  // Past the worker's grace (5 s), SIGKILL.
  ASSERT_TRUE(h.step_until([&] { return h.env.signals_to(-pid).size() == 2; }, 6s, false));
  EXPECT_EQ(h.env.signals_to(-pid)[1], SIGKILL);
  h.env.exit(pid, SIGKILL);
  EXPECT_FALSE(h.step_until([] { return false; }, 5s, false));
  h.agent->finish();
  EXPECT_EQ(h.env.released_dirs, std::vector<std::string>{"/dev/shm/erun-job-test"});
}

TEST(AgentEnv, ADrainNoticeSaysDrainingAndKeepsTheWorkersUntilTold) {
  Harness h(draining());
  const pid_t pid = h.begin_with_worker();
  const int ctl = h.env.process(pid).ctl;
  ASSERT_GE(ctl, 0);  // the worker's control socket, with --drain-timeout

  h.env.raise(SIGTERM);
  ASSERT_TRUE(h.step_until_got<Draining>());
  EXPECT_EQ(h.received<Draining>()[0].reason, "SIGTERM to the agent");

  // The worker leaves at its next commit, as the driver decides: until the
  // driver says so, it is not signalled, and the agent stays.
  h.pass(30s);
  EXPECT_TRUE(h.env.signals_to(-pid).empty());
  EXPECT_TRUE(h.running);
  EXPECT_TRUE(h.received<Exited>().empty());

  h.send(Terminate{1});
  ASSERT_TRUE(h.step_until_signalled(pid, 1s));
  EXPECT_EQ(h.env.signals_to(-pid), std::vector<int>{SIGTERM});
  EXPECT_EQ(h.env.take(ctl), "S");  // a stop on purpose, not another notice

  // Once its workers are gone, the drained agent ends on its own.
  h.env.exit(pid, kKilledByTerm);
  EXPECT_FALSE(h.step_until([] { return false; }, 5s));
  ASSERT_EQ(h.received<Exited>().size(), 1u);
  EXPECT_EQ(h.received<Exited>()[0].signal, SIGTERM);
  h.agent->finish();
  EXPECT_EQ(h.agent->exit_code(), 0);
}

TEST(AgentEnv, AWorkersOwnNoticeDrainsTheHost) {
  Harness h(draining());
  const pid_t pid = h.begin_with_worker();
  (void)h.env.write(h.env.process(pid).ctl, "D");  // its library took a SIGTERM as a notice
  ASSERT_TRUE(h.step_until_got<Draining>());
  EXPECT_NE(h.received<Draining>()[0].reason.find(fmt::format("pid {}", pid)), std::string::npos);
  EXPECT_TRUE(h.env.signals_to(-pid).empty());
}

TEST(AgentEnv, ASecondSigtermStopsAtOnce) {
  Harness h(draining());
  const pid_t pid = h.begin_with_worker();
  h.env.raise(SIGTERM);
  ASSERT_TRUE(h.step_until_got<Draining>());
  h.env.raise(SIGTERM);
  ASSERT_TRUE(h.step_until_signalled(pid, 1s));
  EXPECT_EQ(h.env.signals_to(-pid), std::vector<int>{SIGTERM});
}

}  // namespace
}  // namespace erun::agent
