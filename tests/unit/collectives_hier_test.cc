// Hierarchical communicator with ranks as threads over a MemoryKvStore,
// pretending to be several hosts (distinct loopback hostnames, local ranks
// given explicitly, ranks interleaved across hosts): every operation against a
// serial reference (erun's TCP transport between the hosts, and Gloo when
// selected); the one-host and one-rank-per-host shortcuts; an uneven
// layout; an abort on one host fails the ranks of the other host promptly;
// a rank that times out while its leader waits for a silent remote host does
// not blame its leader.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "support/collective_checks.h"
#include "support/rank_threads.h"
#include "collectives/hierarchical.h"
#include "store/memory_store.h"

namespace erun {
namespace {

using namespace std::chrono_literals;

struct Place {
  int host;
  int local_rank;
};

// Options for every rank from where each rank lives, with local/cross ranks
// as Horovod defines them.
std::vector<HierOptions> layout(const std::vector<Place>& places, Duration timeout = 60s) {
  const int size = static_cast<int>(places.size());
  std::vector<HierOptions> out(size);
  for (int r = 0; r < size; ++r) {
    HierOptions& o = out[r];
    o.rank = r;
    o.size = size;
    o.local_rank = places[r].local_rank;
    o.local_size = 0;
    o.cross_rank = 0;
    o.cross_size = 0;
    for (int q = 0; q < size; ++q) {
      if (places[q].host == places[r].host) o.local_size++;
      if (places[q].local_rank == places[r].local_rank) {
        if (places[q].host < places[r].host) o.cross_rank++;
        o.cross_size++;
      }
    }
    o.timeout = timeout;
    o.hostname = "127.0.0." + std::to_string(places[r].host + 1);
    o.job_id = "hier-test";
    o.secret = "hier-test-secret";
    o.segment_tag = "hiertest" + std::to_string(::getpid());
    // Whatever the machine's CPUs: the pipelined path is what is checked.
    o.pipeline = HierPipeline::kOn;
  }
  return out;
}

// Runs fn(rank, comm) on every rank; returns every rank's error ("" when none).
std::string run_ranks(const std::vector<HierOptions>& opts, const std::function<std::string(int, Communicator&)>& fn) {
  auto backend = testing::backend(
      "hier", [&](KvStore& store, int rank, int) { return make_hierarchical_communicator(store, opts[rank]); });
  return testing::run_comms_errors(backend, static_cast<int>(opts.size()), fn);
}

// Every operation against the reference (failures are gtest failures).
// 300007 elements: pipelined in chunks (>= 1 MiB) for every type but uint8.
std::string check_everything(int rank, Communicator& comm) {
  testing::check_allreduce_every_cpu_type(rank, comm, {0, 1, 7, 1000, 100003, 300007});
  testing::check_broadcast_from_every_root(rank, comm, {0, 5, 300000});
  testing::check_allgather(rank, comm, {0, 3, 100000});
  testing::check_allgatherv(rank, comm, 1, [](int r, int) -> size_t { return r * 1000 + (r % 2) * 70000; });
  for (int i = 0; i < 5; ++i) comm.barrier();
  return "";
}

TEST(Hierarchical, TwoHostsOfTwoWithInterleavedRanks) {
  // Host 0 holds ranks 0 and 2, host 1 ranks 1 and 3; rank 3 is host 1's leader.
  auto opts = layout({{0, 0}, {1, 1}, {0, 1}, {1, 0}});
  EXPECT_EQ(run_ranks(opts, check_everything), "");
}

TEST(Hierarchical, UnevenHostsIncludingAHostWithOneRank) {
  auto opts = layout({{0, 0}, {0, 1}, {1, 0}, {0, 2}, {2, 0}, {2, 1}});
  EXPECT_EQ(run_ranks(opts, check_everything), "");
}

TEST(Hierarchical, OneHostIsPureSharedMemory) {
  auto opts = layout({{0, 0}, {0, 1}, {0, 2}});
  EXPECT_EQ(run_ranks(opts, check_everything), "");
}

// A host whose /dev/shm had no room (HierOptions::flat): every rank, on
// hosts of several ranks too, is a TCP peer of every other, and no segment
// is made: with files limited to 4 KiB (RLIMIT_FSIZE) any segment fails to
// be reserved, and the same ranks without flat fail.
TEST(Hierarchical, FlatIsTcpAmongEveryRankWithoutASegment) {
  auto opts = layout({{0, 0}, {1, 0}, {0, 1}, {1, 1}, {0, 2}});
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  for (auto& o : opts) o.flat = true;
  const std::string flat = run_ranks(opts, check_everything);
  for (auto& o : opts) {
    o.flat = false;
    o.timeout = 3s;  // the host's other ranks wait this long for the segment that fails
  }
  const std::string shm = run_ranks(opts, [](int, Communicator&) { return std::string(); });
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_EQ(flat, "");
  EXPECT_NE(shm, "") << "a segment could be reserved: the check proves nothing";
}

TEST(Hierarchical, OneRankPerHostIsPureTcp) {
  auto opts = layout({{0, 0}, {1, 0}, {2, 0}});
  EXPECT_EQ(run_ranks(opts, check_everything), "");
}

TEST(Hierarchical, GlooStaysSelectableBetweenHosts) {
  auto opts = layout({{0, 0}, {0, 1}, {1, 0}, {1, 1}});
  for (auto& o : opts) o.cross = CrossTransport::kGloo;
  EXPECT_EQ(run_ranks(opts, check_everything), "");
}

// Two hosts of two: every rank runs `step` once (it returns an error text or
// ""), then rank 3 (host 1's second rank) aborts instead of running it again;
// every other rank's second `step` must throw CommError, well before the 60 s
// timeout.
void expect_abort_fails_every_other_rank(const std::string& what,
                                         const std::function<std::string(Communicator&)>& step) {
  auto opts = layout({{0, 0}, {0, 1}, {1, 0}, {1, 1}}, 60s);
  std::atomic<int> failed{0};
  auto start = std::chrono::steady_clock::now();
  std::string errors = run_ranks(opts, [&](int rank, Communicator& comm) -> std::string {
    if (std::string e = step(comm); !e.empty()) return "the first " + what + ": " + e;
    if (rank == 3) {
      comm.abort();
      return "";
    }
    try {
      step(comm);
    } catch (const CommError&) {
      failed++;
      return "";
    }
    return what + " succeeded although rank 3 aborted";
  });
  EXPECT_EQ(errors, "");
  EXPECT_EQ(failed.load(), 3);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 20s);  // not the 60 s timeout
}

TEST(Hierarchical, AbortOnOneHostFailsEveryRankOnEveryHost) {
  expect_abort_fails_every_other_rank("barrier", [](Communicator& comm) {
    comm.barrier();
    return std::string();
  });
}

TEST(Hierarchical, AbortDuringAPipelinedAllreduceFailsEveryRankPromptly) {
  // A 16 MiB allreduce: host 1's leader fails in shared memory while host 0's
  // leader may be crossing a chunk on its helper thread; nobody waits for a
  // timeout.
  expect_abort_fails_every_other_rank("allreduce", [](Communicator& comm) {
    std::vector<float> v(4 << 20, 1.0f);
    comm.allreduce(v, ReduceOp::kSum);
    return v[12345] == 4.0f ? std::string() : "wrong result " + std::to_string(v[12345]);
  });
}

TEST(Hierarchical, MismatchOnOneHostNamesGlobalRanksAndStopsTheOtherHost) {
  // Host 0 holds ranks 0 and 2, host 1 ranks 1 and 3; rank 2 broadcasts while
  // everyone else allreduces.
  auto opts = layout({{0, 0}, {1, 1}, {0, 1}, {1, 0}}, 60s);
  std::atomic<int> mismatches{0}, comm_errors{0};
  auto start = std::chrono::steady_clock::now();
  std::string errors = run_ranks(opts, [&](int rank, Communicator& comm) -> std::string {
    comm.barrier();
    std::vector<float> g(1000, 1.f);
    try {
      if (rank == 2) {
        comm.broadcast(g.data(), 4096, 0);
      } else {
        comm.allreduce(g, ReduceOp::kSum);
      }
    } catch (const CollectiveMismatch& e) {
      std::string msg = e.what();
      if (rank == 1 || rank == 3) return "host 1 saw a mismatch: " + msg;
      if (msg.find("rank 0 called allreduce(float32 x 1000, sum); rank 2 called broadcast(4096 bytes, root 0)") ==
          std::string::npos) {
        return "message does not name global ranks 0 and 2: " + msg;
      }
      mismatches++;
      return "";
    } catch (const CommError& e) {
      if (rank == 0 || rank == 2) return std::string("CommError on host 0: ") + e.what();
      comm_errors++;
      return "";
    }
    return "no error";
  });
  EXPECT_EQ(errors, "");
  EXPECT_EQ(mismatches.load(), 2);
  EXPECT_EQ(comm_errors.load(), 2);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 20s);  // not the 60 s timeout
}

// Host 1's leader (rank 2) stops answering before an operation (as a lost or
// frozen host would). Host 0's leader waits for it in its cross-host step;
// host 0's other rank (rank 1, shortest timeout) times out on its leader
// meanwhile and must not name it as the failed rank: the driver would kill a
// healthy worker. Host 1's other rank (rank 3), whose leader really stopped
// in shared memory, still names it, alive.
void check_no_blame_of_a_leader_waiting_on_a_remote_host(size_t floats) {
  auto opts = layout({{0, 0}, {0, 1}, {1, 0}, {1, 1}}, 3s);
  opts[1].timeout = 1s;
  opts[3].timeout = 1s;
  std::atomic<int> done{0};
  std::mutex mu;
  std::map<int, CommError> seen;
  std::string errors = run_ranks(opts, [&](int rank, Communicator& comm) -> std::string {
    std::vector<float> v(floats, 1.0f);
    comm.allreduce(v, ReduceOp::kSum);
    if (v[floats - 1] != 4.0f) return "the first allreduce is wrong";
    if (rank == 2) {
      // Silent until the others have given up; leaving closes its sockets.
      auto until = std::chrono::steady_clock::now() + 20s;
      while (done.load() < 3 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(10ms);
      return "";
    }
    try {
      comm.allreduce(v, ReduceOp::kSum);
    } catch (const CommError& e) {
      std::lock_guard<std::mutex> lock(mu);
      seen.emplace(rank, e);
      done++;
      return "";
    }
    done++;
    return "allreduce succeeded although rank 2 is silent";
  });
  EXPECT_EQ(errors, "");
  ASSERT_EQ(seen.size(), 3u);
  const CommError& follower = seen.at(1);
  EXPECT_EQ(follower.failed_rank(), -1) << follower.what();
  EXPECT_EQ(follower.fate(), PeerFate::kUnknown) << follower.what();
  EXPECT_NE(std::string(follower.what()).find("busy in its cross-host step as this host's leader"), std::string::npos)
      << follower.what();
  // The leader's own error is about the other host, never about its own.
  const CommError& leader = seen.at(0);
  EXPECT_NE(leader.failed_rank(), 0) << leader.what();
  EXPECT_NE(leader.failed_rank(), 1) << leader.what();
  // It names host 1's leader by its global rank, as seen only over the network.
  EXPECT_EQ(leader.failed_rank(), 2) << leader.what();
  EXPECT_EQ(leader.fate(), PeerFate::kSilent) << leader.what();
  const CommError& stalled_host = seen.at(3);
  EXPECT_EQ(stalled_host.failed_rank(), 2) << stalled_host.what();
  EXPECT_EQ(stalled_host.fate(), PeerFate::kAlive) << stalled_host.what();
}

TEST(Hierarchical, FollowerDoesNotBlameItsLeaderWaitingOnASilentHost) {
  check_no_blame_of_a_leader_waiting_on_a_remote_host(1000);
}

TEST(Hierarchical, FollowerDoesNotBlameItsLeaderWaitingOnASilentHostWhilePipelining) {
  // 16 MiB: the leader waits for a chunk's cross-host step on its helper thread.
  check_no_blame_of_a_leader_waiting_on_a_remote_host(4 << 20);
}

}  // namespace
}  // namespace erun
