// The shared-memory segment of one host's ranks: creating and mapping it, and
// sync(), the barrier that checks call signatures, abort, dead peers and the
// deadline; the algorithms' only contract. Threads and errors as in shm_communicator.h.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "collectives/call_signature.h"
#include "collectives/shm/shm_communicator.h"
#include "common/clock.h"
#include "store/kv_store.h"

namespace erun::shm {

inline constexpr size_t kLine = 64;

inline size_t round_up(size_t v, size_t to) { return (v + to - 1) / to * to; }

// Offsets of the parts of a segment for `size` ranks: the header, a control
// slot and a Peer per rank, two small buffers per rank, a staging slot per
// rank, then the result area.
struct Layout {
  size_t ctl = 0, pids = 0, small = 0, step = 0, result = 0, total = 0;
  size_t small_bytes = 0, step_bytes = 0;

  Layout(size_t size, size_t small_b, size_t step_b);
};

enum AbortKind : uint32_t;
struct Header;
struct RankSlot;
struct Peer;
struct UnlinkGuard;
class Mapping;

class Segment {
 public:
  // Collective: rank 0 creates the segment and publishes its name in `store`,
  // the others open it; returns once every rank has mapped it (and it is
  // unlinked). A world of one maps nothing.
  Segment(KvStore& store, const ShmOptions& o);
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  int rank() const { return options_.rank; }
  int size() const { return options_.size; }
  // No more ranks than online CPUs: waits spin longer, and an allreduce
  // writes its own part while it reduces.
  bool cpu_per_rank() const { return cpu_per_rank_; }

  // Starts an operation: throws if the communicator failed or was aborted,
  // sets the deadline and the call signature that sync() compares.
  void begin(const char* what, const CallSignature& call);
  // A barrier among all ranks that also checks that they all made the call
  // given to begin(); a mismatch throws CallMismatch on every rank.
  void sync(const char* what);
  // Any thread: fails every rank's pending and later operations.
  void abort();
  void set_outside(bool outside);

  // The staging sizes rank 0 chose (rounded; they win over this rank's).
  size_t small_bytes() const { return layout_.small_bytes; }
  size_t step_bytes() const { return layout_.step_bytes; }
  // Rank r's small buffer of `parity` (two per rank, small_bytes each).
  char* small(int r, int parity) const {
    return base() + layout_.small + (static_cast<size_t>(r) * 2 + parity) * layout_.small_bytes;
  }
  // Rank r's staging slot (step_bytes).
  char* slot(int r) const { return base() + layout_.step + static_cast<size_t>(r) * layout_.step_bytes; }
  // The result area (step_bytes), right after the last slot.
  char* result() const { return base() + layout_.result; }

 private:
  char* base() const { return base_; }
  Header* header() const;
  RankSlot& ctl(int r) const;
  Peer& peer(int r) const;
  pid_t pid_of(int r) const;
  bool watched(int r) const;

  void await_mapped();
  void create(KvStore& store, UnlinkGuard& guard);
  void open(KvStore& store, UnlinkGuard& guard);
  void map(int fd, size_t len);

  void wait_all(uint64_t e, const char* what);
  void check_peers(uint64_t e, int waiting_for, TimePoint now, const char* what);
  void futex_wait(uint64_t e, int waiting_for);
  void wake_all();
  int pending(uint64_t e, int from) const;
  void check_aborted(const char* what);
  void publish_abort(AbortKind kind, const std::string& reason = "", int peer = -1,
                     PeerFate fate = PeerFate::kUnknown);
  [[noreturn]] void mismatch(uint64_t e, const char* what);
  [[noreturn]] void fail_peer(const char* what, int peer, const std::string& cause, PeerFate fate);
  [[noreturn]] void fail(const char* what, const std::string& cause, bool tell_peers, int peer = -1,
                         PeerFate fate = PeerFate::kUnknown);

  const ShmOptions options_;
  Layout layout_;
  std::string name_;
  std::unique_ptr<Mapping> mapping_;
  char* base_ = nullptr;  // mapping_'s address
  TimePoint deadline_{};
  Duration spin_{};
  Duration yield_{};
  bool cpu_per_rank_ = true;
  const uint64_t pid_ns_;
  uint64_t epoch_ = 0;
  uint64_t call_[2] = {0, 0};  // this rank's current CallSignature words
  bool broken_ = false;
  std::string broken_reason_;
  int failed_rank_ = -1;
  PeerFate failed_fate_ = PeerFate::kUnknown;
  std::atomic<bool> aborted_{false};
};

}  // namespace erun::shm
