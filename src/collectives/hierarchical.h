// Hierarchical communicator: shared memory among the ranks of one host, erun's
// authenticated TCP transport (or Gloo, when asked for) among the host leaders
// (local_rank 0), so that only one rank per host touches the network.
// Construction is collective over all ranks (each host's shm segment, then the
// leaders' mesh, both bounded by `timeout`).
// Same contract as every Communicator: one operation at a time per rank,
// abort() from any thread; a failure anywhere aborts both layers so that every
// rank on every host gets a CommError promptly, not at its own timeout.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "common/clock.h"
#include "common/topology.h"
#include "erun/communicator.hpp"
#include "erun/errors.hpp"
#include "store/kv_store.h"

namespace erun {

// The CommError of a host's shared-memory segment that cannot be reserved:
// its /dev/shm has no room (ENOSPC). Not a peer's failure: the worker asks
// for generations without shared memory (HierOptions::flat) for a while.
class ShmNoRoom : public CommError {
 public:
  using CommError::CommError;
};

// What carries the traffic between hosts.
enum class CrossTransport {
  kTcp,   // erun's transport: authenticated pairs, checked frames (tcp_communicator.h)
  kGloo,  // Gloo's TCP pairs: unauthenticated; for comparison benchmarks only
};

enum class HierPipeline { kAuto, kOn, kOff };

// The Topology part: this rank's place (for a host leader, local_rank 0,
// cross_rank is its host's index and cross_size the number of hosts); its
// generation binds the TCP transport's handshake.
struct HierOptions : Topology {
  Duration timeout = std::chrono::seconds(30);
  // Identifies this host (ranks with the same hostname share memory) and is
  // the address its leader listens on unless `address` is set.
  std::string hostname = "127.0.0.1";
  // The address peers reach this host's leader at; empty: `hostname`.
  std::string address;
  // Forming the leaders' mesh (store waits, connects, handshakes; Gloo
  // stretches its first connect 5x); 0: `timeout`.
  Duration connect_timeout{0};
  CrossTransport cross = CrossTransport::kTcp;
  // The TCP transport's handshake is keyed by the job secret and bound to the
  // job and generation (required when there is more than one host).
  std::string job_id;
  std::string secret;
  // Polled while the communicator forms (the host's segment, the leaders'
  // mesh); true gives up (ShmOptions::cancelled, TcpOptions::cancelled).
  std::function<bool()> cancelled;
  // From pipeline_bytes on, allreduce can pipeline its three phases (shm
  // reduce, the leader's cross-host allreduce on a helper thread, shm
  // broadcast) in chunks. kAuto: when every host has more online CPUs than
  // ranks (a core for the helper thread; on an oversubscribed host the extra
  // synchronisations cost more than the overlap gains). Must be the same on
  // every rank.
  HierPipeline pipeline = HierPipeline::kAuto;
  size_t pipeline_bytes = size_t{1} << 20;
  // Goes into shm segment names.
  std::string segment_tag = "coll";
  // No shared memory: every rank takes part in the TCP layer as a host of its
  // own (a host's /dev/shm had no room for the segment: ShmNoRoom). Must be
  // the same on every rank; the worker agrees on it at the generation's
  // barrier.
  bool flat = false;
};

// One host (local_size == size): a plain shm communicator. One rank on every
// host (local_size == 1 and cross_size == size): a plain cross-host
// communicator. Otherwise shm within hosts + the cross-host transport among
// the leaders. Throws CommError.
std::unique_ptr<Communicator> make_hierarchical_communicator(KvStore& store, const HierOptions& options);

}  // namespace erun
