// GlooCommunicator: the CPU Communicator of one generation, Gloo over TCP.
// Built by every rank of the generation at once (construction is itself
// collective: it exchanges pair addresses through the KvStore it is given, a
// view the caller scopes (PrefixStore)
// and connects a full mesh, bounded by `timeout`). Operations run on the
// caller's thread, one at a time; abort() may be called from any other thread.
// Every failure (peer reset, timeout, abort, store timeout) is a CommError that
// names the operation and the rank; afterwards the object only throws.
#pragma once

#include <memory>
#include <string>

#include "common/clock.h"
#include "erun/communicator.hpp"
#include "store/kv_store.h"

namespace erun {

struct GlooOptions {
  int rank = 0;
  int size = 1;
  // Bounds every operation (gloo's per-op timeout), and construction unless
  // the two below are set.
  Duration timeout = std::chrono::seconds(30);
  // Waiting for the peers' addresses in the store (peers may still be
  // finishing a step before they re-join); 0: `timeout`.
  Duration store_timeout{0};
  // Connecting the pairs once every address is known; 0: `timeout`.
  Duration connect_timeout{0};
  // The address peers reach this rank at: a hostname or IP of this host.
  std::string hostname = "127.0.0.1";
};

// Reductions: float types exactly as IEEE arithmetic gives them; integer kSum and
// kProduct wrap around on overflow (uint8 modulo 256), and integer kAverage is
// the sum divided by size() with truncation toward zero. float16/bfloat16 are
// not supported on the CPU (std::invalid_argument): use NCCL for them.
std::unique_ptr<Communicator> make_gloo_communicator(KvStore& store, const GlooOptions& options);

}  // namespace erun
