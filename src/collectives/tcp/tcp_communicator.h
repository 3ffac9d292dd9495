// TcpCommunicator: erun's authenticated TCP transport between hosts (host
// leaders, or one rank per host). Construction is collective; abort() may be
// called from any thread and wakes every wait. Mesh, handshake, frames and
// algorithms: docs/protocol.md, "Worker-to-worker pairs".
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "common/clock.h"
#include "erun/communicator.hpp"
#include "store/kv_store.h"

namespace erun {

struct TcpOptions {
  int rank = 0;
  int size = 1;
  // Bounds every operation, and construction unless connect_timeout is set.
  Duration timeout = std::chrono::seconds(30);
  // Forming the mesh (store waits, connects, handshakes); 0: `timeout`.
  Duration connect_timeout{0};
  // This rank's address (an IP or a name of this host): it listens there and
  // peers connect there. The wildcard (0.0.0.0, ::) is refused.
  std::string address = "127.0.0.1";
  // Bind the handshake to this job and generation; the secret keys it. A
  // secret is required when size > 1.
  std::string job_id;
  std::string secret;
  long generation = 0;
  // Ranks of the job on this machine, this one included (they share its
  // CPUs). A large allreduce writes on a second thread from 4 MiB blocks
  // when they are not more than the machine's CPUs (with a core per rank
  // the overlap pays), from 16 MiB blocks when they are (for 4 MiB blocks
  // the second thread then costs ~10 % more CPU; docs/performance.md
  // section 8).
  int machine_ranks = 1;
  // Polled while the mesh forms (about every 50 ms): returning true gives up
  // at once with a CommError, e.g. when the driver announced a new generation.
  std::function<bool()> cancelled;
};

// Reductions as every CPU communicator (reduce_kernels.h): integer kSum and
// kProduct wrap, integer kAverage truncates toward zero; float16/bfloat16 throw
// std::invalid_argument. Throws CommError when the mesh cannot be formed and
// std::invalid_argument for bad options.
std::unique_ptr<Communicator> make_tcp_communicator(KvStore& store, const TcpOptions& options);

}  // namespace erun
