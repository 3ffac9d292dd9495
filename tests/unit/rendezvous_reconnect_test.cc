// A worker's rendezvous client outlives its driver (--driver-grace): the
// real server goes away, the client keeps trying, and a new server on the
// same port (a new driver) gets it back. It then says hosts_updated (so the
// worker re-joins at its next commit), and a join that was in flight when
// the first server went is sent again to the next one. Without the grace,
// or past it, the client fails as before.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <thread>

#include "rendezvous_test_util.h"
#include "support/erun_process.h"

namespace erun::testing {
namespace {

using namespace std::chrono_literals;

// A new driver's server on the old one's port, going on after generation `last`.
std::unique_ptr<RendezvousServer> start_on(int port, long last) {
  ServerOptions o = server_options();
  o.port = port;
  o.resume_generation = last;
  return start_server(o);
}

ClientOptions graceful(int port, Duration grace) {
  ClientOptions o = client_options(port);
  o.reconnect_within = grace;
  return o;
}

// Joins `host` slot 0 (leaving `left`) and publishes `gen` with it alone.
Result<RankAssignment> join_published(RendezvousServer& server, RendezvousClient& client, long gen, long left) {
  auto req = join_request("h", 0);
  req.left_generation = left;
  req.reason = left < 0 ? JoinReason::kStart : JoinReason::kHostsUpdated;
  long got = -1;
  auto f = std::async(std::launch::async, [&] { return client.join(req, &got); });
  EXPECT_TRUE(wait_for([&] { return server.waiting().size() == 1; }));
  server.publish(gen, {rank_of("h", 0, 0, 1)});
  auto r = f.get();
  if (r.is_ok()) {
    EXPECT_EQ(got, gen);
  }
  return r;
}

TEST(RendezvousReconnect, ClientOutlivesItsServerAndJoinsTheNext) {
  auto first = start_server();
  const int port = first->port();
  RendezvousClient client(graceful(port, 20s));
  ASSERT_TRUE(client.connect().is_ok());
  ASSERT_TRUE(join_published(*first, client, 4, -1).is_ok());
  EXPECT_FALSE(client.hosts_updated());

  first.reset();  // the driver is gone
  std::this_thread::sleep_for(1500ms);
  // Training goes on meanwhile: nothing asks the worker to re-join yet.
  EXPECT_FALSE(client.hosts_updated());
  EXPECT_EQ(client.generation(), 4);

  auto second = start_on(port, 4);
  ASSERT_TRUE(wait_for([&] { return client.hosts_updated(); }, 10s)) << "the client did not reach the new server";
  auto r = join_published(*second, client, 5, 4);
  ASSERT_TRUE(r.is_ok()) << r.message();
  EXPECT_EQ(r->rank, 0);
  EXPECT_EQ(client.generation(), 5);
  EXPECT_FALSE(client.hosts_updated());
}

TEST(RendezvousReconnect, AJoinInFlightIsSentAgainToTheNextServer) {
  auto first = start_server();
  const int port = first->port();
  RendezvousClient client(graceful(port, 20s));
  ASSERT_TRUE(client.connect().is_ok());
  ASSERT_TRUE(join_published(*first, client, 1, -1).is_ok());

  auto req = join_request("h", 0);
  req.left_generation = 1;
  req.reason = JoinReason::kPeerLost;
  long got = -1;
  auto f = std::async(std::launch::async, [&] { return client.join(req, &got); });
  ASSERT_TRUE(wait_for([&] { return first->waiting().size() == 1; }));
  first.reset();  // the driver dies with the join unanswered
  std::this_thread::sleep_for(1s);
  EXPECT_EQ(f.wait_for(0s), std::future_status::timeout) << "the join gave up while the grace lasts";

  auto second = start_on(port, 1);
  ASSERT_TRUE(wait_for([&] { return second->waiting().size() == 1; }, 10s)) << "the join was not sent again";
  EXPECT_EQ(second->waiting()[0].reason, JoinReason::kPeerLost);
  second->publish(2, {rank_of("h", 0, 0, 1)});
  auto r = f.get();
  ASSERT_TRUE(r.is_ok()) << r.message();
  EXPECT_EQ(got, 2);
}

// A client that follows `file` (ClientOptions::follow_file, what the
// worker's agent writes), joined to `server`'s generation 3; null after a
// failure.
std::unique_ptr<RendezvousClient> following_client(RendezvousServer& server, const std::string& file) {
  ClientOptions o = graceful(server.port(), 20s);
  o.follow_file = file;
  auto client = std::make_unique<RendezvousClient>(o);
  if (!client->connect().is_ok() || !join_published(server, *client, 3, -1).is_ok()) return nullptr;
  return client;
}

// What the agent writes for a driver at 127.0.0.1:`port`.
std::string driver_at(int port) { return "127.0.0.1 " + std::to_string(port) + "\n"; }

// A worker that reaches the driver without its agent's relay: the new
// driver is elsewhere (here another port), and the worker's agent writes
// where (ClientOptions::follow_file). The client ignores what is not
// "HOST PORT", and reaches the new driver once the file names it.
TEST(RendezvousReconnect, AClientFollowsTheDriverItsAgentNamesElsewhere) {
  TempDir dir;
  auto first = start_server();
  auto client = following_client(*first, dir.file("driver"));
  ASSERT_TRUE(client);
  const int old_port = first->port();
  first.reset();
  auto second = start_on(0, 3);  // another port
  ASSERT_NE(second->port(), old_port);
  const std::string line = driver_at(second->port());
  for (const std::string& bad : std::vector<std::string>{"127.0.0.1\n", driver_at(0), driver_at(70000), " 1234\n",
                                 "unix:/tmp/x" + line.substr(line.find(' ')), line.substr(0, line.size() - 1)}) {
    dir.write("driver", bad);
    std::this_thread::sleep_for(700ms);  // a try or more
    EXPECT_FALSE(client->hosts_updated()) << "followed '" << bad << "'";
  }
  dir.write("driver", line);
  ASSERT_TRUE(wait_for([&] { return client->hosts_updated(); }, 10s)) << "the client did not follow the file";
  auto r = join_published(*second, *client, 4, 3);
  ASSERT_TRUE(r.is_ok()) << r.message();
  EXPECT_EQ(client->generation(), 4);
}

// The driver it is connected to lives on (frozen, or cut off from the
// other hosts) but was replaced: the worker's agent names the new one, and
// the client leaves the old one for it without waiting for the old
// connection to fail.
TEST(RendezvousReconnect, AClientLeavesADriverItsAgentSaysWasReplaced) {
  TempDir dir;
  auto old_driver = start_server();
  auto client = following_client(*old_driver, dir.file("driver"));
  ASSERT_TRUE(client);
  // The file naming the driver it is connected to changes nothing.
  dir.write("driver", driver_at(old_driver->port()));
  std::this_thread::sleep_for(1500ms);
  EXPECT_FALSE(client->hosts_updated());
  auto new_driver = start_on(0, 3);
  dir.write("driver", driver_at(new_driver->port()));
  ASSERT_TRUE(wait_for([&] { return client->hosts_updated(); }, 10s)) << "the client stayed with the old driver";
  auto r = join_published(*new_driver, *client, 4, 3);
  ASSERT_TRUE(r.is_ok()) << r.message();
  EXPECT_TRUE(old_driver->waiting().empty()) << "the join went to the old driver";
}

TEST(RendezvousReconnect, WithoutAGraceOrPastItTheJoinFails) {
  for (Duration grace : {Duration::zero(), Duration(1s)}) {
    auto first = start_server();
    RendezvousClient client(graceful(first->port(), grace));
    ASSERT_TRUE(client.connect().is_ok());
    ASSERT_TRUE(join_published(*first, client, 1, -1).is_ok());
    first.reset();
    auto t0 = std::chrono::steady_clock::now();
    long got = -1;
    auto req = join_request("h", 0);
    req.left_generation = 1;
    auto r = client.join(req, &got);
    ASSERT_FALSE(r.is_ok());
    EXPECT_LT(std::chrono::steady_clock::now() - t0, grace + 5s);
    if (grace > Duration::zero()) {
      EXPECT_NE(r.message().find("no driver took the job over"), std::string::npos) << r.message();
    }
  }
}

}  // namespace
}  // namespace erun::testing
