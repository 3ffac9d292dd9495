// Replicas of host-memory commits on spare hosts (docs/state.md, "Replicas on
// spare hosts"). A host whose workers commit pushes the newest whole commit of
// each State number in its commit directory to a keeper (the agent of a host
// of the job that runs no worker): ReplicaPusher on the holder's side,
// ReplicaStore on the keeper's, over TCP after erun's mutual HMAC handshake
// under the job secret. The keeper writes what it receives into its own
// commit directory as the file pair `replica` (replica-s<N> for the States
// after the first), which HostCommits::newest() reads as it reads a worker's:
// workers that later start on the keeper restore from it, should every host
// that ran workers be lost. The bytes go from the holder's file to the
// socket and from the socket into the keeper's mapped file, with no copy of
// the whole state in either process. An object belongs to one thread.
//
// A State with sharded entries (state/shard_exchange.h) holds different
// rows in each worker's file: its replica is every worker's newest commit,
// each in a pair of its own, `replica-of-<the worker's stem>`, whose pieces
// a sync on the keeper's host reads as it reads a dead worker's file.
//
// The exchange (docs/protocol.md, "Commit replicas"), all integers
// little-endian:
//   pusher: "ERUNREPL" u32 version, nonce(32)      keeper: nonce(32)
//   pusher: proof(32)                              keeper: proof(32)
//   per commit, pusher: u32 ordinal, u32 flags, u64 id, u32 entries, u64 bytes,
//     then per entry u32 name length, name, u64 size; then u32 length and
//     the worker's stem (sharded; empty: the State's one replica), u64 the
//     commit the keeper's pair must not write over (0: none)
//   keeper: u8 1 (send) or 0, u32 length, why
//   pusher: the entries' bytes, then u8 1 (the source still held it whole
//     after the copy) or 0 (its worker began to overwrite it)
//   keeper: u8 1 (stored whole) or 0
// The pusher ends the exchange by closing the connection.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "commits/host_commits.h"
#include "common/clock.h"
#include "common/handshake.h"
#include "common/net.h"

namespace erun::state_internal {

inline constexpr char kReplicaMagic[8] = {'E', 'R', 'U', 'N', 'R', 'E', 'P', 'L'};
inline constexpr uint32_t kReplicaVersion = 2;  // 2: the worker's stem (sharded States)
// The stem of the keeper's files within its commit directory.
inline constexpr const char* kReplicaStem = "replica";
// The stem of a sharded State's replica of one worker's file (its stem).
std::string sharded_replica_stem(const std::string& worker_stem);
// Whether `stem` (a file's name without .a/.b) is one of a keeper's pairs.
bool replica_stem(const std::string& stem);

// The proofs of one keeper's exchanges: the job secret, bound to the
// keeper's commit directory (which names the job and the host), so that a
// proof made for one keeper is no use at another.
handshake::Proofs replica_proofs(std::shared_ptr<const handshake::Key> key, const std::string& keeper_dir);

// Removes keeper files (the kReplicaStem pairs) from `dir`, a commit
// directory that no keeper writes into any more. With `all`, every one;
// otherwise only those of a State number whose newest whole commit a
// worker's own file of `dir` holds too, or a newer one (the replica adds
// nothing there: a keeper whose host now runs workers), and never a sharded
// State's (`replica-of-*`: one worker's file as new says nothing of the
// others' rows; the State removes them once its first commit there is
// whole, docs/state.md "Memory per host"). Never follows a link.
struct RemovedReplicas {
  std::vector<std::string> names;
  uint64_t bytes = 0;  // their sizes
  int left = 0;        // keeper files still there
};
RemovedReplicas remove_replicas(const std::string& dir, bool all);

struct Pushed {
  int ordinal = 0;
  uint64_t id = 0;
  uint64_t bytes = 0;  // the entries' bytes
  std::string source;  // a sharded State's: the worker's stem (empty: the State's one replica)
};

class ReplicaPusher {
 public:
  // `commit_dir`: this host's commit directory, whose newest commits are pushed.
  ReplicaPusher(std::string commit_dir, std::shared_ptr<const handshake::Key> key);

  // The keeper to push to from now on (its address and its commit
  // directory, which binds the proofs); what it was sent is forgotten, so
  // that the new keeper gets the newest commits at the next push.
  void target(const net::Address& keeper, const std::string& keeper_dir);

  // Pushes, over one connection, each State number's newest commit that
  // this host holds whole and that the keeper was not sent yet (of a
  // sharded State, each worker file's newest), appending
  // each one the keeper stored to `pushed`. Connects only when there is
  // such a commit. A commit whose worker began to overwrite it under the
  // copy is skipped (the next push sends the newer one). Each read or write
  // of a chunk waits at most `io_timeout`. Throws erun::Error naming the
  // keeper and what failed; what went before stays pushed (and in `pushed`).
  void push(Duration io_timeout, std::vector<Pushed>* pushed);

  bool has_target() const { return has_target_; }
  // The newest commit of sharded State `ordinal` whose every ready worker
  // file the keeper holds (0: none yet): each push asks the keeper to keep it.
  uint64_t kept_whole(int ordinal) const {
    auto it = complete_.find(ordinal);
    return it == complete_.end() ? 0 : it->second;
  }
  // Ends a push early (its error says "aborted") when it fires; null: none.
  void set_interrupt(const net::Interrupt* interrupt) { interrupt_ = interrupt; }

 private:
  // One commit, listed from the open file `fd`, over the open connection;
  // whether the keeper stored it whole.
  bool push_one(int sock, int fd, const HostCommits::Listing& l, int ordinal, const std::string& source,
                uint64_t keep, Duration io_timeout);
  void connect_and_prove(net::Socket& sock, Duration io_timeout);
  std::string commit_dir_;
  std::shared_ptr<const handshake::Key> key_;
  bool has_target_ = false;
  net::Address keeper_;
  std::string keeper_dir_;
  // Per replica (a State number, or a sharded State's worker stem), the
  // newest commit the keeper stored.
  std::map<std::string, uint64_t> sent_;
  // Per sharded State number, the newest commit whose every ready worker
  // file the keeper stored: no pair of it is written over while it is the
  // newest (each pair keeps two commits, and a push cut short tears one).
  std::map<int, uint64_t> complete_;
  std::vector<char> chunk_;
  const net::Interrupt* interrupt_ = nullptr;
};

class ReplicaStore {
 public:
  // `commit_dir`: this keeper's commit directory (it exists: the agent holds it).
  ReplicaStore(std::string commit_dir, std::shared_ptr<const handshake::Key> key);
  ~ReplicaStore();

  // Serves one accepted connection until the pusher closes it: authenticates
  // the pusher, then stores each commit it sends. Returns the number of
  // commits stored whole. Throws erun::Error naming the peer and what was
  // wrong (a failed proof, a malformed header, a stall longer than
  // `io_timeout`); a commit cut short stays torn and the previous one stays
  // the keeper's newest.
  int serve(int sock, const std::string& peer, Duration io_timeout);

  // Ends serve() early (its error says "aborted") when it fires; null: none.
  void set_interrupt(const net::Interrupt* interrupt) { interrupt_ = interrupt; }

 private:
  HostCommits& files(const std::string& stem);
  std::string commit_dir_;
  std::shared_ptr<const handshake::Key> key_;
  std::map<std::string, std::unique_ptr<HostCommits>> files_;  // by stem
  const net::Interrupt* interrupt_ = nullptr;
};

}  // namespace erun::state_internal
