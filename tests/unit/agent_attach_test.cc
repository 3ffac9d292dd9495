// An agent outlives its driver (--driver-grace): a forked child runs the
// agent on pipes, the test plays the driver, then drops it (closes the
// pipes, as a SIGKILLed erun does). The real /bin/sh worker keeps running
// and what it prints meanwhile is held; a new driver that reaches the
// agent's attach socket through `erun --agent --attach` (run_attach_pump,
// forked) with the job secret and a higher term gets HELLO, STATE and the
// held output, provided its driver had told it RECORDED (the job record
// names it); one no record names stops its workers with its driver. A wrong secret or a term not above the agent's is refused
// and changes nothing; a driver still attached hears SUPERSEDED and loses
// its channel, not its workers; with no driver within the grace, the
// workers stop and the socket's directory goes.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "agent/agent.h"
#include "agent/protocol.h"
#include "common/subprocess.h"
#include "support/agent_child.h"

namespace erun::agent {
namespace {

using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;
using testing::alive;
using testing::Channel;
using testing::Child;
using testing::wait_gone;

constexpr const char* kSecret = "attach-test-secret";

class AgentAttach : public ::testing::Test {
 protected:
  // The agent, with a worker that prints "before", then (after `pause`
  // seconds) "during", then sleeps; its HELLO and STARTED read.
  void start(Duration grace, const std::string& pause = "1", bool recorded = true) {
    agent_ = Child::fork_with_pipes([grace](int in, int out) {
      AgentOptions o;
      o.in_fd = in;
      o.out_fd = out;
      o.host = "testhost";
      o.heartbeat_timeout = 30s;
      o.driver_grace = grace;
      return run_agent(o);
    });
    Channel& ch = *agent_.channel;
    ASSERT_TRUE(ch.write_all(std::string(kSecret) + "\n"));
    auto hello = ch.wait_for<Hello>();
    ASSERT_TRUE(hello);
    attach_path_ = hello->attach_path;
    ASSERT_FALSE(attach_path_.empty());
    struct stat st {};
    ASSERT_EQ(::lstat(attach_path_.c_str(), &st), 0);
    EXPECT_TRUE(S_ISSOCK(st.st_mode));
    ASSERT_EQ(::lstat(std::filesystem::path(attach_path_).parent_path().c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u) << "the attach socket's directory is private";
    if (recorded) {
      ASSERT_TRUE(ch.send(Recorded{}));  // the driver's record names it
    }
    Start s;
    s.id = 41;
    s.generation = 3;
    s.rank = 1;
    s.slot = 2;
    s.argv = {"/bin/sh", "-c", "echo before; sleep " + pause + "; echo during; exec sleep 300"};
    s.cwd = "/";
    s.term_grace_ms = 1000;
    ASSERT_TRUE(ch.send(s));
    auto started = ch.wait_for<Started>();
    ASSERT_TRUE(started);
    worker_ = static_cast<pid_t>(started->pid);
    ASSERT_TRUE(ch.wait_match<Output>([](const Output& o) { return o.data.find("before") != std::string::npos; }));
  }

  // A driver reaching the agent's socket: `erun --agent --attach` forked,
  // sent `secret` and `first`.
  Child reach(const std::string& secret, const Message& first) {
    std::string path = attach_path_;
    Child c = Child::fork_with_pipes([path](int in, int out) { return run_attach_pump(path, in, out); });
    EXPECT_TRUE(c.channel->write_all(secret + "\n"));
    EXPECT_TRUE(c.channel->send(first));
    return c;
  }
  // A new driver: ATTACH.
  Child attach(const std::string& secret, uint64_t term) { return reach(secret, Attach{term, "", 0}); }
  // A driver that lost this agent and went on without it: RETIRE.
  Child retire(const std::string& secret, uint64_t term) { return reach(secret, Retire{term, "silent for 5001 ms"}); }

  Child agent_;
  std::string attach_path_;
  pid_t worker_ = -1;
};

TEST_F(AgentAttach, WorkersOutliveTheDriverAndANewOneGetsTheirStateAndOutput) {
  ASSERT_NO_FATAL_FAILURE(start(20s));
  agent_.channel->close();  // the driver is gone
  std::this_thread::sleep_for(2s);  // the worker prints "during" meanwhile
  ASSERT_TRUE(alive(worker_)) << "the worker stopped with its driver";

  Child d = attach(kSecret, 2);
  auto hello = d.channel->wait_for<Hello>();
  ASSERT_TRUE(hello) << "no HELLO on the attach connection";
  EXPECT_EQ(hello->attach_path, attach_path_);
  auto st = d.channel->wait_for<State>();
  ASSERT_TRUE(st);
  EXPECT_EQ(st->term, 2u);
  ASSERT_EQ(st->workers.size(), 1u);
  EXPECT_EQ(st->workers[0].id, 41u);
  EXPECT_EQ(st->workers[0].generation, 3);
  EXPECT_EQ(st->workers[0].rank, 1);
  EXPECT_EQ(st->workers[0].slot, 2);
  EXPECT_EQ(st->workers[0].pid, worker_);
  EXPECT_FALSE(st->workers[0].exited);
  // The line printed while no driver was there.
  ASSERT_TRUE(d.channel->wait_match<Output>([](const Output& o) { return o.data.find("during") != std::string::npos; }))
      << "the output printed without a driver was lost";
  // The new driver drives: a signal reaches the worker, its EXITED comes.
  ASSERT_TRUE(d.channel->send(Signal{41, SIGKILL}));
  auto ex = d.channel->wait_match<Exited>([](const Exited& e) { return e.id == 41; });
  ASSERT_TRUE(ex);
  EXPECT_EQ(ex->signal, SIGKILL);
  ASSERT_TRUE(d.channel->send(Shutdown{}));
  EXPECT_EQ(agent_.wait(10s), 0);
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(attach_path_).parent_path()));
}

TEST_F(AgentAttach, WrongSecretAndStaleTermAreRefusedAndChangeNothing) {
  ASSERT_NO_FATAL_FAILURE(start(20s));
  agent_.channel->close();
  {
    Child bad = attach("not-the-secret", 7);
    EXPECT_TRUE(bad.channel->wait_eof(10s)) << "a wrong secret was not turned away";
    EXPECT_FALSE(bad.channel->wait_for<State>(100ms));
    EXPECT_FALSE(bad.channel->wait_for<Hello>(100ms));
  }
  {
    Child stale = attach(kSecret, 1);  // the first driver's own term
    auto no = stale.channel->wait_for<Superseded>();
    ASSERT_TRUE(no) << "a term not above the agent's was not refused";
    EXPECT_EQ(no->term, 1u);
    EXPECT_FALSE(stale.channel->wait_for<State>(100ms));
  }
  ASSERT_TRUE(alive(worker_));
  Child good = attach(kSecret, 2);
  auto st = good.channel->wait_for<State>();
  ASSERT_TRUE(st);
  EXPECT_EQ(st->workers.size(), 1u);
}

TEST_F(AgentAttach, ALiveDriverIsSupersededAndLosesItsChannelNotItsWorkers) {
  ASSERT_NO_FATAL_FAILURE(start(20s));
  Child next = attach(kSecret, 5);
  auto told = agent_.channel->wait_for<Superseded>();
  ASSERT_TRUE(told) << "the old driver was not told";
  EXPECT_EQ(told->term, 5u);
  EXPECT_TRUE(agent_.channel->wait_eof(10s));
  ASSERT_TRUE(next.channel->wait_for<State>());
  EXPECT_TRUE(alive(worker_));
  // A third driver with a lower term than the second is refused.
  Child older = attach(kSecret, 4);
  auto no = older.channel->wait_for<Superseded>();
  ASSERT_TRUE(no);
  EXPECT_EQ(no->term, 5u);
  EXPECT_TRUE(alive(worker_));
}

TEST_F(AgentAttach, NoDriverWithinTheGraceStopsEverything) {
  ASSERT_NO_FATAL_FAILURE(start(1s, "0"));
  agent_.channel->close();
  EXPECT_TRUE(wait_gone(worker_, 10s)) << "the worker outlived the grace";
  EXPECT_EQ(agent_.wait(15s), 1);
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(attach_path_).parent_path()));
}

TEST_F(AgentAttach, AnAgentNoRecordNamesStopsItsWorkersWithTheDriver) {
  // Its driver died before recording it: no new driver could find it, so
  // its workers must not run on unowned.
  ASSERT_NO_FATAL_FAILURE(start(20s, "0", /*recorded=*/false));
  agent_.channel->close();
  EXPECT_TRUE(wait_gone(worker_, 10s)) << "an agent no record names kept its workers";
  EXPECT_EQ(agent_.wait(15s), 1);
}

TEST_F(AgentAttach, WithoutAGraceTheWorkersStopWithTheDriver) {
  agent_ = Child::fork_with_pipes([](int in, int out) {
    AgentOptions o;
    o.in_fd = in;
    o.out_fd = out;
    o.host = "testhost";
    return run_agent(o);
  });
  ASSERT_TRUE(agent_.channel->write_all(std::string(kSecret) + "\n"));
  auto hello = agent_.channel->wait_for<Hello>();
  ASSERT_TRUE(hello);
  EXPECT_TRUE(hello->attach_path.empty()) << "no attach socket without --driver-grace";
  Start s;
  s.id = 1;
  s.argv = {"/bin/sh", "-c", "exec sleep 300"};
  s.cwd = "/";
  ASSERT_TRUE(agent_.channel->send(s));
  auto started = agent_.channel->wait_for<Started>();
  ASSERT_TRUE(started);
  agent_.channel->close();
  EXPECT_TRUE(wait_gone(static_cast<pid_t>(started->pid), 10s));
  EXPECT_EQ(agent_.wait(15s), 1);
}

}  // namespace
}  // namespace erun::agent

namespace erun::agent {
namespace {

// Its driver lost it (a partition) and went on without its workers, which it
// holds for --driver-grace. Reached again, it is told RETIRE by that driver
// (its own term): it answers, stops its worker at once (not after the grace)
// and ends, its attach socket's directory gone.
TEST_F(AgentAttach, ARetiredAgentStopsItsHeldWorkersAtOnceAndEnds) {
  ASSERT_NO_FATAL_FAILURE(start(60s, "0"));
  agent_.channel->close();  // the channel breaks (the driver killed its ssh)
  std::this_thread::sleep_for(300ms);
  ASSERT_TRUE(alive(worker_)) << "held for the grace";
  Child r = retire(kSecret, 1);
  auto yes = r.channel->wait_for<Retired>();
  ASSERT_TRUE(yes) << "no RETIRED";
  EXPECT_EQ(yes->workers, 1u);
  EXPECT_TRUE(wait_gone(worker_, 5s)) << "the worker outlived its retirement";
  EXPECT_EQ(agent_.wait(10s), 1);
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(attach_path_).parent_path()));
}

// The agent never saw its channel break (its driver only fell silent to it):
// a RETIRE still ends it.
TEST_F(AgentAttach, AnAgentStillAttachedIsRetiredToo) {
  ASSERT_NO_FATAL_FAILURE(start(60s, "0"));
  Child r = retire(kSecret, 1);
  ASSERT_TRUE(r.channel->wait_for<Retired>());
  EXPECT_TRUE(wait_gone(worker_, 5s));
  EXPECT_EQ(agent_.wait(10s), 1);
}

// A RETIRE with a wrong secret, or from a driver older than the one the
// agent obeys now (a newer one took the job over), changes nothing.
TEST_F(AgentAttach, ARetireWithAWrongSecretOrAnOldTermIsRefused) {
  ASSERT_NO_FATAL_FAILURE(start(60s, "0"));
  agent_.channel->close();
  {
    Child bad = retire("not-the-secret", 1);
    EXPECT_TRUE(bad.channel->wait_eof(10s));
    EXPECT_FALSE(bad.channel->wait_for<Retired>(100ms));
  }
  Child next = attach(kSecret, 3);
  ASSERT_TRUE(next.channel->wait_for<State>());
  {
    Child old = retire(kSecret, 2);
    auto no = old.channel->wait_for<Superseded>();
    ASSERT_TRUE(no) << "an older driver's RETIRE was not refused";
    EXPECT_EQ(no->term, 3u);
    EXPECT_FALSE(old.channel->wait_for<Retired>(100ms));
  }
  EXPECT_TRUE(alive(worker_));
  // The driver that holds it now may retire it.
  Child same = retire(kSecret, 3);
  ASSERT_TRUE(same.channel->wait_for<Retired>());
  EXPECT_TRUE(wait_gone(worker_, 5s));
}

}  // namespace
}  // namespace erun::agent
