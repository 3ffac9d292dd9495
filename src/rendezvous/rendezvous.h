// The rendezvous between the driver and its workers: a TCP server in the driver
// and a client in each worker, over the wire protocol of docs/protocol.md.
//
// Every connection authenticates by HMAC-SHA256 challenge-response with the job
// secret; every frame carries magic, version, job id and generation and has a
// length limit; every read and write has a deadline. A bad client is dropped
// and logged; the server goes on. See docs/protocol.md.
//
// Server threads: one I/O thread owned by the server; the methods below are
// thread-safe and called from the driver's thread. Client: one connection,
// a reader thread that owns all reads (replies and pushed notifications);
// methods are called from the worker's threads, and the client is destroyed
// when none is inside a method (the destructor returns promptly, driver or not).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "rendezvous/kv_store.h"

namespace erun {

// What identifies a worker process across generations: its slot.
struct SlotKey {
  std::string host;
  int local_index = 0;
  bool operator==(const SlotKey&) const = default;
  auto operator<=>(const SlotKey&) const = default;
};

// One rank of a published generation.
struct RankAssignment {
  SlotKey slot;
  int rank = 0, size = 1;
  int local_rank = 0, local_size = 1;
  int cross_rank = 0, cross_size = 1;
};

struct JoinRequest {
  SlotKey slot;
  uint64_t commit_id = 0;  // the worker's last commit
  long pid = 0;
};

struct ServerOptions {
  std::string job_id;
  std::string secret;             // raw bytes
  std::string bind_address = "0.0.0.0";
  int port = 0;                   // 0: any free port
  size_t max_frame_bytes = 64 << 20;
  Duration io_timeout = std::chrono::seconds(10);
  // Connections that have not authenticated yet, at most (see admission.h).
  size_t max_unauthenticated = 1024;
};

class RendezvousServer {
 public:
  explicit RendezvousServer(ServerOptions options);
  ~RendezvousServer();
  Status start();
  int port() const;

  // Workers blocked in join (connected, not yet given an assignment), by
  // slot, with the commit id they hold (the driver picks the sync root).
  std::vector<JoinRequest> waiting() const;
  // Connected workers that received an assignment of the current generation.
  std::vector<JoinRequest> members() const;
  // Publishes generation `gen` (greater than any before): each listed slot's
  // waiting (or later) join returns its assignment; joins of unlisted slots
  // keep waiting. Keys and pending gets of older generations are dropped.
  void publish(long gen, const std::vector<RankAssignment>& ranks);
  // The last published generation (-1 before the first).
  long generation() const;
  // Tells every connected worker of generation `gen` that membership changes.
  void notify_hosts_updated(long gen);
  // Slots whose connection closed since the last call (a worker died or left).
  std::vector<SlotKey> take_disconnected();
  // Counts of refused connections and frames, for logs and tests.
  long refused() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct ClientOptions {
  std::string address;     // the driver's host
  int port = 0;
  std::string job_id;
  std::string secret;
  Duration io_timeout = std::chrono::seconds(10);
  Duration join_timeout = std::chrono::seconds(600);
  size_t max_frame_bytes = 64 << 20;
};

class RendezvousClient {
 public:
  explicit RendezvousClient(ClientOptions options);
  ~RendezvousClient();
  Status connect();
  // Blocks until the driver publishes a generation newer than the last one
  // this client joined that contains this slot, or join_timeout.
  Result<RankAssignment> join(const JoinRequest& request, long* generation_out);
  // The generation-scoped store of the current generation: set/get/check throw
  // CommError on a stale generation, a timeout, or a lost connection.
  KvStore& store();
  // Set by the reader thread when the driver announced a membership change
  // for the current generation; cleared by the next successful join.
  bool hosts_updated() const;
  // The generation of the last successful join (-1 before).
  long generation() const;
  // False once the connection to the driver is lost.
  bool connected() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace erun
