// What the survivors of a failure report (docs/design.md, "Recovery
// policy"): each re-joins with the reason its collective failed and, when it
// knows, the rank that failed it (exited, aborted, or silent: waited on over
// the network). A rank reported exited or aborted is excluded at once; a
// rank reported silent only by the rule of settle() (a silent rank may be
// blocked on a frozen one itself). Excluding a worker kills it, leaves it
// out for good, and makes the generation's failure. The reports name ranks
// of the generation the reporter left: the last few published plans are
// kept here to read them.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "runner/policies/policy.h"

namespace erun {

class PeerReports {
 public:
  // A plan was published (or adopted): reports may name its ranks.
  void published(const Plan& plan);
  // The plan of a recent generation, or null.
  const Plan* plan_of(long generation) const;
  // This turn's re-joins (MembershipSnapshot::rejoined): each is logged and
  // written (Rejoined), a survivor's restore is noted (RolledBack), and the
  // ranks reported failed are excluded; then every left generation's silent
  // reports are looked at again (settle()).
  Actions take(const JobSnapshot& s, const std::vector<JoinRequest>& rejoined);
  // take() has something to do: re-joins came, or silent reports wait to be settled.
  bool pending(const std::vector<JoinRequest>& rejoined) const;

 private:
  // Per left generation (one of plans_): the slots that re-joined from it,
  // and the reports naming one of its ranks silent.
  struct LeftGeneration {
    std::set<SlotKey> left;
    std::vector<JoinRequest> silent;
    size_t settled = 0;      // members that re-joined or ended, when last counted
    TimePoint changed_at{};  // when that count last changed
  };
  // How long the members of a left generation must stay as they are before
  // several open members (or one beside a member that ended) are excluded
  // together on a silent report.
  static constexpr Duration kSilentSettle = std::chrono::milliseconds(500);

  // The silent reports of every left generation (see peer_reports.cc).
  void settle(const JobSnapshot& s, Actions& out);
  void settle_one(const JobSnapshot& s, long generation, const Plan& left, LeftGeneration& g, Actions& out);
  // Excludes the worker that held the reported rank in the report's
  // generation, unless it re-joined from it itself; `why` ends the log line.
  void exclude_reported(const JoinRequest& report, const JobSnapshot& s, Actions& out, const std::string& why = "");
  // Excludes the open members of `generation` together, naming who reported each.
  void exclude_open(const JobSnapshot& s, long generation, const std::vector<const RankAssignment*>& open,
                    const JoinRequest& report, const std::vector<JoinRequest>& reports, Actions& out);
  // `w`, which held `failed` in `generation`, is killed and left out.
  void exclude(const JobSnapshot& s, const WorkerView& w, long generation, const RankAssignment& failed,
               PeerState state, Actions& out);
  // The worker that held `slot` in `generation` (the latest launched by then), or null.
  const WorkerView* worker_of(const JobSnapshot& s, long generation, const SlotKey& slot) const;
  // Alive, not left out, and not excluded in this turn.
  bool open(const WorkerView& w) const { return w.alive && !w.left_out() && !excluded_.count(w.key); }
  // who() of the survivor that sent `report`.
  std::string reporter(const JoinRequest& report) const;

  std::vector<Plan> plans_;  // the last few published plans, oldest first
  std::map<long, LeftGeneration> leaving_;
  std::set<long> excluded_;  // the workers excluded in this turn (the snapshot still shows them)
};

}  // namespace erun
