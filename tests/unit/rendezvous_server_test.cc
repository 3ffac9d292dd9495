// The generation protocol over real sockets: joins wait for publish, the
// store is scoped to a generation, notifications reach every member, dead
// clients are reported. Clients run as threads, and as forked processes where
// a process must die.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <future>
#include <mutex>
#include <unistd.h>
#include <optional>

#include <fmt/format.h>

#include "erun/errors.hpp"
#include "rendezvous_test_util.h"

namespace erun::testing {
namespace {

using namespace std::chrono_literals;

struct Joined {
  std::unique_ptr<RendezvousClient> client;
  std::future<Result<RankAssignment>> assignment;
  long gen = -1;
};

// Connects a client and starts its join on another thread.
std::unique_ptr<Joined> start_join(int port, const std::string& host, int index, uint64_t commit = 0,
                                   ClientOptions o = {}) {
  auto j = std::make_unique<Joined>();
  if (o.port == 0) o = client_options(port);
  j->client = std::make_unique<RendezvousClient>(o);
  auto s = j->client->connect();
  EXPECT_TRUE(s.is_ok()) << s.message();
  auto* raw = j.get();
  j->assignment = std::async(std::launch::async, [raw, host, index, commit] {
    return raw->client->join(join_request(host, index, commit), &raw->gen);
  });
  return j;
}

// The same with a whole JoinRequest.
std::unique_ptr<Joined> start_join_request(int port, JoinRequest req) {
  auto j = std::make_unique<Joined>();
  j->client = std::make_unique<RendezvousClient>(client_options(port));
  auto s = j->client->connect();
  EXPECT_TRUE(s.is_ok()) << s.message();
  auto* raw = j.get();
  j->assignment = std::async(std::launch::async, [raw, req] { return raw->client->join(req, &raw->gen); });
  return j;
}

bool ready(std::future<Result<RankAssignment>>& f) { return f.wait_for(0s) == std::future_status::ready; }

// Starts n joins for slots h0..h{n-1} and publishes them as gen 1.
std::vector<std::unique_ptr<Joined>> joined_world(RendezvousServer& server, int n, long gen = 1) {
  std::vector<std::unique_ptr<Joined>> out;
  std::vector<RankAssignment> ranks;
  for (int i = 0; i < n; ++i) {
    out.push_back(start_join(server.port(), "h" + std::to_string(i), 0));
    ranks.push_back(rank_of("h" + std::to_string(i), 0, i, n));
  }
  EXPECT_TRUE(wait_for([&] { return server.waiting().size() == static_cast<size_t>(n); }));
  server.publish(gen, ranks);
  for (auto& j : out) EXPECT_TRUE(j->assignment.get().is_ok());
  return out;
}

TEST(RendezvousServer, JoinBlocksUntilPublishAndGetsItsAssignment) {
  auto server = start_server();
  auto a = start_join(server->port(), "10.0.0.1", 0, 7);
  auto b = start_join(server->port(), "10.0.0.1", 1, 9);
  auto c = start_join(server->port(), "10.0.0.2", 0, 9);
  ASSERT_TRUE(wait_for([&] { return server->waiting().size() == 3; }));
  auto waiting = server->waiting();
  std::map<SlotKey, uint64_t> commits;
  for (auto& w : waiting) commits[w.slot] = w.commit_id;
  EXPECT_EQ(commits[(SlotKey{"10.0.0.1", 0})], 7u);
  EXPECT_EQ(commits[(SlotKey{"10.0.0.2", 0})], 9u);
  EXPECT_EQ(waiting[0].pid, ::getpid());
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(ready(a->assignment));

  RankAssignment r0{{0, 3, 0, 2, 0, 2}, {"10.0.0.1", 0}};
  RankAssignment r1{{1, 3, 1, 2, 0, 2}, {"10.0.0.1", 1}};
  RankAssignment r2{{2, 3, 0, 1, 1, 2}, {"10.0.0.2", 0}};
  server->publish(5, {r0, r1, r2});
  auto ra = a->assignment.get(), rb = b->assignment.get(), rc = c->assignment.get();
  ASSERT_TRUE(ra.is_ok()) << ra.message();
  ASSERT_TRUE(rb.is_ok() && rc.is_ok());
  EXPECT_EQ(ra->rank, 0);
  EXPECT_EQ(rb->rank, 1);
  EXPECT_EQ(rb->local_rank, 1);
  EXPECT_EQ(rb->local_size, 2);
  EXPECT_EQ(rc->rank, 2);
  EXPECT_EQ(rc->size, 3);
  EXPECT_EQ(rc->cross_rank, 1);
  EXPECT_EQ(rc->cross_size, 2);
  EXPECT_EQ(rc->slot, (SlotKey{"10.0.0.2", 0}));
  EXPECT_EQ(rc->generation, 5);  // the published generation, not the plan's unset one
  EXPECT_EQ(a->gen, 5);
  EXPECT_EQ(c->client->generation(), 5);
  EXPECT_EQ(server->generation(), 5);
  EXPECT_TRUE(server->waiting().empty());
  EXPECT_EQ(server->members().size(), 3u);
}

TEST(RendezvousServer, JoinsNotInThePublishedListKeepWaiting) {
  auto server = start_server();
  auto a = start_join(server->port(), "a", 0);
  auto b = start_join(server->port(), "b", 0);
  ASSERT_TRUE(wait_for([&] { return server->waiting().size() == 2; }));
  server->publish(1, {rank_of("a", 0, 0, 1)});
  ASSERT_TRUE(a->assignment.get().is_ok());
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(ready(b->assignment));
  ASSERT_EQ(server->waiting().size(), 1u);
  EXPECT_EQ(server->waiting()[0].slot.host, "b");

  // A listed slot that joins after the publish is answered at once.
  auto late = start_join(server->port(), "c", 0);
  server->publish(2, {rank_of("b", 0, 0, 2), rank_of("c", 0, 1, 2)});
  auto rb = b->assignment.get();
  ASSERT_TRUE(rb.is_ok());
  EXPECT_EQ(rb->size, 2);
  EXPECT_EQ(late->assignment.get()->rank, 1);
  auto again = start_join(server->port(), "d", 0);
  server->publish(3, {rank_of("d", 0, 0, 1)});
  auto after = start_join(server->port(), "d", 1);
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(ready(after->assignment));  // not listed in 3
  EXPECT_TRUE(again->assignment.get().is_ok());
  server->publish(4, {rank_of("d", 1, 0, 1)});
  EXPECT_TRUE(after->assignment.get().is_ok());
}

TEST(RendezvousServer, RejoinWaitsForANewerGeneration) {
  auto server = start_server();
  auto world = joined_world(*server, 2);
  // Rank 0 re-joins (as after HostsUpdated): generation 1 is not handed out again.
  auto& c = *world[0]->client;
  auto fut = std::async(std::launch::async, [&] {
    long g = -1;
    auto r = c.join(join_request("h0", 0), &g);
    return r.is_ok() ? g : -100;
  });
  ASSERT_TRUE(wait_for([&] { return server->waiting().size() == 1; }));
  EXPECT_FALSE(fut.wait_for(100ms) == std::future_status::ready);
  server->publish(2, {rank_of("h0", 0, 0, 1)});
  EXPECT_EQ(fut.get(), 2);
}

TEST(RendezvousServer, JoinTimesOut) {
  auto server = start_server();
  auto o = client_options(server->port());
  o.join_timeout = 300ms;
  RendezvousClient c(o);
  ASSERT_TRUE(c.connect().is_ok());
  long g = -1;
  auto r = c.join(join_request("a", 0), &g);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.message().find("a:0"), std::string::npos) << r.message();
}

TEST(RendezvousServer, StoreSetGetAcrossClients) {
  auto server = start_server();
  auto world = joined_world(*server, 2);
  KvStore& s0 = world[0]->client->store();
  KvStore& s1 = world[1]->client->store();
  s0.set("addr/0", {'x', 'y'});
  EXPECT_EQ(s1.get("addr/0", 5s), (std::vector<char>{'x', 'y'}));
  EXPECT_TRUE(s1.check({"addr/0"}));
  EXPECT_FALSE(s1.check({"addr/0", "addr/1"}));

  // A get that waits for a later set.
  auto later = std::async(std::launch::async, [&] { return s0.get("addr/1", 20s); });
  EXPECT_FALSE(later.wait_for(100ms) == std::future_status::ready);
  std::vector<char> big(300 << 10, 'q');
  s1.set("addr/1", big);
  EXPECT_EQ(later.get(), big);

  auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(s0.get("never", 300ms), CommError);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 250ms);
  EXPECT_TRUE(world[0]->client->connected());  // a timeout is not a lost connection
  s0.set("after-timeout", {});
  EXPECT_TRUE(s1.check({"after-timeout"}));
}

TEST(RendezvousServer, StoreBeforeJoinThrows) {
  auto server = start_server();
  RendezvousClient c(client_options(server->port()));
  ASSERT_TRUE(c.connect().is_ok());
  EXPECT_THROW(c.store().set("k", {}), CommError);
}

TEST(RendezvousServer, StaleGenerationIsRefused) {
  auto server = start_server();
  auto world = joined_world(*server, 2);
  KvStore& s0 = world[0]->client->store();
  s0.set("k", {'1'});
  auto pending = std::async(std::launch::async, [&] { return world[1]->client->store().get("missing", 20s); });
  EXPECT_FALSE(pending.wait_for(100ms) == std::future_status::ready);
  server->publish(2, {rank_of("h0", 0, 0, 2), rank_of("h1", 0, 1, 2)});
  try {
    s0.get("k", 1s);
    FAIL() << "a get of an old generation succeeded";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("stale generation 1, current 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(s0.set("k", {'2'}), CommError);
  EXPECT_THROW(pending.get(), CommError);  // the waiting get is answered, not left to time out

  // Re-joining gets generation 2 at once (it lists both), and its store
  // does not hold generation 1's keys.
  for (int i = 0; i < 2; ++i) {
    long g = -1;
    ASSERT_TRUE(world[i]->client->join(join_request("h" + std::to_string(i), 0), &g).is_ok());
    EXPECT_EQ(g, 2);
  }
  EXPECT_FALSE(s0.check({"k"}));
  s0.set("k", {'3'});
  EXPECT_EQ(world[1]->client->store().get("k", 5s), std::vector<char>{'3'});
}

TEST(RendezvousServer, HostsUpdatedReachesEveryMember) {
  auto server = start_server();
  auto world = joined_world(*server, 4);
  auto outsider = start_join(server->port(), "spare", 0);
  ASSERT_TRUE(wait_for([&] { return server->waiting().size() == 1; }));
  for (auto& j : world) EXPECT_FALSE(j->client->hosts_updated());
  server->notify_hosts_updated(0);  // no such generation: nobody is told
  server->notify_hosts_updated(1);
  for (auto& j : world) {
    EXPECT_TRUE(wait_for([&] { return j->client->hosts_updated(); })) << "a member was not told";
  }
  EXPECT_FALSE(outsider->client->hosts_updated());
  // Re-joining clears the flag.
  auto& c = *world[2]->client;
  auto fut = std::async(std::launch::async, [&] { return c.join(join_request("h2", 0), nullptr); });
  ASSERT_TRUE(wait_for([&] { return server->waiting().size() == 2; }));
  server->publish(2, {rank_of("h2", 0, 0, 2), rank_of("spare", 0, 1, 2)});
  ASSERT_TRUE(fut.get().is_ok());
  EXPECT_FALSE(c.hosts_updated());
  ASSERT_TRUE(outsider->assignment.get().is_ok());
}

TEST(RendezvousServer, PeersLostReachesTheOtherMembersAndClosesTheLostRanksConnections) {
  auto server = start_server();
  // Three members whose clients hand the notice to a callback, as the
  // worker's Context does.
  std::mutex mu;
  std::vector<std::pair<long, std::vector<int>>> heard[3];
  std::vector<std::unique_ptr<Joined>> world;
  std::vector<RankAssignment> ranks;
  for (int i = 0; i < 3; ++i) {
    ClientOptions o = client_options(server->port());
    o.on_peers_lost = [&mu, &heard, i](long g, const std::vector<int>& r) {
      std::lock_guard<std::mutex> lock(mu);
      heard[i].emplace_back(g, r);
    };
    world.push_back(start_join(server->port(), "h" + std::to_string(i), 0, 0, o));
    ranks.push_back(rank_of("h" + std::to_string(i), 0, i, 3));
  }
  ASSERT_TRUE(wait_for([&] { return server->waiting().size() == 3; }));
  server->publish(1, ranks);
  for (auto& j : world) ASSERT_TRUE(j->assignment.get().is_ok());
  for (auto& j : world) EXPECT_EQ(j->client->peers_lost_generation(), -1);

  server->notify_peers_lost(0, {2});  // not the current generation: nobody is told
  server->notify_peers_lost(1, {});   // nobody lost: nothing to tell
  server->notify_peers_lost(1, {2});
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(wait_for([&] { return world[static_cast<size_t>(i)]->client->peers_lost_generation() == 1; }));
    EXPECT_EQ(world[static_cast<size_t>(i)]->client->peers_lost(), std::vector<int>{2});
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_EQ(heard[i].size(), 1u) << "member " << i;
    EXPECT_EQ(heard[i][0], (std::pair<long, std::vector<int>>{1, {2}}));
  }
  // The lost rank's own connection is closed (a partitioned worker finds its
  // rendezvous gone when it comes back), not told.
  ASSERT_TRUE(wait_for([&] { return !world[2]->client->connected(); }));
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_TRUE(heard[2].empty());
  }
  EXPECT_EQ(server->members().size(), 2u);
}

TEST(RendezvousServer, PeersLostOfAGenerationTheWorkerLeftIsIgnored) {
  auto server = start_server();
  int calls = 0;
  std::mutex mu;
  ClientOptions o = client_options(server->port());
  o.on_peers_lost = [&](long, const std::vector<int>&) {
    std::lock_guard<std::mutex> lock(mu);
    ++calls;
  };
  auto a = start_join(server->port(), "h0", 0, 0, o);
  auto b = start_join(server->port(), "h1", 0);
  ASSERT_TRUE(wait_for([&] { return server->waiting().size() == 2; }));
  server->publish(1, {rank_of("h0", 0, 0, 2), rank_of("h1", 0, 1, 2)});
  ASSERT_TRUE(a->assignment.get().is_ok());
  ASSERT_TRUE(b->assignment.get().is_ok());
  // h0 leaves generation 1 and joins 2; a notice about 1 no longer reaches it.
  auto fut = std::async(std::launch::async, [&] { return a->client->join(join_request("h0", 0), nullptr); });
  ASSERT_TRUE(wait_for([&] { return server->waiting().size() == 1; }));
  server->notify_peers_lost(1, {1});  // h0 waits in a join: no member of 1 any more
  server->publish(2, {rank_of("h0", 0, 0, 1)});
  ASSERT_TRUE(fut.get().is_ok());
  server->notify_peers_lost(1, {1});  // an older generation: the server drops it
  std::this_thread::sleep_for(200ms);
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(a->client->peers_lost_generation(), -1);
}

TEST(RendezvousServer, LostServerFailsStoreOpsAndClosesPromptly) {
  auto server = start_server();
  auto world = joined_world(*server, 1);
  auto& c = *world[0]->client;
  server->notify_hosts_updated(1);
  ASSERT_TRUE(wait_for([&] { return c.hosts_updated(); }));
  auto pending = std::async(std::launch::async, [&] { return c.store().get("never", 60s); });
  EXPECT_FALSE(pending.wait_for(100ms) == std::future_status::ready);
  auto t0 = std::chrono::steady_clock::now();
  server.reset();
  EXPECT_THROW(pending.get(), CommError);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  EXPECT_THROW(c.store().set("k", {}), CommError);
  EXPECT_TRUE(c.hosts_updated());  // stays as it was
  EXPECT_FALSE(c.connected());
  t0 = std::chrono::steady_clock::now();
  world.clear();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
}

// Worker processes: the test binary re-executes itself to run only the
// RendezvousChild test below, told what to do through ERUN_TEST_RDZV_CHILD
// ("PORT HOST MODE"). fork+exec keeps the child free of the parent's threads.
pid_t spawn_worker(int port, const std::string& host, const std::string& mode) {
  std::string var = fmt::format("ERUN_TEST_RDZV_CHILD={} {} {}", port, host, mode);
  std::vector<std::string> args = {"/proc/self/exe", "--gtest_filter=RendezvousChild.DISABLED_Worker",
                                   "--gtest_also_run_disabled_tests", "--gtest_brief=1"};
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (char** e = environ; *e; ++e) envp.push_back(*e);
  envp.push_back(var.data());
  envp.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  return pid;
}

TEST(RendezvousChild, DISABLED_Worker) {
  const char* spec = std::getenv("ERUN_TEST_RDZV_CHILD");
  if (!spec) GTEST_SKIP() << "only run as a child of the tests below";
  int port = 0;
  char host[64] = {}, mode[16] = {};
  ASSERT_EQ(std::sscanf(spec, "%d %63s %15s", &port, host, mode), 3);
  RendezvousClient c(client_options(port));
  ASSERT_TRUE(c.connect().is_ok());
  long g = -1;
  auto r = c.join(join_request(host, 0), &g);
  ASSERT_TRUE(r.is_ok()) << r.message();
  if (std::string(mode) == "hang") {
    ::pause();  // until killed
    return;
  }
  EXPECT_EQ(g, 4);
  c.store().set("rank/" + std::to_string(r->rank), {host[0]});
  for (int k = 0; k < r->size; ++k) {
    EXPECT_EQ(c.store().get("rank/" + std::to_string(k), std::chrono::seconds(20)).size(), 1u);
  }
}

int wait_exit(pid_t pid, Duration timeout = 30s) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::this_thread::sleep_for(5ms);
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  return -1;
}

TEST(RendezvousServer, WorkerProcessesJoinAndExchangeKeys) {
  auto server = start_server();
  const int n = 6;
  std::vector<pid_t> kids;
  for (int i = 0; i < n; ++i) kids.push_back(spawn_worker(server->port(), "proc" + std::to_string(i), "exchange"));
  bool all_waiting = wait_for([&] { return server->waiting().size() == n; });
  std::vector<RankAssignment> ranks;
  for (int i = 0; i < n; ++i) ranks.push_back(rank_of("proc" + std::to_string(i), 0, n - 1 - i, n));
  if (all_waiting) server->publish(4, ranks);
  for (pid_t p : kids) EXPECT_EQ(wait_exit(p), 0);
  EXPECT_TRUE(all_waiting);
  EXPECT_TRUE(wait_for([&] { return server->snapshot().disconnected.size() > 0; }));
}

TEST(RendezvousServer, SnapshotReportsAKilledWorkerDisconnectedOnce) {
  auto server = start_server();
  int port = server->port();
  auto survivor = start_join(port, "alive", 0);
  pid_t victim = spawn_worker(port, "doomed", "hang");
  bool both = wait_for([&] { return server->waiting().size() == 2; });
  if (!both) {
    ::kill(victim, SIGKILL);
    wait_exit(victim);
    FAIL() << "the worker process did not join";
  }
  server->publish(1, {rank_of("alive", 0, 0, 2), rank_of("doomed", 0, 1, 2)});
  ASSERT_TRUE(survivor->assignment.get().is_ok());
  EXPECT_TRUE(wait_for([&] { return server->members().size() == 2; }));
  EXPECT_TRUE(server->snapshot().disconnected.empty());
  ::kill(victim, SIGKILL);
  EXPECT_EQ(wait_exit(victim), 128 + SIGKILL);
  std::vector<SlotKey> gone;
  ASSERT_TRUE(wait_for([&] {
    auto d = server->snapshot().disconnected;
    gone.insert(gone.end(), d.begin(), d.end());
    return !gone.empty();
  }));
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(gone[0], (SlotKey{"doomed", 0}));
  EXPECT_EQ(server->members().size(), 1u);
  EXPECT_TRUE(server->snapshot().disconnected.empty());
}

// The snapshot's lists follow each connection through a generation change
// (they are indexes kept as things happen, not a scan): members of the last
// generation are no members of the next until they are assigned in it, a
// re-join moves a member to the waiting list, a slot left out keeps waiting,
// and a closed member leaves both lists; everything in slot order.
TEST(RendezvousServer, SnapshotListsFollowJoinsPublishesAndClosesInSlotOrder) {
  auto server = start_server();
  auto world = joined_world(*server, 3);  // h0, h1, h2 members of gen 1
  auto slots = [](const std::vector<JoinRequest>& v) {
    std::vector<std::string> out;
    for (auto& j : v) out.push_back(j.slot.host);
    return out;
  };
  auto s1 = server->snapshot();
  EXPECT_EQ(slots(s1.members), (std::vector<std::string>{"h0", "h1", "h2"}));
  EXPECT_TRUE(s1.waiting.empty());
  // h2 and h0 re-join (gen 1 -> next); h1 stays a member of gen 1.
  auto rejoin = [&](Joined& j, const std::string& host) {
    j.assignment = std::async(std::launch::async, [&j, host] { return j.client->join(join_request(host, 0), &j.gen); });
  };
  rejoin(*world[2], "h2");
  rejoin(*world[0], "h0");
  ASSERT_TRUE(wait_for([&] { return server->snapshot().waiting.size() == 2; }));
  auto s2 = server->snapshot();
  EXPECT_EQ(slots(s2.waiting), (std::vector<std::string>{"h0", "h2"}));
  EXPECT_EQ(slots(s2.members), (std::vector<std::string>{"h1"}));
  // Gen 2 holds h2 only: h1 (gen 1's member) is no member of gen 2, h0 keeps waiting.
  server->publish(2, {rank_of("h2", 0, 0, 1)});
  auto a2 = world[2]->assignment.get();
  ASSERT_TRUE(a2.is_ok()) << a2.message();
  EXPECT_EQ(world[2]->gen, 2);
  auto s3 = server->snapshot();
  EXPECT_EQ(s3.generation, 2);
  EXPECT_EQ(slots(s3.members), (std::vector<std::string>{"h2"}));
  EXPECT_EQ(slots(s3.waiting), (std::vector<std::string>{"h0"}));
  EXPECT_FALSE(ready(world[0]->assignment));
  // A closed member leaves the lists and is reported once.
  world[2].reset();
  ASSERT_TRUE(wait_for([&] { return server->members().empty(); }));
  auto s4 = server->snapshot();
  EXPECT_TRUE(s4.members.empty());
  EXPECT_EQ(slots(s4.waiting), (std::vector<std::string>{"h0"}));
  ASSERT_EQ(s4.disconnected.size(), 1u);
  EXPECT_EQ(s4.disconnected[0], (SlotKey{"h2", 0}));
  // h0 is assigned in gen 3 and becomes the only member.
  server->publish(3, {rank_of("h0", 0, 0, 1)});
  ASSERT_TRUE(world[0]->assignment.get().is_ok());
  auto s5 = server->snapshot();
  EXPECT_EQ(slots(s5.members), (std::vector<std::string>{"h0"}));
  EXPECT_TRUE(s5.waiting.empty());
}

TEST(RendezvousServer, ThousandClientsJoinOneGeneration) {
  auto server = start_server();
  const int n = 1000;
  std::vector<std::unique_ptr<RendezvousClient>> clients(n);
  std::vector<std::optional<Result<RankAssignment>>> results(n);
  std::vector<std::thread> threads;
  threads.reserve(n);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      auto o = client_options(server->port());
      o.io_timeout = 30s;
      clients[i] = std::make_unique<RendezvousClient>(o);
      auto s = clients[i]->connect();
      if (!s.is_ok()) {
        results[i] = Result<RankAssignment>(s);
        return;
      }
      results[i] = clients[i]->join(join_request("node" + std::to_string(i / 8), i % 8), nullptr);
    });
  }
  ASSERT_TRUE(wait_for([&] { return server->waiting().size() == n; }, 60s));
  auto t_joined = std::chrono::steady_clock::now();
  std::vector<RankAssignment> ranks;
  for (int i = 0; i < n; ++i) ranks.push_back(rank_of("node" + std::to_string(i / 8), i % 8, i, n));
  server->publish(1, ranks);
  for (auto& t : threads) t.join();
  auto t_done = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) {
    ASSERT_TRUE(results[i].has_value());
    ASSERT_TRUE(results[i]->is_ok()) << results[i]->message();
    EXPECT_EQ((*results[i])->rank, i);
  }
  std::printf("[ rendezvous ] %d clients: connect+auth+join %.3f s, publish->all assigned %.3f s, total %.3f s\n",
              n, seconds(t_joined - t0), seconds(t_done - t_joined), seconds(t_done - t0));
  EXPECT_EQ(server->refused(), 0);
  auto t_close = std::chrono::steady_clock::now();
  clients.clear();
  std::printf("[ rendezvous ] closing %d clients %.3f s\n", n, seconds(std::chrono::steady_clock::now() - t_close));
}

// Every failed-rank state travels in JOIN; one past the last is malformed.
TEST(RendezvousWire, EveryFailedStateRoundTripsAndAnUnknownOneIsRefused) {
  JoinRequest j;
  j.slot = SlotKey{"h0", 1};
  j.pid = 42;
  j.reason = JoinReason::kPeerLost;
  j.failed_rank = 3;
  for (PeerState state : {PeerState::kUnknown, PeerState::kDead, PeerState::kAlive, PeerState::kSilent}) {
    j.failed_state = state;
    auto back = wire::decode_join(wire::encode_join(j));
    ASSERT_TRUE(back) << to_string(state);
    EXPECT_EQ(back->failed_state, state);
    EXPECT_EQ(back->failed_rank, 3);
  }
  std::string bad = wire::encode_join(j);
  // failed_state is the byte before the pre-flight fields' twelve and the
  // commit's age (four)
  bad[bad.size() - 17] = static_cast<char>(static_cast<uint8_t>(PeerState::kSilent) + 1);
  EXPECT_FALSE(wire::decode_join(bad));
}

// The optional fields at JOIN's end, each added later: the pre-flight link
// probe's time and the responder's port, then the commit's age. A JOIN from
// before a field (cut where it starts) is whole, with none of it; a port
// past 65535 is malformed.
TEST(RendezvousWire, TheOptionalTrailingFieldsRoundTripAndAnOlderJoinHasNone) {
  JoinRequest j;
  j.slot = SlotKey{"h0", 1};
  j.pid = 42;
  j.commit_id = 9;
  j.probe_us = 61000;
  j.link_us = 2345;
  j.probe_port = 40001;
  j.commit_age_ms = 2150;
  const std::string whole = wire::encode_join(j);
  auto back = wire::decode_join(whole);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->probe_us, 61000u);
  EXPECT_EQ(back->link_us, 2345u);
  EXPECT_EQ(back->probe_port, 40001u);
  EXPECT_EQ(back->commit_age_ms, 2150u);
  // Before the commit's age.
  back = wire::decode_join(whole.substr(0, whole.size() - 4));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->probe_port, 40001u);
  EXPECT_EQ(back->commit_age_ms, 0u);
  // Before the link probe's fields.
  back = wire::decode_join(whole.substr(0, whole.size() - 12));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->probe_us, 61000u);
  EXPECT_EQ(back->link_us, 0u);
  EXPECT_EQ(back->probe_port, 0u);
  j.probe_port = 65536;
  EXPECT_FALSE(wire::decode_join(wire::encode_join(j)));
}

TEST(RendezvousServer, ReJoinTellsTheSnapshotItsReasonAndTheRankThatFailedIt) {
  auto server = start_server();
  auto world = joined_world(*server, 2);
  auto first = server->snapshot();
  EXPECT_TRUE(first.rejoined.empty());  // first joins are not re-joins
  ASSERT_EQ(first.members.size(), 2u);
  EXPECT_EQ(first.generation, 1);

  JoinRequest req = join_request("h0", 0, 11);
  req.reason = JoinReason::kPeerLost;
  req.failed_rank = 1;
  req.failed_state = PeerState::kAlive;
  auto* raw = world[0].get();
  auto again = std::async(std::launch::async, [raw, req] { return raw->client->join(req, &raw->gen); });
  ASSERT_TRUE(wait_for([&] { return server->waiting().size() == 1; }));
  auto s = server->snapshot();
  ASSERT_EQ(s.rejoined.size(), 1u);
  EXPECT_EQ(s.rejoined[0].slot, (SlotKey{"h0", 0}));
  EXPECT_EQ(s.rejoined[0].reason, JoinReason::kPeerLost);
  EXPECT_EQ(s.rejoined[0].left_generation, 1);
  EXPECT_EQ(s.rejoined[0].failed_rank, 1);
  EXPECT_EQ(s.rejoined[0].failed_state, PeerState::kAlive);
  EXPECT_EQ(s.rejoined[0].commit_id, 11u);
  EXPECT_EQ(s.rejoined[0].pid, ::getpid());
  ASSERT_EQ(s.waiting.size(), 1u);
  ASSERT_EQ(s.members.size(), 1u);
  EXPECT_EQ(s.members[0].slot, (SlotKey{"h1", 0}));
  EXPECT_TRUE(server->snapshot().rejoined.empty());  // each event once
  server->publish(2, {rank_of("h0", 0, 0, 1)});
  EXPECT_TRUE(again.get().is_ok());
}

TEST(RendezvousServer, AJoinFromAnotherProcessSupersedesTheSlotsConnectedHolder) {
  auto server = start_server();
  JoinRequest old_req = join_request("x", 0);
  old_req.pid = 100;
  auto old = start_join_request(server->port(), old_req);
  ASSERT_TRUE(wait_for([&] { return server->waiting().size() == 1; }));
  JoinRequest new_req = join_request("x", 0);
  new_req.pid = 200;
  auto fresh = start_join_request(server->port(), new_req);
  auto r = old->assignment.get();
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.message().find("taken over by process 200"), std::string::npos) << r.message();
  EXPECT_TRUE(wait_for([&] { return !old->client->connected(); }));
  auto s = server->snapshot();
  ASSERT_EQ(s.waiting.size(), 1u);
  EXPECT_EQ(s.waiting[0].pid, 200);
  EXPECT_TRUE(s.disconnected.empty());  // the slot has a live worker
  server->publish(1, {rank_of("x", 0, 0, 1)});
  EXPECT_TRUE(fresh->assignment.get().is_ok());
}

TEST(RendezvousServer, TheSameProcessReconnectingReplacesItsOldConnection) {
  auto server = start_server();
  auto old = start_join(server->port(), "x", 0);
  ASSERT_TRUE(wait_for([&] { return server->waiting().size() == 1; }));
  auto fresh = start_join(server->port(), "x", 0);  // same pid
  EXPECT_FALSE(old->assignment.get().is_ok());
  ASSERT_TRUE(wait_for([&] { return server->waiting().size() == 1 && !old->client->connected(); }));
  server->publish(1, {rank_of("x", 0, 0, 1)});
  EXPECT_TRUE(fresh->assignment.get().is_ok());
}

TEST(RendezvousServer, DisconnectedSlotsAreReportedOnceHoweverOftenTheyDrop) {
  auto server = start_server();
  for (int i = 0; i < 20; ++i) {
    // A worker process that dies while it waits in its join (its connection
    // closes); a client object cannot be destroyed under its own join.
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      RendezvousClient c(client_options(server->port()));
      long g = -1;
      if (c.connect().is_ok()) (void)c.join(join_request("flaky", 0), &g);
      ::_exit(0);
    }
    const bool waiting = wait_for([&] { return server->waiting().size() == 1; });
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    ASSERT_TRUE(waiting);
    ASSERT_TRUE(wait_for([&] { return server->waiting().empty(); }));
  }
  auto s = server->snapshot();
  ASSERT_EQ(s.disconnected.size(), 1u);
  EXPECT_EQ(s.disconnected[0], (SlotKey{"flaky", 0}));
  EXPECT_TRUE(server->snapshot().disconnected.empty());
}

}  // namespace
}  // namespace erun::testing
