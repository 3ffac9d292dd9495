// Membership: what the driver needs from the rendezvous, and nothing else.
// The driver publishes generations, reads one snapshot per tick (who joined the
// current generation, who is blocked in a join, who re-joined since the last
// snapshot and why, which ranks the re-joining workers reported as failed,
// whose connection closed) and tells the members that membership changes or
// that members are gone.
// RendezvousServer implements it over TCP; FakeMembership (fake_membership.h)
// in memory for the driver's unit tests. Driver thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/topology.h"

namespace erun {

// What identifies a worker process across generations: its slot.
struct SlotKey {
  std::string host;
  int local_index = 0;
  bool operator==(const SlotKey&) const = default;
  auto operator<=>(const SlotKey&) const = default;
};

// One rank of a published generation: its place (the Topology) and its slot.
// In the driver's plan `generation` is unset (0): publish() names it, and the
// worker's join returns the assignment with the published generation.
struct RankAssignment : Topology {
  SlotKey slot;
};

// Why a worker joins (JOIN's `reason`).
enum class JoinReason : uint8_t {
  kStart = 0,         // its first join
  kFormFailed = 1,    // the generation it was given could not form its communicator
  kPeerLost = 2,      // a collective failed: a peer died, stopped, or aborted
  kHostsUpdated = 3,  // the driver announced a membership change
};
const char* to_string(JoinReason r);

// What the worker saw of the rank that failed it.
enum class PeerState : uint8_t {
  kUnknown = 0,  // no rank named, or not observable (another host)
  kDead = 1,     // its process is gone
  kAlive = 2,    // its process exists but did not arrive: stopped, hung or slow
  kSilent = 3,   // on another host, waited on over the network: it did not send or
                 // receive in time, or closed; it may itself wait on another rank
};
const char* to_string(PeerState s);

struct JoinRequest {
  SlotKey slot;
  uint64_t commit_id = 0;  // the worker's last commit (0: none)
  long pid = 0;            // the worker's process id: a second JOIN for the slot supersedes by it
  JoinReason reason = JoinReason::kStart;
  // The generation the worker leaves (-1: none) and, when reason is
  // kFormFailed or kPeerLost, the rank of that generation that failed it
  // (-1: unknown) and what the worker saw of its process.
  long left_generation = -1;
  int failed_rank = -1;
  PeerState failed_state = PeerState::kUnknown;
  // The worker's pre-flight compute check at its start, in microseconds (0:
  // none): the driver holds a new host's worker back when it is far slower
  // than the job's (docs/design.md, "Stragglers").
  uint32_t probe_us = 0;
  // Its pre-flight link probe (a round trip with a worker on another host,
  // worker/link_probe.h), in microseconds (0: none made), and the port its
  // own link probe responder listens on at its advertised address (0: none).
  uint32_t link_us = 0;
  uint32_t probe_port = 0;
  // How long before this JOIN the worker made `commit_id`, in milliseconds
  // (at least 1; 0: unknown). A failure's rolled-back time is dated by it:
  // ranks report their commits to the driver at most every 100 ms, so the
  // last one before a failure is often one the driver never saw.
  uint32_t commit_age_ms = 0;
};
// The link probe's bound: a worker whose round trip did not finish within
// it reports at least this, and the driver holds its host back.
inline constexpr uint32_t kLinkProbeBoundUs = 1'000'000;

// A list that a snapshot shares with the rendezvous that made it: copying
// one costs a reference count, not 100,000 elements. Reads like a
// const std::vector; push_back() (fakes, tests) copies it first when shared.
template <class T>
class SharedList {
 public:
  SharedList() = default;
  SharedList(std::vector<T> v) : p_(std::make_shared<std::vector<T>>(std::move(v))) {}  // NOLINT: implicit
  explicit SharedList(std::shared_ptr<const std::vector<T>> p) : p_(std::move(p)) {}
  const std::vector<T>& vec() const {
    static const std::vector<T> kEmpty;
    return p_ ? *p_ : kEmpty;
  }
  operator const std::vector<T>&() const { return vec(); }  // NOLINT: implicit
  auto begin() const { return vec().begin(); }
  auto end() const { return vec().end(); }
  size_t size() const { return vec().size(); }
  bool empty() const { return vec().empty(); }
  const T& operator[](size_t i) const { return vec()[i]; }
  const T& front() const { return vec().front(); }
  const T& back() const { return vec().back(); }

 private:
  std::shared_ptr<const std::vector<T>> p_;
};

// One rank's commit intervals (TIMING, docs/protocol.md): the `commits`
// intervals up to commit `commit_id`, how long they took together and how
// much of it the rank spent inside collectives. A straggler computes longest
// and waits least (runner/policies/stragglers.h).
struct RankTiming {
  SlotKey slot;
  long generation = -1;
  uint64_t commit_id = 0;
  double interval_s = 0;
  double wait_s = 0;
  uint64_t commits = 1;
};

struct MembershipSnapshot {
  long generation = -1;               // the last published generation
  SharedList<JoinRequest> members;    // connected and assigned in `generation`
  SharedList<JoinRequest> waiting;    // blocked in a join (not yet assigned)
  std::vector<JoinRequest> rejoined;  // JOINs of workers leaving a generation, since the last snapshot
  std::vector<SlotKey> disconnected;  // slots whose connection closed since the last snapshot
  std::vector<RankTiming> timings;    // members' commit intervals since the last snapshot
};

class Membership {
 public:
  virtual ~Membership() = default;
  // Publishes generation `gen` (greater than any before): each listed slot's
  // waiting (or later) join returns its assignment; joins of other slots keep
  // waiting.
  virtual void publish(long gen, const std::vector<RankAssignment>& ranks) = 0;
  // The state now, with the events (rejoined, disconnected) since the last call.
  virtual MembershipSnapshot snapshot() = 0;
  // Tells every member of generation `gen` that membership changes.
  // `drain`: a host leaves on notice (docs/design.md, "Draining a host"):
  // a worker's State::check_host_updates() between commits commits first,
  // so that the leaving host's workers take nothing uncommitted with them.
  virtual void notify_hosts_updated(long gen, bool drain = false) = 0;
  // Tells every other member of generation `gen` at once that `ranks` (of
  // `gen`) are gone (exited, killed, host lost), so that they abort their
  // collectives instead of waiting out the collective timeout; the lost
  // ranks' own connections are closed. A `gen` other than the last published
  // one, or an empty list, does nothing.
  virtual void notify_peers_lost(long gen, const std::vector<int>& ranks) = 0;
};

}  // namespace erun
