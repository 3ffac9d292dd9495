// FakeMembership: the Membership interface in memory, for the driver's unit
// tests. It answers joins the way RendezvousServer does (a join that leaves
// generation g is answered by the first published generation newer than g that
// lists its slot; until then it waits), and the test plays the workers: join(),
// disconnect(). No thread, no socket; driver thread only.
#pragma once

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "rendezvous/membership.h"

namespace erun {

class FakeMembership final : public Membership {
 public:
  void publish(long gen, const std::vector<RankAssignment>& ranks) override {
    generation_ = gen;
    published_.push_back(gen);
    ranks_ = ranks;
    members_.clear();
    for (auto& [slot, j] : waiting_) {
      if (listed(slot)) members_[slot] = j;
    }
    std::erase_if(waiting_, [&](auto& e) { return members_.count(e.first) > 0; });
  }
  MembershipSnapshot snapshot() override {
    MembershipSnapshot s;
    s.generation = generation_;
    std::vector<JoinRequest> members, waiting;
    for (auto& [slot, j] : members_) members.push_back(j);
    for (auto& [slot, j] : waiting_) waiting.push_back(j);
    s.members = std::move(members);
    s.waiting = std::move(waiting);
    s.rejoined = std::exchange(rejoined_, {});
    s.timings = std::exchange(timings_, {});
    s.disconnected.assign(disconnected_.begin(), disconnected_.end());
    disconnected_.clear();
    return s;
  }
  void notify_hosts_updated(long gen, bool drain = false) override {
    notified_.push_back(gen);
    if (drain) drains_notified_.push_back(gen);
  }
  void notify_peers_lost(long gen, const std::vector<int>& ranks) override {
    if (gen == generation_ && !ranks.empty()) peers_lost_.emplace_back(gen, ranks);
  }

  // A worker's JOIN. `left` is the generation it leaves (-1: its first join).
  // `probe_us`: its pre-flight check's time (default: the first joins' 20 ms);
  // `link_us`: its link probe's (default: `link_us`). Every worker says it
  // answers link probes on `probe_port` (0: none).
  void join(const SlotKey& slot, long left, JoinReason reason = JoinReason::kStart, int failed_rank = -1,
            PeerState state = PeerState::kUnknown, uint64_t commit = 0, uint32_t probe_us = 20000,
            std::optional<uint32_t> link = std::nullopt) {
    JoinRequest j;
    j.probe_us = probe_us;
    j.link_us = link.value_or(link_us);
    j.probe_port = probe_port;
    j.slot = slot;
    j.commit_id = commit;
    j.pid = 1000 + slot.local_index;
    j.reason = reason;
    j.left_generation = left;
    j.failed_rank = failed_rank;
    j.failed_state = state;
    if (left >= 0 || reason != JoinReason::kStart) rejoined_.push_back(j);
    members_.erase(slot);
    if (generation_ > left && listed(slot)) {
      members_[slot] = j;
    } else {
      waiting_[slot] = j;
    }
  }
  uint32_t probe_port = 0;
  uint32_t link_us = 0;  // 0: no link probe made
  // A member's commit interval (TIMING), in the next snapshot.
  void timing(const RankTiming& t) { timings_.push_back(t); }
  // Every slot of the last published generation joins it (first joins).
  void join_all() {
    for (auto& r : ranks_) {
      if (!members_.count(r.slot)) join(r.slot, -1);
    }
  }
  void disconnect(const SlotKey& slot) {
    members_.erase(slot);
    waiting_.erase(slot);
    disconnected_.insert(slot);
  }

  long generation() const { return generation_; }
  const std::vector<long>& published() const { return published_; }
  const std::vector<RankAssignment>& ranks() const { return ranks_; }
  const std::vector<long>& notified() const { return notified_; }
  const std::vector<long>& drains_notified() const { return drains_notified_; }
  // Every notify_peers_lost() that reached the members: (generation, ranks).
  const std::vector<std::pair<long, std::vector<int>>>& peers_lost() const { return peers_lost_; }
  bool is_member(const SlotKey& slot) const { return members_.count(slot) > 0; }
  bool is_waiting(const SlotKey& slot) const { return waiting_.count(slot) > 0; }

 private:
  bool listed(const SlotKey& slot) const {
    return std::any_of(ranks_.begin(), ranks_.end(), [&](const RankAssignment& r) { return r.slot == slot; });
  }

  long generation_ = -1;
  std::vector<long> published_;
  std::vector<long> notified_;
  std::vector<long> drains_notified_;
  std::vector<std::pair<long, std::vector<int>>> peers_lost_;
  std::vector<RankAssignment> ranks_;
  std::map<SlotKey, JoinRequest> members_, waiting_;
  std::vector<JoinRequest> rejoined_;
  std::vector<RankTiming> timings_;
  std::set<SlotKey> disconnected_;
};

}  // namespace erun
