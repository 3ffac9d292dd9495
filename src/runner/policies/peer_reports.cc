#include "runner/policies/peer_reports.h"

#include <signal.h>

#include <algorithm>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/log.h"

namespace erun {

void PeerReports::published(const Plan& plan) {
  plans_.push_back(plan);
  if (plans_.size() > 4) plans_.erase(plans_.begin());
}

const Plan* PeerReports::plan_of(long generation) const {
  for (auto& p : plans_) {
    if (p.generation == generation) return &p;
  }
  return nullptr;
}

std::string PeerReports::reporter(const JoinRequest& report) const {
  const Plan* left = plan_of(report.left_generation);
  const RankAssignment* a = left ? left->find(report.slot) : nullptr;
  return who(-1, report.slot.host, a ? a->rank : -1);
}

const WorkerView* PeerReports::worker_of(const JobSnapshot& s, long generation, const SlotKey& slot) const {
  const WorkerView* found = nullptr;
  for (const WorkerView& w : s.workers) {
    if (w.assignment.slot == slot && w.launched_generation <= generation &&
        (!found || w.launched_generation >= found->launched_generation)) {
      found = &w;
    }
  }
  return found;
}

bool PeerReports::pending(const std::vector<JoinRequest>& rejoined) const {
  return !rejoined.empty() ||
         std::any_of(leaving_.begin(), leaving_.end(), [](const auto& g) { return !g.second.silent.empty(); });
}

Actions PeerReports::take(const JobSnapshot& s, const std::vector<JoinRequest>& rejoined) {
  excluded_.clear();
  Actions out;
  // Every re-join is counted before any report is acted on, so that a report
  // naming a rank that re-joined in the same snapshot finds it re-joined
  // (exclude_reported()).
  for (auto& j : rejoined) {
    if (j.left_generation >= 0) leaving_[j.left_generation].left.insert(j.slot);
  }
  for (auto& j : rejoined) {
    const Plan* left = plan_of(j.left_generation);
    const RankAssignment* a = left ? left->find(j.slot) : nullptr;
    std::string report = j.failed_rank >= 0 ? fmt::format("; rank {} failed it ({})", j.failed_rank,
                                                          to_string(j.failed_state))
                                            : "";
    ERUN_LOG_INFO("{}: re-joins at commit {}: {}{}", who(j.left_generation, j.slot.host, a ? a->rank : -1),
                  j.commit_id, to_string(j.reason), report);
    out.push_back(act::Emit{ev::Rejoined{.generation = j.left_generation,
                                         .host = j.slot.host,
                                         .slot = j.slot.local_index,
                                         .reason = to_string(j.reason),
                                         .failed_rank = j.failed_rank,
                                         .failed_state = to_string(j.failed_state),
                                         .commit = static_cast<long>(j.commit_id)}});
    // A survivor of a failure re-joins at the commit it restored.
    if (j.reason != JoinReason::kHostsUpdated && j.reason != JoinReason::kStart && j.commit_id > 0) {
      out.push_back(act::RolledBack{j.left_generation, j.commit_id,
                                    j.commit_age_ms > 0 ? j.commit_age_ms / 1000.0 : -1.0});
    }
    if (j.failed_rank < 0 || j.reason == JoinReason::kHostsUpdated) continue;
    if (j.failed_state == PeerState::kSilent) {
      leaving_[j.left_generation].silent.push_back(j);
    } else {
      exclude_reported(j, s, out);
    }
  }
  settle(s, out);
  return out;
}

// A rank named "silent" was waited on over the network: it may be frozen, or
// alive and blocked on a frozen rank itself (in a ring every survivor times
// out on its left neighbour), and such a neighbour re-joins within its own
// collective timeout. So a silent report alone excludes no one. The members
// of the left generation that neither re-joined nor ended are its "open"
// members; once a re-joined member named one of them silent and every other
// member re-joined or ended:
// - One open member, and every other member re-joined: it is excluded at
//   once. Nobody it could be waiting on is still in the generation's
//   collectives, so it is stopped, hung, or slower than the collective
//   timeout (the shared-memory rule's "alive but not arriving").
// - Several open members, or one beside a member that ended (its loss, not
//   the open one, may be what the survivors timed out on): a live one among
//   them is blocked on a re-joined or dead member, whose connections are
//   closed, or on another open one, whose timeout falls within a step of its
//   accusers'. So it re-joins within moments: the open members are excluded
//   together once the generation's members stayed as they are for
//   kSilentSettle. Two frozen members cost the collective timeout plus
//   kSilentSettle instead of the re-join deadline (twice the timeout + 1 s).
// When no open member was named (a frozen rank whose only watcher died), the
// open members are left to the re-join deadline (the driver's
// RejoinDeadlines, policies/rejoin.h).
void PeerReports::settle(const JobSnapshot& s, Actions& out) {
  for (auto it = leaving_.begin(); it != leaving_.end();) {
    const Plan* left = plan_of(it->first);
    if (!left) {
      it = leaving_.erase(it);  // older than the recent plans: no report can name its ranks any more
      continue;
    }
    const long generation = it->first;
    LeftGeneration& g = it->second;
    ++it;
    if (!g.silent.empty()) settle_one(s, generation, *left, g, out);
  }
}

void PeerReports::settle_one(const JobSnapshot& s, long generation, const Plan& left, LeftGeneration& g,
                             Actions& out) {
  std::vector<const RankAssignment*> open_members;
  size_t ended = 0;
  for (auto& r : left.ranks) {
    if (g.left.count(r.slot)) continue;
    const WorkerView* w = worker_of(s, generation, r.slot);
    if (w && open(*w)) {
      open_members.push_back(&r);
    } else {
      ++ended;
    }
  }
  const size_t settled = g.left.size() + ended;
  if (settled != g.settled) {
    g.settled = settled;
    g.changed_at = s.now;
  }
  if (open_members.empty()) {
    g.silent.clear();  // nobody left to exclude
    return;
  }
  auto names_open = [&](const JoinRequest& j) {
    return std::any_of(open_members.begin(), open_members.end(),
                       [&](const RankAssignment* r) { return j.failed_rank == r->rank; });
  };
  auto named = std::find_if(g.silent.begin(), g.silent.end(), names_open);
  if (named == g.silent.end()) return;
  const bool alone = open_members.size() == 1 && ended == 0;
  if (!alone && s.now - g.changed_at < kSilentSettle) return;
  const JoinRequest report = *named;
  const std::vector<JoinRequest> reports = std::exchange(g.silent, {});  // decided: later reports change nothing
  if (alone) {
    exclude_reported(report, s, out, fmt::format(", and every other member of generation {} re-joined", generation));
    return;
  }
  exclude_open(s, generation, open_members, report, reports, out);
}

void PeerReports::exclude_open(const JobSnapshot& s, long generation, const std::vector<const RankAssignment*>& open,
                               const JoinRequest& report, const std::vector<JoinRequest>& reports, Actions& out) {
  std::vector<int> ranks;
  for (auto* r : open) ranks.push_back(r->rank);
  for (auto* r : open) {
    const WorkerView* w = worker_of(s, generation, r->slot);
    auto by = std::find_if(reports.begin(), reports.end(),
                           [&](const JoinRequest& j) { return j.failed_rank == r->rank; });
    ERUN_LOG_WARN("{}: {}; rank{} {} of generation {} neither re-joined nor ended within {:.1f} s of the other "
                  "members; killing {} and going on without {}",
                  who(generation, r->slot.host, r->rank),
                  by != reports.end() ? fmt::format("named silent by {}", reporter(*by))
                                      : fmt::format("not named by anyone (rank {} was named silent)",
                                                    report.failed_rank),
                  ranks.size() == 1 ? "" : "s", fmt::join(ranks, ","), generation, seconds(kSilentSettle),
                  ranks.size() == 1 ? "it" : "them", ranks.size() == 1 ? "it" : "them");
    exclude(s, *w, generation, *r, PeerState::kSilent, out);
  }
}

void PeerReports::exclude_reported(const JoinRequest& report, const JobSnapshot& s, Actions& out,
                                   const std::string& why) {
  const Plan* left = plan_of(report.left_generation);
  if (!left || report.failed_rank >= left->size()) return;
  const RankAssignment& failed = left->ranks[static_cast<size_t>(report.failed_rank)];
  if (failed.slot == report.slot) return;  // a worker does not report itself
  // Only the worker that held the rank then: a replacement launched later on
  // the same slot is not the one reported.
  const WorkerView* w = worker_of(s, report.left_generation, failed.slot);
  if (!w || !w->alive || w->state == WorkerState::kExcluded || excluded_.count(w->key)) return;
  // Nor one that re-joined from that generation itself: it left the
  // collective the reporter waited in (blocked on another rank), so it is
  // neither stopped nor hung. A report that reaches the driver a tick before
  // that re-join still kills it; a host leader's followers do not make such
  // reports (OutsideMark aborts their segment before the leader leaves).
  if (auto g = leaving_.find(report.left_generation); g != leaving_.end() && g->second.left.count(failed.slot)) {
    ERUN_LOG_INFO("{}: reported by {} as {}, but it re-joined itself; it stays",
                  who(report.left_generation, failed.slot.host, failed.rank), reporter(report),
                  to_string(report.failed_state));
    return;
  }
  ERUN_LOG_WARN("{}: reported by {} as {}{}; killing it and going on without it",
                who(report.left_generation, failed.slot.host, failed.rank), reporter(report),
                to_string(report.failed_state), why);
  exclude(s, *w, report.left_generation, failed, report.failed_state, out);
}

void PeerReports::exclude(const JobSnapshot& s, const WorkerView& w, long generation, const RankAssignment& failed,
                          PeerState state, Actions& out) {
  excluded_.insert(w.key);
  out.push_back(act::Emit{ev::WorkerExcluded{
      .generation = generation, .host = failed.slot.host, .rank = failed.rank, .state = to_string(state)}});
  // Its exit, when it comes, is this failure, not another.
  out.push_back(act::Exclude{w.key});
  out.push_back(act::FailGeneration{failed.slot.host, failed.rank, ExitStatus{0, SIGKILL},
                                    {fmt::format("reported by a survivor as {}", to_string(state))},
                                    seconds(s.now - w.started)});
}

}  // namespace erun
