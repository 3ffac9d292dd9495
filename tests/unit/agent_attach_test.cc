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

namespace erun::agent {
namespace {

using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;

constexpr const char* kSecret = "attach-test-secret";

bool alive(pid_t pid) { return pid > 0 && ::kill(pid, 0) == 0; }

bool wait_gone(pid_t pid, Duration limit) {
  auto deadline = SteadyClock::now() + limit;
  while (alive(pid)) {
    if (SteadyClock::now() > deadline) return false;
    std::this_thread::sleep_for(20ms);
  }
  return true;
}

// One end of a driver channel: frames written to `in`, read from `out`.
class Channel {
 public:
  Channel(int in, int out) : in_(in), out_(out) {}
  ~Channel() { close(); }
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  void close() {
    close_fd(in_);
    close_fd(out_);
  }
  bool write_all(std::string_view data) {
    while (!data.empty()) {
      ssize_t n = ::write(in_, data.data(), data.size());
      if (n <= 0) return false;
      data.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }
  bool send(const Message& m) { return write_all(encode(m)); }

  // Reads until a frame of type T (matching `pred`) arrives; nullopt at EOF
  // or after `limit`. Every frame read is kept.
  template <typename T, typename Pred>
  std::optional<T> wait_match(Pred pred, Duration limit = 10s) {
    auto deadline = SteadyClock::now() + limit;
    while (true) {
      for (; checked_ < seen_.size(); ++checked_) {
        if (auto* m = std::get_if<T>(&seen_[checked_]); m && pred(*m)) return *m;
      }
      if (eof_) return std::nullopt;
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now()).count();
      if (left <= 0) return std::nullopt;
      pollfd p{out_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
      char chunk[65536];
      ssize_t n = ::read(out_, chunk, sizeof chunk);
      if (n <= 0) {
        eof_ = true;
        continue;
      }
      reader_.feed(std::string_view(chunk, static_cast<size_t>(n)));
      while (true) {
        auto m = reader_.next();
        EXPECT_TRUE(m.is_ok()) << m.message();
        if (!m.is_ok() || !m->has_value()) break;
        seen_.push_back(std::move(**m));
      }
    }
  }
  template <typename T>
  std::optional<T> wait_for(Duration limit = 10s) {
    return wait_match<T>([](const T&) { return true; }, limit);
  }
  // True once the other side closed (within `limit`).
  bool wait_eof(Duration limit) {
    wait_match<Shutdown>([](const Shutdown&) { return false; }, limit);
    return eof_;
  }
  std::string output(uint64_t id) const {
    std::string all;
    for (auto& m : seen_) {
      if (auto* o = std::get_if<Output>(&m); o && o->id == id) all += o->data;
    }
    return all;
  }
  const std::vector<Message>& seen() const { return seen_; }

 private:
  int in_, out_;
  FrameReader reader_;
  std::vector<Message> seen_;
  size_t checked_ = 0;
  bool eof_ = false;
};

// A child process running `body(in_fd, out_fd)` on two pipes; the test holds
// the other ends as a Channel.
struct Child {
  pid_t pid = -1;
  std::unique_ptr<Channel> channel;

  Child() = default;
  Child(Child&& o) noexcept : pid(std::exchange(o.pid, -1)), channel(std::move(o.channel)) {}
  Child& operator=(Child&& o) noexcept {
    std::swap(pid, o.pid);
    std::swap(channel, o.channel);
    return *this;
  }

  template <typename Body>
  static Child fork_with_pipes(Body body) {
    int to[2], from[2];
    EXPECT_EQ(::pipe2(to, O_CLOEXEC), 0);
    EXPECT_EQ(::pipe2(from, O_CLOEXEC), 0);
    Child c;
    c.pid = ::fork();
    if (c.pid == 0) {
      ::close(to[1]);
      ::close(from[0]);
      ::_exit(body(to[0], from[1]));
    }
    ::close(to[0]);
    ::close(from[1]);
    c.channel = std::make_unique<Channel>(to[1], from[0]);
    return c;
  }
  // The exit code once it ended within `limit`, else -1.
  int wait(Duration limit) {
    auto deadline = SteadyClock::now() + limit;
    while (SteadyClock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        pid = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(20ms);
    }
    return -1;
  }
  ~Child() {
    if (channel) channel->close();
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
};

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

  // A new driver: `erun --agent --attach` forked, sent `secret` and ATTACH.
  Child attach(const std::string& secret, uint64_t term) {
    std::string path = attach_path_;
    Child c = Child::fork_with_pipes([path](int in, int out) { return run_attach_pump(path, in, out); });
    EXPECT_TRUE(c.channel->write_all(secret + "\n"));
    EXPECT_TRUE(c.channel->send(Attach{term, "", 0}));
    return c;
  }

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
