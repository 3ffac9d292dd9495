// The agent's relay (agent/relay.h) between real RendezvousClients and a real
// RendezvousServer: workers authenticate with the relay, share its one
// connection to the server, and see their connections closed when it is lost;
// a stranger never gets a byte through. The relay runs in its own poll loop
// thread here, as in the agent's loop.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <future>
#include <thread>

#include "agent/relay.h"
#include "rendezvous/rendezvous.h"

namespace erun::agent {
namespace {

using namespace std::chrono_literals;

const std::string kJob = "relay-job";
const std::string kSecret = "relay-secret";

std::unique_ptr<RendezvousServer> start_server() {
  ServerOptions o;
  o.job_id = kJob;
  o.secret = kSecret;
  o.bind_address = "127.0.0.1";
  auto s = std::make_unique<RendezvousServer>(o);
  EXPECT_TRUE(s->start().is_ok());
  return s;
}

// The relay and the poll loop that drives it.
class RelayLoop {
 public:
  explicit RelayLoop(int port) {
    RelayOptions o;
    o.job_id = kJob;
    o.secret = kSecret;
    o.upstream_host = "127.0.0.1";
    o.upstream_port = port;
    o.log_prefix = "agent on test";
    o.io_timeout = 5s;
    auto r = Relay::create(o);
    EXPECT_TRUE(r.is_ok()) << r.message();
    relay_ = std::move(r).value();
    thread_ = std::thread([this] {
      while (!stop_) {
        std::vector<pollfd> fds;
        size_t first = relay_->add_fds(fds);
        ::poll(fds.data(), fds.size(), 10);
        relay_->on_events(fds, first);
        relay_->tick(std::chrono::steady_clock::now());
      }
    });
  }
  ~RelayLoop() { stop(); }
  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  Relay& relay() { return *relay_; }

 private:
  std::unique_ptr<Relay> relay_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

ClientOptions client_options(const std::string& address, int port, const std::string& secret = kSecret) {
  ClientOptions o;
  o.address = address;
  o.port = port;
  o.job_id = kJob;
  o.secret = secret;
  o.io_timeout = 5s;
  o.join_timeout = 20s;
  return o;
}

bool wait_for(const std::function<bool()>& pred, Duration timeout = 20s) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

RankAssignment rank_of(int index, int size) {
  RankAssignment a;
  a.slot = {"hostA", index};
  a.rank = index;
  a.size = size;
  a.local_rank = index;
  a.local_size = size;
  a.cross_size = 1;
  return a;
}

// Slot hostA:index joins through `c` on another thread: the rank it gets,
// or -1 when the join fails (or is for another generation than `want_gen`,
// when that is given).
std::future<int> join_async(RendezvousClient& c, int index, long want_gen = -1) {
  return std::async(std::launch::async, [&c, index, want_gen] {
    JoinRequest r;
    r.slot = {"hostA", index};
    r.pid = 100 + index;
    long gen = -1;
    auto a = c.join(r, &gen);
    return a.is_ok() && (want_gen < 0 || gen == want_gen) ? a->rank : -1;
  });
}

TEST(AgentRelay, WorkersJoinAndShareTheStoreOverOneConnection) {
  auto server = start_server();
  RelayLoop loop(server->port());
  const std::string address = loop.relay().address();
  ASSERT_EQ(address.rfind("unix:/", 0), 0u);
  std::string dir = address.substr(5, address.rfind('/') - 5);
  struct stat st {};
  ASSERT_EQ(::stat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);

  std::vector<std::unique_ptr<RendezvousClient>> clients;
  std::vector<std::future<int>> ranks;
  for (int i = 0; i < 3; ++i) {
    clients.push_back(std::make_unique<RendezvousClient>(client_options(address, server->port())));
    ASSERT_TRUE(clients.back()->connect().is_ok());
    ranks.push_back(join_async(*clients.back(), i, /*want_gen=*/1));
  }
  ASSERT_TRUE(wait_for([&] { return server->waiting().size() == 3; }));
  EXPECT_EQ(server->relay_connections(), 1);
  server->publish(1, {rank_of(0, 3), rank_of(1, 3), rank_of(2, 3)});
  for (int i = 0; i < 3; ++i) EXPECT_EQ(ranks[static_cast<size_t>(i)].get(), i);

  auto got = std::async(std::launch::async, [&] { return clients[2]->store().get("k", 10s); });
  clients[0]->store().set("k", {'v', '1'});
  EXPECT_EQ(got.get(), (std::vector<char>{'v', '1'}));

  // A worker leaving is its slot's disconnect; the others stay.
  server->snapshot();
  clients[1].reset();
  std::vector<SlotKey> gone;
  ASSERT_TRUE(wait_for([&] {
    for (auto& s : server->snapshot().disconnected) gone.push_back(s);
    return !gone.empty();
  }));
  EXPECT_EQ(gone, (std::vector<SlotKey>{{"hostA", 1}}));
  EXPECT_TRUE(clients[0]->connected());
  EXPECT_EQ(server->relay_connections(), 1);

  loop.stop();
  EXPECT_EQ(loop.relay().refused(), 0);
}

// Stream ids reach the server in increasing order, whatever order the
// workers connected and authenticated in: the one that connected last speaks
// first here, and the other's frames are not taken for a closed stream's.
TEST(AgentRelay, AWorkerThatConnectedFirstButSpeaksLastStillJoins) {
  auto server = start_server();
  RelayLoop loop(server->port());
  RendezvousClient first(client_options(loop.relay().address(), server->port()));
  RendezvousClient second(client_options(loop.relay().address(), server->port()));
  ASSERT_TRUE(first.connect().is_ok());
  ASSERT_TRUE(second.connect().is_ok());
  auto j1 = join_async(second, 1);
  ASSERT_TRUE(wait_for([&] { return server->waiting().size() == 1; }));
  auto j0 = join_async(first, 0);
  ASSERT_TRUE(wait_for([&] { return server->waiting().size() == 2; }));
  server->publish(1, {rank_of(0, 2), rank_of(1, 2)});
  EXPECT_EQ(j0.get(), 0);
  EXPECT_EQ(j1.get(), 1);
}

TEST(AgentRelay, AStrangerIsRefusedAndNothingReachesTheDriver) {
  auto server = start_server();
  RelayLoop loop(server->port());
  RendezvousClient stranger(client_options(loop.relay().address(), server->port(), "wrong-secret"));
  Status s = stranger.connect();
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("authentication failed"), std::string::npos) << s.message();
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(server->relay_connections(), 0);  // the relay never connected upstream for it
  EXPECT_EQ(server->refused(), 0);
  loop.stop();
  EXPECT_EQ(loop.relay().refused(), 1);
}

TEST(AgentRelay, LosingTheDriverClosesEveryRelayedWorkersConnection) {
  auto server = start_server();
  const int port = server->port();
  RelayLoop loop(port);
  RendezvousClient a(client_options(loop.relay().address(), port));
  RendezvousClient b(client_options(loop.relay().address(), port));
  ASSERT_TRUE(a.connect().is_ok());
  ASSERT_TRUE(b.connect().is_ok());
  auto ja = join_async(a, 0), jb = join_async(b, 1);
  ASSERT_TRUE(wait_for([&] { return server->waiting().size() == 2; }));
  EXPECT_EQ(server->relay_connections(), 1);
  server.reset();  // the driver is gone
  EXPECT_EQ(ja.get(), -1);
  EXPECT_EQ(jb.get(), -1);
  EXPECT_TRUE(wait_for([&] { return !a.connected() && !b.connected(); }));
}

TEST(AgentRelay, TheSocketDirectoryGoesWithTheRelay) {
  auto server = start_server();
  std::string dir;
  {
    RelayLoop loop(server->port());
    std::string address = loop.relay().address();
    dir = address.substr(5, address.rfind('/') - 5);
    ASSERT_EQ(::access(dir.c_str(), F_OK), 0);
  }
  EXPECT_NE(::access(dir.c_str(), F_OK), 0);
}

}  // namespace
}  // namespace erun::agent
