#include "rendezvous/server_membership.h"

#include <algorithm>
#include <functional>

#include "common/check.h"
#include "common/log.h"

namespace erun {
namespace {

using wire::Type;

std::string slot_name(const SlotKey& s) { return fmt::format("{}:{}", s.host, s.local_index); }

}  // namespace

size_t ServerMembership::SlotHash::operator()(const SlotKey& s) const {
  return std::hash<std::string>{}(s.host) * 31 + static_cast<size_t>(s.local_index);
}

std::optional<std::string> ServerMembership::join(const Request& r, std::string_view peer, JoinRequest req) {
  // A worker leaves the generation it last joined: one older than the
  // current is normal (it is answered at once), one never published is not.
  if (r.generation > gen_) {
    return fmt::format("JOIN leaving generation {}, which was never published (current {})", r.generation, gen_);
  }
  if (auto why = duplicate_of_live_slot(r.conn, req, r.generation)) {
    // Two processes must never hold the same rank: a live owner in a newer
    // generation than the one this join names keeps the slot.
    ERUN_LOG_WARN("{}: refused the join of slot {} from {} (pid {}): {}", log_prefix(gen_), slot_name(req.slot),
                  peer, req.pid, *why);
    send_error(r.conn, r.request_id, *why);
    return std::nullopt;
  }
  req.left_generation = r.generation;
  auto mine = workers_.find(r.conn);
  if (mine != workers_.end() && mine->second.joined && !(mine->second.join.slot == req.slot)) {
    return fmt::format("JOIN for slot {} on a connection of slot {}; one connection serves one slot",
                       slot_name(req.slot), slot_name(mine->second.join.slot));
  }
  supersede_owner(r.conn, peer, req);
  Worker& w = workers_[r.conn];
  w.peer = peer;
  if (w.member_gen >= 0 || req.reason != JoinReason::kStart) record_rejoin(req);
  w.joined = true;
  w.join = req;
  w.join_pending = true;
  w.join_request_id = r.request_id;
  w.join_after_gen = r.generation;
  w.member_gen = -1;
  members_.remove(req.slot, r.conn);
  waiting_.put(r.conn, req);
  slot_owner_[req.slot] = r.conn;
  try_assign(r.conn, w);
  return std::nullopt;
}

// Why a JOIN from `conn` for `req.slot` naming generation `after_gen` must be
// refused: another connection, still open, holds that slot in a generation
// newer than the one this join names (a second process for a live rank, e.g.
// a stale copy restarted by hand). An owner whose peer already closed (its
// process died, the close not handled yet) is let go instead.
std::optional<std::string> ServerMembership::duplicate_of_live_slot(ConnId conn, const JoinRequest& req,
                                                                    int64_t after_gen) {
  auto o = slot_owner_.find(req.slot);
  if (o == slot_owner_.end() || o->second == conn) return std::nullopt;
  const ConnId owner_id = o->second;
  auto it = workers_.find(owner_id);
  if (it == workers_.end() || it->second.closing) return std::nullopt;
  const Worker& owner = it->second;
  if (owner.join.pid == req.pid) return std::nullopt;  // the same process re-connecting
  int64_t owner_gen = std::max(owner.member_gen, owner.join_after_gen);
  if (owner_gen < 0 || after_gen >= owner_gen) return std::nullopt;
  if (out_.peer_closed(owner_id)) {
    close(owner_id, "closed by the peer");
    return std::nullopt;
  }
  return fmt::format(
      "slot {} is held by a live worker (pid {} from {}) in generation {}, and this join names generation {}: "
      "two processes may not hold one rank. Stop the other process, or let erun launch workers",
      slot_name(req.slot), owner.join.pid, owner.peer, owner_gen, after_gen);
}

// A JOIN for a slot that another live connection holds takes the slot over
// (the driver starts a slot's next worker only once it gave up the last
// one). The same pid: the process re-connected, the old connection is closed
// quietly. Another pid: the old holder is told and closed; its slot is not
// reported as disconnected (it has a live worker again).
void ServerMembership::supersede_owner(ConnId conn, std::string_view peer, const JoinRequest& req) {
  auto o = slot_owner_.find(req.slot);
  if (o == slot_owner_.end() || o->second == conn) return;
  const ConnId old_id = o->second;
  slot_owner_.erase(o);
  auto it = workers_.find(old_id);
  if (it == workers_.end() || it->second.closing) return;
  Worker& old = it->second;
  waiting_.remove(old.join.slot, old_id);
  if (old.join.pid == req.pid) {
    close(old_id, fmt::format("process {} re-connected", req.pid));
    return;
  }
  ERUN_LOG_WARN("{}: slot {}: process {} from {} takes the slot over from process {} from {}, whose "
                "connection is closed; if that process still runs, it is not erun's and should be stopped",
                log_prefix(gen_), slot_name(req.slot), req.pid, peer, old.join.pid, old.peer);
  std::string why = fmt::format("slot {} was taken over by process {}", slot_name(req.slot), req.pid);
  if (old.join_pending) {
    old.join_pending = false;
    send_error(old_id, old.join_request_id, why);
  }
  old.joined = false;  // its slot belongs to the new connection now
  close(old_id, why);
}

void ServerMembership::record_rejoin(const JoinRequest& req) {
  if (rejoined_.size() >= kMaxRejoins) {
    ERUN_LOG_WARN("{}: {} re-joins were not read by the driver; dropped the oldest half (their "
                  "workers still wait and are assigned normally; only why they re-joined is lost)",
                  log_prefix(gen_), rejoined_.size());
    rejoined_.erase(rejoined_.begin(), rejoined_.begin() + static_cast<long>(rejoined_.size() / 2));
  }
  rejoined_.push_back(req);
}

void ServerMembership::try_assign(ConnId conn, Worker& w) {
  if (!w.join_pending || w.closing || gen_ <= w.join_after_gen) return;
  auto a = assignments_.find(w.join.slot);
  if (a == assignments_.end()) return;
  w.join_pending = false;
  w.member_gen = gen_;
  waiting_.remove(w.join.slot, conn);
  members_.put(conn, w.join);
  out_.send(conn, Type::kAssignment, gen_, w.join_request_id, wire::encode_assignment(a->second, gen_));
}

void ServerMembership::publish(int64_t gen, const std::vector<RankAssignment>& ranks) {
  ERUN_CHECK(gen > gen_);
  gen_ = gen;
  assignments_.clear();
  assignments_.reserve(ranks.size());
  for (auto& r : ranks) assignments_[r.slot] = r;
  members_.clear();  // the last generation's members are not members of this one
  for (auto& r : ranks) {
    const SlotIndex::Entry* e = waiting_.find(r.slot);
    if (e == nullptr) continue;
    const ConnId conn = e->conn;
    if (auto w = workers_.find(conn); w != workers_.end()) try_assign(conn, w->second);
  }
}

void ServerMembership::notify_hosts_updated(int64_t gen, bool drain) {
  // The payload's one byte says a host drains (an empty payload, as older
  // servers send, does not).
  push_to_members(gen, Type::kHostsUpdated, drain ? std::string_view("\x01", 1) : std::string_view());
}

// Closing a lost rank's connection matters when its process is alive but
// cut off (a partitioned host): once it can reach us again it finds its
// rendezvous gone and ends instead of waiting in a join.
void ServerMembership::notify_peers_lost(int64_t gen, const std::vector<int>& ranks) {
  if (ranks.empty() || gen != gen_) return;
  const std::set<int> lost(ranks.begin(), ranks.end());
  std::vector<ConnId> gone;  // closed after the walk: closing takes a connection out of `members_`
  for (auto& [slot, entry] : members_) {
    if (lost.count(assignments_.at(slot).rank)) gone.push_back(entry.conn);
  }
  for (ConnId id : gone) close(id, fmt::format("its rank was reported lost in generation {}", gen));
  push_to_members(gen, Type::kPeersLost, wire::encode_peers_lost(ranks));
}

// A push frame to every member of generation `gen` (the member index for the
// current one).
void ServerMembership::push_to_members(int64_t gen, Type type, std::string_view payload) {
  if (gen == gen_) {
    for (auto& [slot, entry] : members_) out_.send(entry.conn, type, gen, 0, payload);
    return;
  }
  for (auto& [id, w] : workers_) {
    if (!w.closing && w.member_gen == gen) out_.send(id, type, gen, 0, payload);
  }
}

void ServerMembership::closed(ConnId conn, std::string_view why) {
  auto it = workers_.find(conn);
  if (it == workers_.end() || it->second.closing) return;
  Worker& w = it->second;
  if (w.joined && !why.empty()) {
    ERUN_LOG_DEBUG("rendezvous: connection of slot {} from {} closed: {}", slot_name(w.join.slot), w.peer, why);
  }
  w.closing = true;
  waiting_.remove(w.join.slot, conn);
  members_.remove(w.join.slot, conn);
}

void ServerMembership::released(ConnId conn) {
  auto it = workers_.find(conn);
  if (it == workers_.end()) return;
  const Worker& w = it->second;
  if (w.joined) {
    auto o = slot_owner_.find(w.join.slot);
    if (o != slot_owner_.end() && o->second == conn) {
      slot_owner_.erase(o);
      disconnected_.insert(w.join.slot);
    }
  }
  workers_.erase(it);
}

bool ServerMembership::joined(ConnId conn) const {
  auto it = workers_.find(conn);
  return it != workers_.end() && it->second.joined;
}

void ServerMembership::timing(const Request& r, const wire::Timing& t) {
  auto it = workers_.find(r.conn);
  // Only a member's report of the generation it is in: a late one of a
  // generation it left says nothing about this one.
  if (it == workers_.end() || !it->second.joined || it->second.member_gen != gen_ || r.generation != gen_) return;
  if (timings_.size() >= kMaxRejoins) timings_.erase(timings_.begin(), timings_.begin() + kMaxRejoins / 2);
  timings_.push_back(RankTiming{it->second.join.slot, static_cast<long>(gen_), t.commit_id,
                                static_cast<double>(t.interval_us) / 1e6, static_cast<double>(t.wait_us) / 1e6,
                                t.commits});
}

MembershipSnapshot ServerMembership::snapshot() {
  MembershipSnapshot s;
  s.generation = gen_;
  s.members = SharedList<JoinRequest>(members_.list());
  s.waiting = SharedList<JoinRequest>(waiting_.list());
  s.rejoined = std::exchange(rejoined_, {});
  s.timings = std::exchange(timings_, {});
  s.disconnected.assign(disconnected_.begin(), disconnected_.end());
  disconnected_.clear();
  return s;
}

// Closes `conn` here at once, then asks the server to (whose closed() call
// back finds it closed already).
void ServerMembership::close(ConnId conn, const std::string& why) {
  closed(conn, why);
  out_.close(conn, why);
}

void ServerMembership::send_error(ConnId conn, uint32_t request_id, const std::string& message) {
  out_.send(conn, Type::kError, gen_, request_id, wire::encode_str(message));
}

}  // namespace erun
