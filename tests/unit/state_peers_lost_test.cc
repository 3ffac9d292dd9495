// The worker's side of PEERS_LOST with real processes: three workers (this
// test binary re-run as erun::init() + State + erun::run(), sharing memory on
// one "host") train against a RendezvousServer that the test drives. One is
// SIGSTOPped: alive, never arriving, so the others' collectives would wait
// out their 120 s collective timeout. The driver's notice must make them
// abort at once wherever it finds them (in a collective, in commit()'s
// agreement, between steps), restore, and re-join saying "peer lost" and
// naming the rank; the next generation without it trains on.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include <fmt/format.h>

#include "common/subprocess.h"
#include "erun/erun.hpp"
#include "rendezvous/rendezvous.h"

namespace erun {
namespace {

using namespace std::chrono_literals;

const std::string kJob = "peers-lost-job";
const std::string kSecret = "peers-lost-secret";
const std::string kHost = "127.0.0.1";

TEST(PeersLostChild, DISABLED_Worker) {
  if (!std::getenv("ERUN_RDZV_ADDR")) GTEST_SKIP() << "only run as a child of the test below";
  Context& ctx = init();
  State state(ctx);
  long step = 0;
  state.register_value("step", &step);
  run(state, [&](State& s) {
    for (; step < 10'000'000; ++step) {
      float v = 1;
      ctx.comm().allreduce(&v, 1, DataType::kFloat32, ReduceOp::kSum);
      if (step % 3 == 0) s.commit();
      std::this_thread::sleep_for(1ms);
    }
  });
}

RankAssignment assignment(int index, int rank, int size) {
  RankAssignment a;
  a.slot = {kHost, index};
  a.rank = rank;
  a.size = size;
  a.local_rank = rank;
  a.local_size = size;
  a.cross_rank = 0;
  a.cross_size = 1;
  return a;
}

bool wait_until(const std::function<bool()>& pred, Duration timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

TEST(PeersLost, SurvivorsOfAStoppedRankAbortAndReJoinWhenTheDriverSaysSo) {
  ServerOptions so;
  so.job_id = kJob;
  so.secret = kSecret;
  so.bind_address = kHost;
  RendezvousServer server(so);
  ASSERT_TRUE(server.start().is_ok());

  std::vector<Subprocess> workers;
  for (int i = 0; i < 3; ++i) {
    SpawnOptions o;
    o.argv = {"/proc/self/exe", "--gtest_also_run_disabled_tests", "--gtest_filter=PeersLostChild.DISABLED_Worker"};
    char self[4096] = {};
    ASSERT_GT(::readlink("/proc/self/exe", self, sizeof(self) - 1), 0);
    o.argv[0] = self;
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) env.emplace_back(*e);
    for (auto kv : {fmt::format("ERUN_RDZV_ADDR={}", kHost), fmt::format("ERUN_RDZV_PORT={}", server.port()),
                    fmt::format("ERUN_JOB_ID={}", kJob), fmt::format("ERUN_SECRET={}", kSecret),
                    fmt::format("ERUN_HOSTNAME={}", kHost), fmt::format("ERUN_LOCAL_INDEX={}", i),
                    fmt::format("ERUN_ADVERTISE_ADDR={}", kHost), std::string("ERUN_COLLECTIVE_TIMEOUT=120")}) {
      env.push_back(kv);
    }
    o.env = env;
    o.pipe_stdout = false;
    o.pipe_stderr = false;
    auto p = Subprocess::spawn(o);
    ASSERT_TRUE(p) << p.message();
    workers.push_back(std::move(p).value());
  }
  auto stop_all = [&] {
    for (auto& w : workers) {
      w.signal(SIGCONT);
      w.signal(SIGKILL);
      w.wait_for(10s);
    }
  };

  ASSERT_TRUE(wait_until([&] { return server.waiting().size() == 3; }, 30s));
  server.publish(1, {assignment(0, 0, 3), assignment(1, 1, 3), assignment(2, 2, 3)});
  ASSERT_TRUE(wait_until([&] { return server.members().size() == 3; }, 30s));
  std::this_thread::sleep_for(1s);  // training: commits and collectives
  for (auto& w : workers) ASSERT_TRUE(w.running());
  (void)server.snapshot();  // forget the first joins

  workers[2].signal(SIGSTOP);
  std::this_thread::sleep_for(200ms);  // the others now wait for it in a collective
  auto told = std::chrono::steady_clock::now();
  server.notify_peers_lost(1, {2});
  std::vector<JoinRequest> rejoined;
  bool both = wait_until(
      [&] {
        auto s = server.snapshot();
        rejoined.insert(rejoined.end(), s.rejoined.begin(), s.rejoined.end());
        return rejoined.size() >= 2;
      },
      60s);
  double took = seconds(std::chrono::steady_clock::now() - told);
  if (!both) stop_all();
  ASSERT_TRUE(both) << "the survivors did not re-join after the notice";
  EXPECT_LT(took, 60.0);  // the collective timeout is 120 s: only the notice explains a re-join now
  // A survivor whose collective failed because another one aborted it may
  // re-join before its own notice arrives: it names nobody then, but never a
  // survivor; the first to abort names the lost rank.
  int named = 0;
  for (auto& j : rejoined) {
    EXPECT_EQ(j.reason, JoinReason::kPeerLost) << j.slot.local_index;
    EXPECT_TRUE(j.failed_rank == 2 || j.failed_rank == -1) << j.slot.local_index << " named " << j.failed_rank;
    named += j.failed_rank == 2;
    EXPECT_EQ(j.left_generation, 1) << j.slot.local_index;
    EXPECT_NE(j.slot.local_index, 2);
  }
  EXPECT_GE(named, 1);

  // The next generation, without the stopped worker, trains on: both stay
  // members and nobody leaves it, even when a stale notice about generation
  // 1 comes late.
  server.publish(2, {assignment(0, 0, 2), assignment(1, 1, 2)});
  ASSERT_TRUE(wait_until([&] { return server.members().size() == 2; }, 30s));
  server.notify_peers_lost(1, {2});
  std::this_thread::sleep_for(1s);
  auto s = server.snapshot();
  EXPECT_TRUE(s.rejoined.empty()) << s.rejoined.size() << " re-joined generation 2";
  EXPECT_EQ(s.members.size(), 2u);
  EXPECT_TRUE(workers[0].running());
  EXPECT_TRUE(workers[1].running());
  stop_all();
}

}  // namespace
}  // namespace erun
