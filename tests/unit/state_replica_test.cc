// Commit replicas (commits/replica.h): a holder pushes the newest whole commit
// of each State number to a keeper over loopback TCP; the keeper's files then
// hold it whole for HostCommits::newest(), a commit cut short or declared
// torn never replaces the previous one, and a peer without the job secret
// stores nothing.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <set>
#include <thread>

#include "commits/host_commits.h"
#include "commits/replica.h"
#include "commits/snapshot.h"
#include "common/codec.h"
#include "erun/errors.hpp"
#include "support/erun_process.h"
#include "support/process_utils.h"

namespace erun {
namespace {

namespace si = state_internal;
using namespace std::chrono_literals;

std::vector<char> fill(uint64_t id, size_t n, int salt) {
  std::vector<char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<char>((id * 31 + i * 7 + static_cast<uint64_t>(salt)) % 251);
  return v;
}

void commit(si::HostCommits& h, uint64_t id, size_t n) {
  static const std::string a = "a", b = "b";
  auto da = fill(id, n, 1), db = fill(id, n / 3 + 1, 2);
  ASSERT_FALSE(h.write(id, {si::EntryRef::of(a, da), si::EntryRef::of(b, db)}, nullptr, si::kRankZeroCommit));
}

void expect_commit(const std::optional<si::HostCommits::Found>& f, uint64_t id, size_t n) {
  ASSERT_TRUE(f) << "no whole commit";
  EXPECT_EQ(f->snapshot.commit_id, id);
  ASSERT_EQ(f->snapshot.entries.size(), 2u);
  EXPECT_EQ(f->snapshot.entries[0].first, "a");
  EXPECT_EQ(f->snapshot.entries[0].second, fill(id, n, 1)) << "commit " << id;
  EXPECT_EQ(f->snapshot.entries[1].second, fill(id, n / 3 + 1, 2)) << "commit " << id;
}

// A keeper serving the connections that come to its listener, one at a time,
// on a thread of its own.
class Keeper {
 public:
  Keeper(std::string dir, const std::string& secret) : dir_(std::move(dir)) {
    auto addrs = net::resolve("127.0.0.1", "0");
    EXPECT_TRUE(addrs.is_ok());
    listener_ = net::listen(addrs.value().front(), 8);
    EXPECT_TRUE(listener_.ok());
    address_ = net::local_address(listener_.fd.get());
    store_ = std::make_unique<si::ReplicaStore>(dir_, std::make_shared<handshake::Key>(secret));
  }
  // Serves the next connection; its outcome: "stored N" or the error.
  std::future<std::string> serve_next() {
    return std::async(std::launch::async, [this] {
      pollfd p{listener_.fd.get(), POLLIN, 0};
      if (::poll(&p, 1, 10000) != 1) return std::string("no connection");
      Fd c = net::accept(listener_.fd.get());
      try {
        return "stored " + std::to_string(store_->serve(c.get(), "a test pusher", 5s));
      } catch (const Error& e) {
        return std::string(e.what());
      }
    });
  }
  // Whether a connection is waiting that nobody accepted.
  bool connection_waiting() {
    pollfd p{listener_.fd.get(), POLLIN, 0};
    return ::poll(&p, 1, 200) == 1;
  }
  const net::Address& address() const { return address_; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  net::Socket listener_;
  net::Address address_;
  std::unique_ptr<si::ReplicaStore> store_;
};

std::vector<si::Pushed> push(si::ReplicaPusher& p) {
  std::vector<si::Pushed> pushed;
  p.push(5s, &pushed);
  return pushed;
}

class ReplicaTest : public ::testing::Test {
 protected:
  testing::TempDir root_;
  const std::string holder_ = root_.file("holder");
  const std::string kept_ = root_.file("keeper");
  const std::string secret_ = "replica-test-secret";
};

TEST_F(ReplicaTest, TheNewestCommitOfEachStateLandsWholeAtTheKeeperAndOnlyNewerOnesFollow) {
  si::HostCommits rank0(holder_ + "/slot-h-0"), rank1(holder_ + "/slot-h-1");
  si::HostCommits second(si::HostCommits::stem_of(holder_ + "/slot-h-0", 1));
  commit(rank0, 1, 5000);
  commit(rank0, 2, 5000);
  commit(rank1, 2, 5000);
  commit(second, 7, 3 << 20);  // more than one chunk
  Keeper keeper(kept_, secret_);
  si::ReplicaPusher pusher(holder_, std::make_shared<handshake::Key>(secret_));
  pusher.target(keeper.address(), kept_);
  auto served = keeper.serve_next();
  auto pushed = push(pusher);
  ASSERT_EQ(pushed.size(), 2u);
  EXPECT_EQ(served.get(), "stored 2");
  expect_commit(si::HostCommits::newest(kept_, 0), 2, 5000);
  expect_commit(si::HostCommits::newest(kept_, 1), 7, 3 << 20);
  EXPECT_EQ(si::HostCommits::newest(kept_, 0)->path, kept_ + "/replica.a");
  // Nothing newer: no connection at all.
  EXPECT_TRUE(push(pusher).empty());
  EXPECT_FALSE(keeper.connection_waiting());
  // One State moved on: only its commit goes, into the keeper's other file.
  commit(rank0, 3, 5000);
  served = keeper.serve_next();
  pushed = push(pusher);
  ASSERT_EQ(pushed.size(), 1u);
  EXPECT_EQ(pushed[0].ordinal, 0);
  EXPECT_EQ(pushed[0].id, 3u);
  EXPECT_EQ(served.get(), "stored 1");
  expect_commit(si::HostCommits::newest(kept_, 0), 3, 5000);
  // A new target gets everything again.
  pusher.target(keeper.address(), kept_);
  served = keeper.serve_next();
  EXPECT_EQ(push(pusher).size(), 2u);
  EXPECT_EQ(served.get(), "stored 2");
}

TEST_F(ReplicaTest, APusherWithoutTheJobSecretStoresNothing) {
  si::HostCommits rank0(holder_ + "/slot-h-0");
  commit(rank0, 4, 1000);
  Keeper keeper(kept_, secret_);
  si::ReplicaPusher stranger(holder_, std::make_shared<handshake::Key>("another-jobs-secret"));
  stranger.target(keeper.address(), kept_);
  auto served = keeper.serve_next();
  EXPECT_THROW(push(stranger), Error);
  EXPECT_NE(served.get().find("could not prove the job secret"), std::string::npos);
  EXPECT_FALSE(si::HostCommits::newest(kept_, 0));
  // Proofs are bound to the keeper's directory: the right secret for another keeper fails too.
  si::ReplicaPusher misdirected(holder_, std::make_shared<handshake::Key>(secret_));
  misdirected.target(keeper.address(), root_.file("another-keeper"));
  served = keeper.serve_next();
  EXPECT_THROW(push(misdirected), Error);
  EXPECT_NE(served.get().find("could not prove the job secret"), std::string::npos);
  EXPECT_FALSE(si::HostCommits::newest(kept_, 0));
}

// A hand-made pusher: speaks the exchange step by step, to cut it anywhere.
class RawPusher {
 public:
  RawPusher(const Keeper& k, const std::string& secret) {
    sock_ = net::connect(k.address(), std::chrono::steady_clock::now() + 5s);
    EXPECT_TRUE(sock_.ok());
    handshake::Initiator hs;
    PayloadWriter hello;
    hello.fixed(std::string_view(si::kReplicaMagic, 8)).u32(si::kReplicaVersion).fixed(hs.nonce());
    send(hello.str());
    EXPECT_TRUE(hs.challenged(recv(handshake::kNonceBytes)));
    auto proofs = si::replica_proofs(std::make_shared<handshake::Key>(secret), k.dir());
    send(hs.proof(proofs));
    EXPECT_TRUE(hs.verify(proofs, recv(handshake::kMacBytes)));
  }
  void header(uint64_t id, uint32_t count, uint64_t each, const std::string& source = "", uint64_t keep = 0) {
    PayloadWriter w;
    w.u32(0).u32(0).u64(id).u32(count).u64(count * each);
    for (uint32_t k = 0; k < count; ++k) w.bytes(k == 0 ? "a" : "b").u64(each);
    w.bytes(source).u64(keep);
    send(w.str());
  }
  void send(std::string_view s) { ASSERT_TRUE(net::send_all(sock_.fd.get(), s, deadline()).ok()); }
  std::string recv(size_t n) {
    std::string s(n, '\0');
    EXPECT_TRUE(net::recv_exact(sock_.fd.get(), s.data(), n, deadline()).ok());
    return s;
  }
  void close() { sock_.fd.reset(); }
  // Closes with a reset (RST) rather than a FIN.
  void reset() {
    linger l{1, 0};
    ::setsockopt(sock_.fd.get(), SOL_SOCKET, SO_LINGER, &l, sizeof l);
    sock_.fd.reset();
  }

 private:
  static TimePoint deadline() { return std::chrono::steady_clock::now() + 5s; }
  net::Socket sock_;
};

TEST_F(ReplicaTest, ACommitCutShortOrDeclaredTornNeverReplacesThePreviousOne) {
  si::HostCommits rank0(holder_ + "/slot-h-0");
  commit(rank0, 5, 1000);
  Keeper keeper(kept_, secret_);
  si::ReplicaPusher pusher(holder_, std::make_shared<handshake::Key>(secret_));
  pusher.target(keeper.address(), kept_);
  auto served = keeper.serve_next();
  ASSERT_EQ(push(pusher).size(), 1u);
  EXPECT_EQ(served.get(), "stored 1");
  {
    // The source's worker began to overwrite it under the copy: verdict 0.
    served = keeper.serve_next();
    RawPusher raw(keeper, secret_);
    raw.header(6, 2, 100);
    EXPECT_EQ(raw.recv(1), std::string("\1"));
    raw.send(std::string(200, 'x'));
    raw.send(std::string_view("\0", 1));
    EXPECT_EQ(raw.recv(1), std::string("\0", 1));  // not stored
    raw.close();
    EXPECT_EQ(served.get(), "stored 0");
    expect_commit(si::HostCommits::newest(kept_, 0), 5, 1000);
  }
  {
    // The pusher's host died in the middle of the bytes.
    served = keeper.serve_next();
    RawPusher raw(keeper, secret_);
    raw.header(7, 2, 1 << 20);
    EXPECT_EQ(raw.recv(1), std::string("\1"));
    raw.send(std::string(1 << 20, 'y'));
    raw.close();
    EXPECT_NE(served.get().find("connection closed"), std::string::npos);
    expect_commit(si::HostCommits::newest(kept_, 0), 5, 1000);
  }
  {
    // An authenticated peer's malformed header: an error, nothing laid out.
    served = keeper.serve_next();
    RawPusher raw(keeper, secret_);
    PayloadWriter w;
    w.u32(0).u32(0).u64(8).u32(3).u64(10).bytes("a").u64(1000);  // sizes beyond the total
    raw.send(w.str());
    EXPECT_NE(served.get().find("exceed the commit's"), std::string::npos);
    expect_commit(si::HostCommits::newest(kept_, 0), 5, 1000);
  }
  {
    // The pusher's connection reset right after a header: the keeper's
    // answer may fail to go out; the commit laid out for it is abandoned
    // either way (the next one below is not refused as "still being copied").
    served = keeper.serve_next();
    RawPusher raw(keeper, secret_);
    raw.header(8, 2, 100);
    raw.reset();
    EXPECT_NE(served.get().find("commit replica exchange"), std::string::npos);
    expect_commit(si::HostCommits::newest(kept_, 0), 5, 1000);
  }
  // And the next whole commit goes on as before.
  commit(rank0, 9, 1000);
  served = keeper.serve_next();
  ASSERT_EQ(push(pusher).size(), 1u);
  EXPECT_EQ(served.get(), "stored 1");
  expect_commit(si::HostCommits::newest(kept_, 0), 9, 1000);
}

// A sharded State's commit in a worker's file: its rows of "w" (a pattern of
// the commit, the worker and `n`) and a shard table (contents not read here).
void commit_rows(si::HostCommits& h, uint64_t id, int worker, size_t n) {
  static const std::string w = "w", table = si::kShardTable;
  auto rows = fill(id, n, 10 + worker);
  const std::vector<char> t(8, static_cast<char>(worker));
  ASSERT_FALSE(h.write(id, {si::EntryRef::of(w, rows), si::EntryRef::of(table, t)}, nullptr, 0));
}

void expect_rows(const std::string& path, uint64_t id, int worker, size_t n) {
  auto snap = si::HostCommits::read(path);
  ASSERT_TRUE(snap) << path << " holds no whole commit";
  EXPECT_EQ(snap->commit_id, id) << path;
  ASSERT_FALSE(snap->entries.empty());
  EXPECT_EQ(snap->entries[0].second, fill(id, n, 10 + worker)) << path;
}

// Each worker's file of a sharded State holds other rows: each one's newest
// commit has a replica pair of its own at the keeper (where a sync reads its
// pieces as a dead worker's), sent once every worker wrote it (the keeper
// keeps two commits per file: pairs pushed a commit apart could leave it no
// commit of every worker's rows); a file further behind is a slot no
// worker uses. A stem that is no worker's is refused; the keeper's replicas
// go once its host's own workers hold a commit as new.
TEST_F(ReplicaTest, EachWorkersFileOfAShardedStateHasAReplicaOfItsOwn) {
  si::HostCommits w0(holder_ + "/slot-h-0"), w1(holder_ + "/slot-h-1"), unused(holder_ + "/slot-h-2");
  commit_rows(unused, 1, 2, 300);
  commit_rows(w0, 3, 0, 4000);
  commit_rows(w1, 3, 1, 5000);
  commit_rows(w0, 4, 0, 4000);  // worker 1 is still writing commit 4
  Keeper keeper(kept_, secret_);
  si::ReplicaPusher pusher(holder_, std::make_shared<handshake::Key>(secret_));
  pusher.target(keeper.address(), kept_);
  EXPECT_TRUE(push(pusher).empty());
  EXPECT_FALSE(keeper.connection_waiting());
  EXPECT_EQ(pusher.kept_whole(0), 0u);
  commit_rows(w1, 4, 1, 5000);
  auto served = keeper.serve_next();
  auto pushed = push(pusher);
  EXPECT_EQ(served.get(), "stored 2");
  std::set<std::string> sources;
  for (const si::Pushed& p : pushed) sources.insert(p.source + "@" + std::to_string(p.id));
  EXPECT_EQ(sources, (std::set<std::string>{"slot-h-0@4", "slot-h-1@4"}));
  expect_rows(kept_ + "/replica-of-slot-h-0.a", 4, 0, 4000);
  expect_rows(kept_ + "/replica-of-slot-h-1.a", 4, 1, 5000);
  EXPECT_EQ(pusher.kept_whole(0), 4u);
  EXPECT_TRUE(push(pusher).empty());
  EXPECT_FALSE(keeper.connection_waiting());
  // The next commit goes into each pair's other file.
  commit_rows(w0, 5, 0, 4000);
  commit_rows(w1, 5, 1, 5000);
  served = keeper.serve_next();
  EXPECT_EQ(push(pusher).size(), 2u);
  EXPECT_EQ(served.get(), "stored 2");
  expect_rows(kept_ + "/replica-of-slot-h-0.b", 5, 0, 4000);
  expect_rows(kept_ + "/replica-of-slot-h-1.b", 5, 1, 5000);
  EXPECT_FALSE(std::filesystem::exists(kept_ + "/replica-of-slot-h-2.a"));

  EXPECT_EQ(pusher.kept_whole(0), 5u);

  // Worker 1's next two pushes are cut short (its host died mid-copy, say),
  // worker 0's go through, each asking to keep commit 5: both pairs still
  // hold it, so the keeper keeps a commit of every worker's rows. (Without
  // the keep, worker 0's pair would hold 6 and 7 and worker 1's 5 only.)
  for (uint64_t id : {6, 7}) {
    served = keeper.serve_next();
    {
      RawPusher raw(keeper, secret_);
      raw.header(id, 2, 10, "slot-h-0", 5);
      EXPECT_EQ(raw.recv(1), std::string("\1"));
      raw.send(std::string(20, 'z'));
      raw.send(std::string_view("\1", 1));
      EXPECT_EQ(raw.recv(1), std::string("\1"));
      raw.header(id, 2, 10, "slot-h-1", 5);
      EXPECT_EQ(raw.recv(1), std::string("\1"));
      raw.send(std::string(7, 'z'));
      raw.close();
    }
    EXPECT_NE(served.get().find("connection closed"), std::string::npos);
  }
  expect_rows(kept_ + "/replica-of-slot-h-0.b", 5, 0, 4000);
  expect_rows(kept_ + "/replica-of-slot-h-1.b", 5, 1, 5000);
  EXPECT_EQ(si::HostCommits::read(kept_ + "/replica-of-slot-h-0.a")->commit_id, 7u);

  for (const std::string& bad : std::vector<std::string>{"../slot-h-0", "replica-of-slot-h-0", "slot-h-0-s3", ".a",
                                                          std::string("slot\0x", 6), "slot-\n"}) {
    served = keeper.serve_next();
    RawPusher raw(keeper, secret_);
    raw.header(9, 2, 10, bad);
    EXPECT_NE(served.get().find("is not a worker's stem of State 0"), std::string::npos) << bad;
  }
  expect_rows(kept_ + "/replica-of-slot-h-0.b", 5, 0, 4000);
  // While workers run here, a sharded State's replicas are the State's to
  // remove (one worker's file as new says nothing of the others' rows).
  si::HostCommits own(kept_ + "/slot-k-0");
  commit_rows(own, 9, 2, 100);
  si::RemovedReplicas r = si::remove_replicas(kept_, false);
  EXPECT_TRUE(r.names.empty());
  EXPECT_EQ(r.left, 4);
  r = si::remove_replicas(kept_, true);

  EXPECT_EQ(std::set<std::string>(r.names.begin(), r.names.end()),
            (std::set<std::string>{"replica-of-slot-h-0.a", "replica-of-slot-h-0.b", "replica-of-slot-h-1.a",
                                   "replica-of-slot-h-1.b"}));
}

// What a keeper leaves: once its host's workers hold a commit as new, a
// replica adds nothing and goes; with `all` every replica goes; a worker's
// file, or a link in the keeper's place, never does.
TEST_F(ReplicaTest, RemovingReplicasTakesOnlyThoseAWorkersCommitMakesRedundant) {
  const std::string dir = kept_;
  auto names = [&] {
    std::set<std::string> out;
    for (auto& e : std::filesystem::directory_iterator(dir)) out.insert(e.path().filename().string());
    return out;
  };
  {
    si::HostCommits replica(dir + "/" + si::kReplicaStem);
    si::HostCommits replica1(si::HostCommits::stem_of(dir + "/" + si::kReplicaStem, 1));
    commit(replica, 5, 1000);
    commit(replica1, 7, 1000);
  }
  si::HostCommits own(dir + "/slot-h-0");
  si::HostCommits own1(si::HostCommits::stem_of(dir + "/slot-h-0", 1));
  commit(own, 4, 1000);  // older than the replica of State 0
  commit(own1, 9, 1000);  // newer than the replica of State 1
  const std::string outside = root_.file("outside");
  { std::ofstream(outside) << "not a keeper's"; }
  ASSERT_EQ(::symlink(outside.c_str(), (dir + "/replica-s2.a").c_str()), 0);

  si::RemovedReplicas r = si::remove_replicas(dir, false);
  EXPECT_EQ(std::set<std::string>(r.names.begin(), r.names.end()),
            (std::set<std::string>{"replica-s1.a", "replica-s1.b"}));
  EXPECT_GT(r.bytes, 1000u);  // one commit of 1000 + 334 bytes and its table
  EXPECT_EQ(r.left, 2);  // replica.a and .b: State 0's newest is still the replica's
  expect_commit(si::HostCommits::newest(dir, 0), 5, 1000);
  // As new: the replica goes.
  commit(own, 5, 1000);
  r = si::remove_replicas(dir, false);
  EXPECT_EQ(std::set<std::string>(r.names.begin(), r.names.end()), (std::set<std::string>{"replica.a", "replica.b"}));
  EXPECT_EQ(r.left, 0);
  EXPECT_EQ(names(), (std::set<std::string>{"slot-h-0.a", "slot-h-0.b", "slot-h-0-s1.a", "slot-h-0-s1.b",
                                            "replica-s2.a"}));
  expect_commit(si::HostCommits::newest(dir, 0), 5, 1000);
  expect_commit(si::HostCommits::newest(dir, 1), 9, 1000);
  EXPECT_EQ(testing::read_file(outside), "not a keeper's");

  // `all`: every replica, even the newest commit on this host; the workers'
  // files and the link stay.
  {
    si::HostCommits replica(dir + "/" + si::kReplicaStem);
    commit(replica, 8, 1000);
  }
  r = si::remove_replicas(dir, true);
  EXPECT_EQ(std::set<std::string>(r.names.begin(), r.names.end()), (std::set<std::string>{"replica.a", "replica.b"}));
  EXPECT_EQ(names(), (std::set<std::string>{"slot-h-0.a", "slot-h-0.b", "slot-h-0-s1.a", "slot-h-0-s1.b",
                                            "replica-s2.a"}));
  expect_commit(si::HostCommits::newest(dir, 0), 5, 1000);
  EXPECT_EQ(testing::read_file(outside), "not a keeper's");
  // No directory: nothing.
  EXPECT_TRUE(si::remove_replicas(root_.file("none"), true).names.empty());
}

}  // namespace
}  // namespace erun
