// Workers reach the driver's rendezvous through their host's agent
// (docs/protocol.md, "Relaying"), end to end: 2 simulated hosts x 3 workers of
// examples/train_mlp under the real erun. The driver sees exactly one
// rendezvous connection per host; a SIGKILLed worker recovers in place through
// the same relay; a stranger's connections to an agent's socket are refused
// and logged; the model is exactly the uninterrupted one. With
// --no-agent-relay the workers connect to the driver themselves.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <regex>
#include <thread>

#include "common/net.h"
#include "rendezvous/wire.h"
#include "support/erun_process.h"
#include "support/process_utils.h"

namespace erun::testing {
namespace {

using namespace std::chrono_literals;

std::string env_of(pid_t pid) {
  std::string s = read_file("/proc/" + std::to_string(pid) + "/environ");
  std::replace(s.begin(), s.end(), '\0', '\n');
  return "\n" + s;
}

std::string env_value(pid_t pid, const std::string& name) {
  std::smatch m;
  std::string env = env_of(pid);
  return std::regex_search(env, m, std::regex("\n" + name + "=([^\n]*)\n")) ? m[1].str() : "";
}

// A connection to the agent's unix socket; -1 when it cannot connect.
int connect_unix(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

class ErunRelay : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string out = uninterrupted_training_output();
    reference_ = new std::string(train_checksum(out));
    ASSERT_FALSE(reference_->empty()) << out;
  }
  static void TearDownTestSuite() {
    delete reference_;
    reference_ = nullptr;
  }
  void SetUp() override {
    program_ = build_path("examples/train_mlp");
    dir_.write("hosts", "127.0.0.2:3\n127.0.0.3:3\n");
    dir_.write("discover.sh", "#!/bin/sh\ncat " + dir_.file("hosts") + "\n", true);
  }
  std::vector<std::string> args(std::vector<std::string> extra) {
    std::vector<std::string> a = {"-v", "--launcher", "local", "-np", "6", "--min-np", "2", "--max-np", "6",
                                  "--host-discovery-script", dir_.file("discover.sh"), "--discovery-interval", "0.5",
                                  "--term-grace", "2"};
    a.insert(a.end(), extra.begin(), extra.end());
    a.push_back(program_);
    a.insert(a.end(), kTrainMlpArgs.begin(), kTrainMlpArgs.end());
    return a;
  }
  std::vector<pid_t> workers() {
    std::vector<pid_t> out;
    for (pid_t pid : pids_with_cmdline(program_)) {
      if (read_file("/proc/" + std::to_string(pid) + "/cmdline").rfind(program_ + std::string(1, '\0'), 0) == 0) {
        out.push_back(pid);
      }
    }
    return out;
  }
  std::vector<pid_t> wait_workers(size_t n, Duration timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      auto w = workers();
      if (w.size() >= n) return w;
      std::this_thread::sleep_for(50ms);
    }
    return workers();
  }
  void expect_trained_exactly(ErunProcess& p) {
    ASSERT_NO_FATAL_FAILURE(erun::testing::expect_trained_exactly(p, *reference_));
    std::vector<pid_t> left;
    EXPECT_TRUE(wait_no_process(program_, 20s, &left)) << describe_pids(left);
  }

  static std::string* reference_;
  std::string program_;
  TempDir dir_;
};
std::string* ErunRelay::reference_ = nullptr;

TEST_F(ErunRelay, TwoHostsOfThreeWorkersAreTwoRendezvousConnectionsAndRecoverInPlace) {
  ErunProcess p(args({}));
  ASSERT_TRUE(p.wait_output("epoch 1 ", 120s)) << p.out() << p.err();
  auto ws = wait_workers(6, 10s);
  ASSERT_EQ(ws.size(), 6u) << p.err();

  // Every worker's rendezvous is its agent's socket, in a private directory.
  std::set<std::string> sockets;
  for (pid_t w : ws) {
    std::string addr = env_value(w, "ERUN_RDZV_ADDR");
    ASSERT_EQ(addr.rfind("unix:", 0), 0u) << addr;
    sockets.insert(addr.substr(5));
  }
  ASSERT_EQ(sockets.size(), 2u);  // one per host
  const std::string sock = *sockets.begin();
  struct stat dir_st {};
  ASSERT_EQ(::stat(sock.substr(0, sock.rfind('/')).c_str(), &dir_st), 0);
  EXPECT_EQ(dir_st.st_mode & 0777, 0700u);

  // A stranger: garbage, then a handshake with the wrong secret.
  int fd = connect_unix(sock);
  ASSERT_GE(fd, 0);
  std::string junk = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  junk.resize(64, 'x');
  (void)!::write(fd, junk.data(), junk.size());
  ::close(fd);
  fd = connect_unix(sock);
  ASSERT_GE(fd, 0);
  const uint64_t jh = handshake::job_hash(env_value(ws.front(), "ERUN_JOB_ID"));
  auto deadline = std::chrono::steady_clock::now() + 10s;
  std::string cn = handshake::random_bytes(wire::kNonceBytes);
  ASSERT_TRUE(net::set_nonblocking(fd));
  ASSERT_TRUE(wire::send_all(fd, wire::encode_frame(wire::Type::kHello, jh, -1, 0, cn), deadline));
  auto ch = wire::recv_frame(fd, jh, 4096, deadline);
  ASSERT_TRUE(ch) << ch.message();
  ASSERT_EQ(ch->header.type, static_cast<uint16_t>(wire::Type::kChallenge));
  std::string wrong = wire::client_proof("not-the-secret", ch->payload, env_value(ws.front(), "ERUN_JOB_ID"), cn);
  ASSERT_TRUE(wire::send_all(fd, wire::encode_frame(wire::Type::kAuth, jh, -1, 0, wrong), deadline));
  auto reply = wire::recv_frame(fd, jh, 4096, deadline);
  ASSERT_TRUE(reply) << reply.message();
  EXPECT_EQ(reply->header.type, static_cast<uint16_t>(wire::Type::kError));
  ::close(fd);

  // A worker dies: the survivors go on, its replacement joins through the relay.
  ::kill(ws.back(), SIGKILL);
  expect_trained_exactly(p);
  // The driver's rendezvous saw one connection per host, for the whole job.
  EXPECT_EQ(p.count(" opened ("), 2u) << p.err();
  EXPECT_EQ(p.count("relay: refused a connection to the relay socket"), 2u) << p.err();
  EXPECT_NE(p.err().find("authentication failed (wrong job secret) (not a worker of this job"), std::string::npos)
      << p.err();
  EXPECT_NE(p.err().find("recovering in place"), std::string::npos) << p.err();
  EXPECT_EQ(p.err().find("restarting all workers"), std::string::npos) << p.err();
  // The agents removed their sockets' directories.
  for (auto& s : sockets) EXPECT_NE(::access(s.substr(0, s.rfind('/')).c_str(), F_OK), 0) << s;
}

TEST_F(ErunRelay, NoAgentRelayConnectsEachWorkerToTheDriver) {
  ErunProcess p(args({"--no-agent-relay"}));
  ASSERT_TRUE(p.wait_output("epoch 1 ", 120s)) << p.out() << p.err();
  auto ws = wait_workers(6, 10s);
  ASSERT_EQ(ws.size(), 6u) << p.err();
  for (pid_t w : ws) EXPECT_EQ(env_value(w, "ERUN_RDZV_ADDR").rfind("unix:", 0), std::string::npos);
  expect_trained_exactly(p);
  EXPECT_EQ(p.count("agent relay connection from"), 0u) << p.err();
}

}  // namespace
}  // namespace erun::testing
