// The rendezvous (docs/protocol.md): RendezvousServer, the driver's Membership,
// has an I/O thread of its own and thread-safe methods. RendezvousClient, one
// per worker, reads on a thread of its own; any worker thread may call it, and
// none may be inside a call when it is destroyed.
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
#include "store/kv_store.h"
#include "rendezvous/membership.h"

namespace erun {

struct ServerOptions {
  std::string job_id;
  std::string secret;             // raw bytes
  std::string bind_address = "0.0.0.0";
  int port = 0;                   // 0: any free port
  size_t max_frame_bytes = 64 << 20;
  Duration io_timeout = std::chrono::seconds(10);
  // Connections that have not authenticated yet, at most (see admission.h).
  size_t max_unauthenticated = 1024;
  // A driver that takes a running job over (docs/protocol.md, "Taking a job
  // over"): the last generation the job published before, whose members
  // re-join this server. -1: a new job.
  long resume_generation = -1;
};

class RendezvousServer final : public Membership {
 public:
  explicit RendezvousServer(ServerOptions options);
  ~RendezvousServer() override;
  Status start();
  int port() const;

  // Membership. publish(): keys and pending gets of older generations are
  // dropped (their requests get a stale-generation ERROR). snapshot(): the
  // event lists are bounded: `rejoined` keeps the newest JOIN per slot and
  // `disconnected` each slot once, so a driver that never asks (restart
  // mode) costs memory bounded by the number of slots.
  void publish(long gen, const std::vector<RankAssignment>& ranks) override;
  MembershipSnapshot snapshot() override;
  void notify_hosts_updated(long gen, bool drain = false) override;
  void notify_peers_lost(long gen, const std::vector<int>& ranks) override;

  // Workers blocked in join (connected, not yet given an assignment), by slot.
  std::vector<JoinRequest> waiting() const;
  // Connected workers that received an assignment of the current generation.
  std::vector<JoinRequest> members() const;
  // The last published generation (-1 before the first).
  long generation() const;
  // Counts of refused connections and frames, for logs and tests.
  long refused() const;
  // Agents' relay connections open now (docs/protocol.md, "Relaying").
  long relay_connections() const;

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
  // Called on the reader thread when the driver pushes PEERS_LOST for the
  // generation this client last joined (an older one is ignored), with that
  // generation and the lost ranks. It must return promptly and not call the
  // client; it is set before connect() and outlives the client.
  std::function<void(long generation, const std::vector<int>& ranks)> on_peers_lost;
  // The driver's --driver-grace: a lost connection is tried again (every
  // half second, for this long) instead of failing the client, as a new
  // driver may take the job over (docs/protocol.md, "Taking a job over").
  // Meanwhile a join waits and is sent again once connected; a store call
  // fails. Once connected again, hosts_updated() is true: the worker re-joins
  // at its next commit, with nothing rolled back. Zero: the client fails.
  Duration reconnect_within = Duration::zero();
  // With reconnect_within, a file the worker's agent writes when a new
  // driver took the job over elsewhere ("HOST PORT\n"; ERUN_DRIVER_FILE, for
  // a worker that reaches the driver without the agent's relay): each try to
  // connect again reads it first and goes where it says. Empty: none.
  std::string follow_file;
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
  // The announced change is a host that drains (HOSTS_UPDATED's payload).
  bool drain_pending() const;
  // Sends TIMING (no reply) for the current generation: `commits` commit
  // intervals up to `commit_id`, `interval_us` long, `wait_us` of it inside
  // collectives. Training thread.
  void report_timing(uint64_t commit_id, uint64_t commits, uint64_t interval_us, uint64_t wait_us);
  // The generation of the last successful join (-1 before).
  long generation() const;
  // The newest generation the driver reported lost ranks of (PEERS_LOST),
  // -1 when none; with the ranks of that report.
  long peers_lost_generation() const;
  std::vector<int> peers_lost() const;
  // False once the connection to the driver is lost.
  bool connected() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace erun
