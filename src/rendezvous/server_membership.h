// ServerMembership: the rendezvous server's membership rules (docs/protocol.md,
// "Membership"). No sockets: events arrive as calls naming connections, frames
// and closes leave through the Outbox. Not thread-safe: the server calls it
// under its mutex.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "rendezvous/membership.h"
#include "rendezvous/outbox.h"
#include "rendezvous/slot_index.h"

namespace erun {

class ServerMembership {
 public:
  // Re-joins kept for the driver between two snapshots; the oldest half is
  // dropped (with a warning) beyond that, when a driver stops asking.
  static constexpr size_t kMaxRejoins = 8192;

  explicit ServerMembership(Outbox& out) : out_(out) {}

  // A JOIN on `r.conn` from `peer` (its address, for messages). Returns why
  // the connection must be refused (a protocol violation), or nullopt: the
  // join then waits, is answered with its assignment, or was answered with
  // an ERROR (a live worker holds the slot).
  [[nodiscard]] std::optional<std::string> join(const Request& r, std::string_view peer, JoinRequest req);
  // Generation `gen` (newer than every earlier one) with its ranks: the
  // listed slots' waiting joins get their ASSIGNMENT.
  void publish(int64_t gen, const std::vector<RankAssignment>& ranks);
  // HOSTS_UPDATED to every member of generation `gen`.
  void notify_hosts_updated(int64_t gen, bool drain = false);
  // The members of `ranks` of the last published generation are closed, and
  // every other member gets PEERS_LOST; any other `gen`, or no ranks, does nothing.
  void notify_peers_lost(int64_t gen, const std::vector<int>& ranks);

  // TIMING from a member of the current generation: kept for the next
  // snapshot (bounded: the oldest half goes when a driver stops asking).
  void timing(const Request& r, const wire::Timing& t);

  // `conn` is closing: its join stops waiting and it is a member no more.
  // `why`, when not empty, is logged (debug) for a connection that joined. A
  // close this class asked for was applied at once: closed() then does nothing.
  void closed(ConnId conn, std::string_view why);
  // The server is done with `conn`: its slot is reported disconnected, unless
  // another connection joined for it since.
  void released(ConnId conn);

  // True once `conn` joined for a slot (and was not taken over).
  bool joined(ConnId conn) const;
  int64_t generation() const { return gen_; }
  // A driver that took a job over goes on from the generation its workers
  // last joined: joins leaving it (or an older one) wait for the next.
  void resume_after(int64_t gen) { gen_ = std::max(gen_, gen); }
  // Joins waiting for a generation, and members of the current one, in slot order.
  std::shared_ptr<const std::vector<JoinRequest>> waiting() { return waiting_.list(); }
  std::shared_ptr<const std::vector<JoinRequest>> members() { return members_.list(); }
  // The state now, with the re-joins and disconnected slots since the last call.
  MembershipSnapshot snapshot();

 private:
  // A connection that joined, as the membership sees it.
  struct Worker {
    std::string peer;
    bool joined = false;  // holds join.slot (false once taken over)
    JoinRequest join;
    bool join_pending = false;
    uint32_t join_request_id = 0;
    int64_t join_after_gen = -1;  // the generation the join leaves
    int64_t member_gen = -1;      // the generation it was assigned
    bool closing = false;
  };
  struct SlotHash {
    size_t operator()(const SlotKey& s) const;
  };

  std::optional<std::string> duplicate_of_live_slot(ConnId conn, const JoinRequest& req, int64_t after_gen);
  void supersede_owner(ConnId conn, std::string_view peer, const JoinRequest& req);
  void record_rejoin(const JoinRequest& req);
  void try_assign(ConnId conn, Worker& w);
  void close(ConnId conn, const std::string& why);
  void push_to_members(int64_t gen, wire::Type type, std::string_view payload);
  void send_error(ConnId conn, uint32_t request_id, const std::string& message);

  Outbox& out_;
  int64_t gen_ = -1;
  std::unordered_map<SlotKey, RankAssignment, SlotHash> assignments_;  // of gen_
  std::unordered_map<ConnId, Worker> workers_;                          // connections that sent a JOIN
  std::unordered_map<SlotKey, ConnId, SlotHash> slot_owner_;            // slot -> latest connection joined for it
  SlotIndex waiting_;                                                   // slot -> connection blocked in its join
  SlotIndex members_;                                                   // slot -> connection assigned in gen_
  std::set<SlotKey> disconnected_;                                      // since the last snapshot
  std::vector<JoinRequest> rejoined_;                                   // since the last snapshot
  std::vector<RankTiming> timings_;                                     // since the last snapshot
};

}  // namespace erun
