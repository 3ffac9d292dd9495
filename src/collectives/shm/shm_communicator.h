// ShmCommunicator: the CPU Communicator among ranks that all run on one host,
// through one POSIX shared-memory segment. Construction is collective: rank 0
// creates the segment (O_EXCL, 0600, a random name), publishes its name in the
// KvStore it is given (a view the caller scopes, e.g. PrefixStore(store,
// "gen3/shm"): its key is "segment"), the others map it, and it is unlinked as soon as all
// have mapped it, so nothing is left in /dev/shm even after a crash. Operations
// run on the caller's thread, one at a time; abort() may be called from any
// thread and fails every rank's pending and later operations. A dead peer
// (SIGKILL, exit) is a CommError within milliseconds, a hung one at `timeout`;
// the error names the operation and the rank; afterwards the object only throws.
// Each synchronisation also compares the ranks' call signatures (kept next to
// their arrival counters, see collectives/call_signature.h): ranks that made
// different calls get CallMismatch (a CollectiveMismatch) on every rank, at the
// first synchronisation of the diverging call, before any data is read.
// A rank that waits outside the communicator on purpose (a host leader in its
// cross-host step) says so with an OutsideMark: a peer that times out on it
// reports that instead of blaming it as hung (no failed rank, PeerFate::kUnknown).
#pragma once

#include <exception>
#include <memory>
#include <functional>
#include <string>

#include "common/clock.h"
#include "erun/communicator.hpp"
#include "store/kv_store.h"

namespace erun {

struct ShmOptions {
  int rank = 0;
  int size = 1;
  // Bounds construction and every operation.
  Duration timeout = std::chrono::seconds(30);
  // Goes into the segment name (with a random part) so that an operator can
  // tell whose segment it is, e.g. "<job id>-g3". Characters other than
  // [A-Za-z0-9_-] are replaced.
  std::string segment_tag = "erun";
  // Per-rank staging buffer of the pipelined paths: memory use is bounded by
  // about (size + 1) * step_bytes + 2 * size * small_bytes whatever the message.
  // Allreduces up to step_bytes / 2 per rank take a one-synchronisation path.
  size_t step_bytes = size_t{1} << 20;
  // Messages up to this many bytes per rank take the one-synchronisation path.
  size_t small_bytes = size_t{32} << 10;
  // What a peer is doing while it is marked outside (see ShmCommunicator::
  // set_outside), for the error of a rank that times out on it.
  std::string outside_work = "work outside this communicator";
  // Polled while the ranks map the segment; true gives up at once (the
  // caller's generation was replaced, so a rank that already left will
  // never map it). Empty: only the timeout and dead peers end the wait.
  std::function<bool()> cancelled;
};

class ShmCommunicator : public Communicator {
 public:
  // Marks this rank as busy outside the communicator (true) or back (false):
  // one release store into its control slot, visible to the peers' timeout
  // check (with whatever this rank published before it, e.g. an abort).
  // Called by the thread that runs this rank's operations.
  virtual void set_outside(bool outside) = 0;
};

// Marks `comm`'s rank busy outside for the scope's duration. Left by an
// exception, the outside work failed and this rank will not arrive: it
// aborts `comm` before clearing the mark, so a peer whose deadline passes
// meanwhile learns that this rank gave up instead of blaming it as alive but
// not arriving.
class OutsideMark {
 public:
  explicit OutsideMark(ShmCommunicator& comm) : comm_(comm), exceptions_(std::uncaught_exceptions()) {
    comm_.set_outside(true);
  }
  ~OutsideMark() {
    if (std::uncaught_exceptions() > exceptions_) comm_.abort();
    comm_.set_outside(false);
  }
  OutsideMark(const OutsideMark&) = delete;
  OutsideMark& operator=(const OutsideMark&) = delete;

 private:
  ShmCommunicator& comm_;
  const int exceptions_;  // in flight when the scope began
};

// Reductions as make_gloo_communicator: integer kSum/kProduct wrap, integer
// kAverage truncates toward zero, float16/bfloat16 are std::invalid_argument.
// Every rank gets bit-identical results. Throws CommError when the segment
// cannot be created (e.g. /dev/shm too small) or a peer does not come in time.
std::unique_ptr<ShmCommunicator> make_shm_communicator(KvStore& store, const ShmOptions& options);

}  // namespace erun
