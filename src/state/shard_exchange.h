// How the ranks of a new generation read the committed pieces of sharded
// entries (docs/state.md, "Sharded entries"): from files of their own host's
// commit directory (shared memory) directly, and from other hosts' files
// through a ShardServer that a rank on that host runs while the job
// reshards. The files are the host-memory commit files the workers wrote
// (a dead worker's too), so a piece outlives its rank. Each file that holds
// sharded pieces says which in its table entry kShardTable.
//
// The exchange, after erun's mutual HMAC handshake under the job secret
// (common/handshake.h, bound to the job id), all integers little-endian:
//   reader: "ERUNSHRD" nonce(32)        server: nonce(32) proof(32)
//   reader: proof(32), u32 name length, the file's name in the commit
//     directory, u64 commit id, u32 ranges, per range u64 offset, u64 bytes
//   server: u8 1, or u8 0, u32 length, why (and closes)
//   server: the ranges' bytes in order, then u8 1 (the file still held the
//     commit whole after the copy) or 0 (its writer began to overwrite it)
// One request per connection.
//
// Buddy copies: after each commit, a rank pushes its pieces (and the table)
// to a BuddyKeeper on another host, which writes them into a file pair of
// its host's commit directory named kBuddyPrefix + the pusher's stem name:
//   pusher: "ERUNBUD2" nonce(32)        keeper: nonce(32) proof(32)
//   pusher: proof(32), u32 name length, name, u64 commit id, u64 commit to
//     keep (0: none), u32 entries, per entry u32 name length, name, u64
//     size; then the entries' bytes
//   keeper: u8 1 (the pair holds the commit whole), or u8 0, u32 length, why
// One commit per connection.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/serial_server.h"
#include "common/status.h"
#include "commits/snapshot.h"
#include "state/reshard_plan.h"

namespace erun::state_internal {

// kShardTable (commits/snapshot.h): the entry of a host-memory commit that
// lists its sharded pieces.

// One sharded entry's piece in a commit: the global rows, the bytes of a
// row, and the rows the piece holds.
struct ShardPiece {
  std::string name;
  uint64_t rows = 0;
  uint64_t row_bytes = 0;
  RowRange held;
};
std::string encode_shard_table(const std::vector<ShardPiece>& pieces);
// Throws erun::Error naming `source` when the bytes are not a table.
std::vector<ShardPiece> decode_shard_table(const char* data, size_t size, const std::string& source);

// A piece as one file of a commit directory holds it.
struct FilePiece {
  std::string file;  // its name in the directory
  uint64_t id = 0;   // the commit
  ShardPiece piece;
  uint64_t offset = 0;  // of the piece's first byte in the file
};
// The sharded pieces that the files of `dir` belonging to the States
// numbered `ordinal` hold whole, of every commit there (each file's table
// read; torn, foreign and unreadable files skipped).
std::vector<FilePiece> list_pieces(const std::string& dir, int ordinal);

// Bytes to read: `bytes` at `offset` of the file, into `out`.
struct ByteRange {
  uint64_t offset = 0;
  uint64_t bytes = 0;
  char* out = nullptr;
};
// From a file of this host: the ranges, then a check that the file still
// holds commit `id` whole.
Status read_ranges(const std::string& path, uint64_t id, const std::vector<ByteRange>& ranges);
// From the ShardServer at host:port: `file` of its directory.
Status fetch_ranges(const std::string& host, int port, const std::string& job_id, const std::string& secret,
                    const std::string& file, uint64_t id, const std::vector<ByteRange>& ranges, Duration timeout);

// Serves the files of one commit directory on `address` (an ephemeral
// port), up to 8 connections at a time on threads of their own, each read
// and written within `io_timeout` per chunk. A connection that fails the
// handshake, or asks for a file outside the directory, a link, or bytes
// outside the file, is refused and changes nothing.
// Sends commit `id` of `entries` to the BuddyKeeper at host:port, to be
// kept under `name` (kBuddyPrefix + the pusher's stem name), never over the
// pair's copy of commit `keep` (the pusher's commit before this one, or
// the same commit in its layout before a reshard; 0: none); OK once the
// keeper has it whole.
Status push_to_buddy(const std::string& host, int port, const std::string& job_id, const std::string& secret,
                     const std::string& name, uint64_t id, uint64_t keep, const std::vector<EntryRef>& entries,
                     Duration timeout);

// Keeps other hosts' pieces in `dir` (see above) from a thread of its own,
// one push at a time. A push that fails the handshake, names a file that is
// not a buddy file of the directory, or ends early changes no commit: the
// pair keeps its newest whole one.
class BuddyKeeper {
 public:
  BuddyKeeper(const std::string& address, std::string dir, const std::string& job_id, const std::string& secret,
              Duration io_timeout);
  ~BuddyKeeper();
  BuddyKeeper(const BuddyKeeper&) = delete;
  BuddyKeeper& operator=(const BuddyKeeper&) = delete;
  int port() const { return server_->port(); }
  const std::string& error() const { return server_->error(); }
  // Lets go of the pairs whose names are not in `keep` (their files' memory
  // goes once they are removed); a push into one of them that is under way
  // ends first, into the file it has. Until accept_any(), a push of another
  // name is refused: a frozen pusher of an older generation would make its
  // pair again.
  void forget_pairs_except(const std::set<std::string>& keep);
  // Takes pushes of any name again (a new generation's pushers may differ).
  void accept_any();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<net::SerialServer> server_;  // after impl_: stopped first
};

class ShardServer {
 public:
  ShardServer(const std::string& address, std::string dir, const std::string& job_id, const std::string& secret,
              Duration io_timeout);
  ~ShardServer();
  ShardServer(const ShardServer&) = delete;
  ShardServer& operator=(const ShardServer&) = delete;
  // The port it listens on; 0 when it could not listen (why: error()).
  int port() const { return server_->port(); }
  const std::string& error() const { return server_->error(); }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<net::SerialServer> server_;  // after impl_: stopped first
};

}  // namespace erun::state_internal
