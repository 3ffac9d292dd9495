// The agent with real worker processes: a forked child runs the agent
// (run_agent) on pipes, the test speaks the driver's side of the protocol,
// and real /bin/sh workers write and exit. EXITED carries exactly the
// worker's last stderr lines (the partial last one included) while the same
// bytes are still forwarded as OUTPUT; a process that left the worker's
// session holding its stderr open does not hold EXITED back. With START's
// output directory the agent appends each rank's output to private files on
// its host, across restarts of the rank, and never writes through a link.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <fstream>
#include <sstream>
#include <thread>

#include "agent/agent.h"
#include "agent/protocol.h"
#include "commits/host_commits.h"
#include "commits/replica.h"
#include "common/subprocess.h"

namespace erun::agent {
namespace {

using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;

// An agent in a forked child, and the driver's end of its channel.
class AgentChild {
 public:
  AgentChild() {
    int to[2], from[2];
    EXPECT_EQ(::pipe2(to, O_CLOEXEC), 0);
    EXPECT_EQ(::pipe2(from, O_CLOEXEC), 0);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(to[1]);
      ::close(from[0]);
      AgentOptions o;
      o.in_fd = to[0];
      o.out_fd = from[1];
      o.host = "testhost";
      o.heartbeat_timeout = 30s;
      ::_exit(run_agent(o));
    }
    ::close(to[0]);
    ::close(from[1]);
    in_ = to[1];
    out_ = from[0];
    write_all("job-secret\n");
  }

  ~AgentChild() {
    close_fd(in_);
    close_fd(out_);
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }

  void send(const Message& m) { write_all(encode(m)); }

  // Reads frames until one satisfies `want` or the deadline passes; every
  // frame read is kept in seen().
  template <typename T>
  std::optional<T> wait_for(uint64_t id, Duration limit) {
    auto deadline = SteadyClock::now() + limit;
    while (true) {
      for (; checked_ < seen_.size(); ++checked_) {
        if (auto* m = std::get_if<T>(&seen_[checked_]); m && id_of(*m) == id) return *m;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now()).count();
      if (left <= 0) return std::nullopt;
      pollfd p{out_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
      char chunk[65536];
      ssize_t n = ::read(out_, chunk, sizeof chunk);
      if (n <= 0) return std::nullopt;
      reader_.feed(std::string_view(chunk, static_cast<size_t>(n)));
      while (true) {
        auto m = reader_.next();
        EXPECT_TRUE(m.is_ok()) << m.message();
        if (!m.is_ok() || !m->has_value()) break;
        seen_.push_back(std::move(**m));
      }
    }
  }

  // Everything the agent forwarded on one stream of a worker.
  std::string output(uint64_t id, uint8_t stream) const {
    std::string all;
    for (auto& m : seen_) {
      if (auto* o = std::get_if<Output>(&m); o && o->id == id && o->stream == stream) all += o->data;
    }
    return all;
  }

  // SHUTDOWN, then the agent's exit code (-1 if it did not end in 10 s).
  int shutdown() {
    send(Shutdown{});
    for (int i = 0; i < 200; ++i) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(50ms);
    }
    return -1;
  }

 private:
  static uint64_t id_of(const Exited& m) { return m.id; }
  static uint64_t id_of(const Started& m) { return m.id; }
  static uint64_t id_of(const Hello&) { return 0; }
  static uint64_t id_of(const Keeping&) { return 0; }

  void write_all(std::string_view data) {
    while (!data.empty()) {
      ssize_t n = ::write(in_, data.data(), data.size());
      ASSERT_GT(n, 0);
      data.remove_prefix(static_cast<size_t>(n));
    }
  }

  pid_t pid_ = -1;
  int in_ = -1, out_ = -1;
  FrameReader reader_;
  std::vector<Message> seen_;
  size_t checked_ = 0;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A private temp directory, removed with what is in it.
struct ScratchDir {
  ScratchDir() {
    char tmpl[] = "/tmp/erun-agent-test-XXXXXX";
    path = ::mkdtemp(tmpl) ? tmpl : "";
  }
  ~ScratchDir() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove_all(path, ec);
  }
  std::string path;
};

Start shell_worker(uint64_t id, const std::string& script) {
  Start s;
  s.id = id;
  s.generation = 1;
  s.rank = static_cast<int32_t>(id);
  s.argv = {"/bin/sh", "-c", script};
  s.cwd = "/";
  s.term_grace_ms = 1000;
  return s;
}

TEST(AgentExitReport, ExitedCarriesTheLastStderrLinesAndThePartialOne) {
  AgentChild agent;
  ASSERT_TRUE(agent.wait_for<Hello>(0, 20s));
  // 25 lines, then a last one without a newline, with stdout in between.
  agent.send(shell_worker(1, "i=1; while [ $i -le 25 ]; do echo \"error $i\" >&2; echo \"out $i\"; i=$((i+1)); "
                             "done; printf 'last words' >&2; exit 3"));
  auto exited = agent.wait_for<Exited>(1, 20s);
  ASSERT_TRUE(exited);
  EXPECT_EQ(exited->code, 3);
  EXPECT_EQ(exited->signal, 0);
  std::vector<std::string> want;
  for (int i = 7; i <= 25; ++i) want.push_back("error " + std::to_string(i));
  want.push_back("last words");
  EXPECT_EQ(exited->stderr_tail, want);
  // The same bytes were forwarded too, before EXITED.
  std::string err;
  for (int i = 1; i <= 25; ++i) err += "error " + std::to_string(i) + "\n";
  EXPECT_EQ(agent.output(1, 2), err + "last words");
  EXPECT_NE(agent.output(1, 1).find("out 25\n"), std::string::npos);

  // A killed worker reports what it wrote before the signal.
  agent.send(shell_worker(2, "echo 'about to hang' >&2; exec sleep 60"));
  ASSERT_TRUE(agent.wait_for<Started>(2, 20s));
  // Its line is in the pipe once it is forwarded.
  auto forwarded_deadline = SteadyClock::now() + 20s;
  while (agent.output(2, 2).empty() && SteadyClock::now() < forwarded_deadline) (void)agent.wait_for<Exited>(2, 50ms);
  agent.send(Kill{2});
  exited = agent.wait_for<Exited>(2, 20s);
  ASSERT_TRUE(exited);
  EXPECT_EQ(exited->signal, SIGKILL);
  EXPECT_EQ(exited->stderr_tail, std::vector<std::string>{"about to hang"});
  EXPECT_EQ(agent.shutdown(), 0);
}

TEST(AgentExitReport, AnEscapedProcessHoldingStderrDoesNotHoldExitedBack) {
  ScratchDir dir;
  ASSERT_FALSE(dir.path.empty());
  std::string pidfile = dir.path + "/escaped.pid";
  AgentChild agent;
  ASSERT_TRUE(agent.wait_for<Hello>(0, 20s));
  // The escaped process (own session: the agent's SIGKILL of the worker's
  // session misses it) keeps the worker's stderr open for 60 s.
  agent.send(shell_worker(1, "setsid sh -c 'echo $$ > " + pidfile + "; exec sleep 60' & "
                             "while [ ! -s " + pidfile + " ]; do sleep 0.01; done; echo 'bye' >&2; exit 4"));
  ASSERT_TRUE(agent.wait_for<Started>(1, 20s));
  auto started = SteadyClock::now();
  auto exited = agent.wait_for<Exited>(1, 20s);
  double waited = std::chrono::duration<double>(SteadyClock::now() - started).count();
  long escaped = 0;
  std::ifstream(pidfile) >> escaped;
  if (escaped > 1) ::kill(static_cast<pid_t>(escaped), SIGKILL);
  ASSERT_TRUE(exited);
  EXPECT_EQ(exited->code, 4);
  EXPECT_EQ(exited->stderr_tail, std::vector<std::string>{"bye"});
  EXPECT_LT(waited, 10.0) << "EXITED waited for the escaped process's stderr";
  EXPECT_EQ(agent.shutdown(), 0);
}

TEST(AgentOutputFiles, EachRanksOutputIsAppendedOnItsHostAcrossRestarts) {
  ScratchDir dir;
  ASSERT_FALSE(dir.path.empty());
  AgentChild agent;
  ASSERT_TRUE(agent.wait_for<Hello>(0, 20s));
  // Rank 2 twice (a restart: a new id), each time ending in a partial line.
  for (uint64_t id : {1, 2}) {
    Start s = shell_worker(id, "echo \"gen $ERUN_TEST_GEN\"; printf partial; echo \"err $ERUN_TEST_GEN\" >&2; exit 1");
    s.rank = 2;
    s.env = {{"ERUN_TEST_GEN", std::to_string(id)}};
    s.output_dir = dir.path + "/logs";
    agent.send(s);
    auto exited = agent.wait_for<Exited>(id, 20s);
    ASSERT_TRUE(exited);
    EXPECT_EQ(exited->stderr_tail, std::vector<std::string>{"err " + std::to_string(id)});
  }
  EXPECT_EQ(read_file(dir.path + "/logs/rank.2/stdout"), "gen 1\npartialgen 2\npartial");
  EXPECT_EQ(read_file(dir.path + "/logs/rank.2/stderr"), "err 1\nerr 2\n");
  // Forwarded as well.
  EXPECT_EQ(agent.output(2, 1), "gen 2\npartial");
  struct stat st {};
  ASSERT_EQ(::stat((dir.path + "/logs/rank.2/stdout").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  ASSERT_EQ(::stat((dir.path + "/logs/rank.2").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  EXPECT_EQ(agent.shutdown(), 0);
}

TEST(AgentOutputFiles, NeverWritesThroughALinkAndStillForwards) {
  ScratchDir dir;
  ASSERT_FALSE(dir.path.empty());
  const std::string victim = dir.path + "/victim";
  std::ofstream(victim) << "precious";
  std::filesystem::create_directories(dir.path + "/logs/rank.1");
  std::filesystem::create_symlink(victim, dir.path + "/logs/rank.1/stdout");  // a planted file link
  std::filesystem::create_symlink(dir.path, dir.path + "/logs/rank.3");      // a planted directory link
  AgentChild agent;
  ASSERT_TRUE(agent.wait_for<Hello>(0, 20s));
  for (int rank : {1, 3}) {
    Start s = shell_worker(static_cast<uint64_t>(rank), "echo out; echo err >&2");
    s.rank = rank;
    s.output_dir = dir.path + "/logs";
    agent.send(s);
    ASSERT_TRUE(agent.wait_for<Exited>(static_cast<uint64_t>(rank), 20s));
    EXPECT_EQ(agent.output(static_cast<uint64_t>(rank), 1), "out\n");
  }
  EXPECT_EQ(read_file(victim), "precious");
  EXPECT_FALSE(std::filesystem::exists(dir.path + "/stdout")) << "written through the rank.3 link";
  EXPECT_EQ(read_file(dir.path + "/logs/rank.1/stderr"), "err\n");  // the rank's other file still works
  EXPECT_EQ(agent.shutdown(), 0);
}

// Commit replicas through a real agent: KEEP starts its keeper, a pusher
// made here stores a commit in it, and UNKEEP ends the keeper. With
// `forget` its replica goes at once; without, it stays until a worker's file
// of the host holds a commit as new.
namespace si = erun::state_internal;

void commit_into(si::HostCommits& files, uint64_t id) {
  static const std::string name = "w";
  std::vector<char> bytes(4096, static_cast<char>(id));
  ASSERT_FALSE(files.write(id, {si::EntryRef::of(name, bytes)}, nullptr, si::kRankZeroCommit));
}

// Starts the agent's keeper in `kept` and pushes commit `id` from `holder` to it.
int keep_and_push(AgentChild& agent, const std::string& kept, const std::string& holder, uint64_t id) {
  agent.send(Keep{kept});
  auto keeping = agent.wait_for<Keeping>(0, 20s);
  EXPECT_TRUE(keeping && keeping->port > 0) << (keeping ? keeping->why : "no KEEPING");
  if (!keeping || keeping->port == 0) return 0;
  si::HostCommits files(holder + "/slot-h-0");
  commit_into(files, id);
  si::ReplicaPusher pusher(holder, std::make_shared<handshake::Key>("job-secret"));
  auto addrs = net::resolve("127.0.0.1", std::to_string(keeping->port));
  EXPECT_TRUE(addrs.is_ok());
  pusher.target(addrs.value().front(), kept);
  std::vector<si::Pushed> pushed;
  pusher.push(10s, &pushed);
  EXPECT_EQ(pushed.size(), 1u);
  return static_cast<int>(keeping->port);
}

bool eventually(const std::function<bool()>& what, Duration limit) {
  for (auto end = SteadyClock::now() + limit; SteadyClock::now() < end; std::this_thread::sleep_for(50ms)) {
    if (what()) return true;
  }
  return what();
}

// A worker (it sleeps) of the host whose commit directory is `commit_dir`.
void start_worker_on(AgentChild& agent, const std::string& commit_dir) {
  Start s = shell_worker(1, "sleep 30");
  s.env = {{"ERUN_COMMIT_DIR", commit_dir}};
  agent.send(s);
  ASSERT_TRUE(agent.wait_for<Started>(1, 20s));
}

bool connectable(int port) {
  auto addrs = net::resolve("127.0.0.1", std::to_string(port));
  return addrs.is_ok() && net::connect(addrs.value().front(), SteadyClock::now() + 1s).ok();
}

// A real agent that keeps commit `id`, pushed from `holder` into `kept`.
class AgentReplicas : public ::testing::Test {
 protected:
  void keep_one(uint64_t id) {
    ASSERT_FALSE(dir_.path.empty());
    ASSERT_TRUE(agent_.wait_for<Hello>(0, 20s));
    port_ = keep_and_push(agent_, kept_, dir_.path + "/holder", id);
    ASSERT_GT(port_, 0);
  }
  ScratchDir dir_;
  const std::string kept_ = dir_.path + "/kept";
  AgentChild agent_;
  int port_ = 0;
};

TEST_F(AgentReplicas, UnkeepWithForgetEndsTheKeeperAndRemovesItsReplicaAtOnce) {
  ASSERT_NO_FATAL_FAILURE(keep_one(3));
  auto& agent = agent_;
  const std::string& kept = kept_;
  const int port = port_;
  ASSERT_TRUE(std::filesystem::exists(kept + "/replica.a"));
  EXPECT_EQ(si::HostCommits::newest(kept)->snapshot.commit_id, 3u);
  agent.send(Unkeep{true});
  EXPECT_TRUE(eventually([&] { return !std::filesystem::exists(kept + "/replica.a"); }, 5s));
  EXPECT_FALSE(std::filesystem::exists(kept + "/replica.b"));
  EXPECT_TRUE(eventually([&] { return !connectable(port); }, 5s)) << "the keeper still listens";
  EXPECT_TRUE(std::filesystem::exists(kept + "/lease")) << "the agent still holds the directory";
  EXPECT_EQ(agent.shutdown(), 0);
  EXPECT_FALSE(std::filesystem::exists(kept));
}

TEST_F(AgentReplicas, UnkeepWithoutForgetKeepsTheReplicaUntilAWorkersCommitIsAsNew) {
  ASSERT_NO_FATAL_FAILURE(keep_one(5));
  auto& agent = agent_;
  const std::string& kept = kept_;
  const int port = port_;
  // The job resumes on this host: a worker starts, then UNKEEP.
  ASSERT_NO_FATAL_FAILURE(start_worker_on(agent, kept));
  agent.send(Unkeep{false});
  EXPECT_TRUE(eventually([&] { return !connectable(port); }, 5s)) << "the keeper still listens";
  // A worker of this host restored commit 5 from the replica and writes it
  // into its own files, but an older one first: the replica stays.
  si::HostCommits own(kept + "/slot-k-0");
  commit_into(own, 4);
  std::this_thread::sleep_for(2500ms);
  EXPECT_TRUE(std::filesystem::exists(kept + "/replica.a")) << "removed while the newest commit of the host";
  commit_into(own, 5);
  EXPECT_TRUE(eventually([&] { return !std::filesystem::exists(kept + "/replica.a"); }, 20s));
  EXPECT_EQ(si::HostCommits::newest(kept)->path, kept + "/slot-k-0.b");
  EXPECT_EQ(agent.shutdown(), 0);
}

// An agent started anew on a host (the one that kept replicas was lost, so
// never told UNKEEP) finds the replicas when a worker starts, and removes them
// once its worker's own commit is as new.
TEST(AgentReplicasLeftBehind, AreRemovedOnceTheWorkersOfANewAgentHoldACommitAsNew) {
  ScratchDir dir;
  ASSERT_FALSE(dir.path.empty());
  const std::string kept = dir.path + "/kept";
  {
    si::HostCommits replica(kept + "/" + si::kReplicaStem);
    commit_into(replica, 7);
  }
  AgentChild agent;
  ASSERT_TRUE(agent.wait_for<Hello>(0, 20s));
  ASSERT_NO_FATAL_FAILURE(start_worker_on(agent, kept));
  si::HostCommits own(kept + "/slot-k-0");
  commit_into(own, 6);
  std::this_thread::sleep_for(1500ms);
  EXPECT_TRUE(std::filesystem::exists(kept + "/replica.a")) << "removed while the newest commit of the host";
  commit_into(own, 7);
  EXPECT_TRUE(eventually([&] { return !std::filesystem::exists(kept + "/replica.a"); }, 20s));
  EXPECT_EQ(si::HostCommits::newest(kept)->path, kept + "/slot-k-0.b");
  EXPECT_EQ(agent.shutdown(), 0);
}

}  // namespace
}  // namespace erun::agent
