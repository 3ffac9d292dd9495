#include "runner/policies/replicas.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "common/log.h"
#include "common/strings.h"

namespace erun {

namespace {
// A keeper that could not be asked, or whose agent was lost, is asked again
// after kRetry, twice that after a second failure, and so on up to kMaxRetry
// (an unreachable spare costs an ssh attempt and a log line each time).
// REPLICATE is repeated every kRetry.
constexpr auto kRetry = std::chrono::seconds(5);
constexpr auto kMaxRetry = std::chrono::seconds(300);
// A keeper no longer wanted on a host that is still a spare keeps its
// replicas this long after the holders last changed before its agent is
// told to drop them: a holder new to the plan has the commit once its
// workers synced.
constexpr auto kRetire = std::chrono::seconds(60);
}  // namespace

std::vector<std::pair<std::string, std::string>> plan_keepers(const std::vector<std::string>& holders,
                                                              const std::vector<std::string>& spares, int replicas,
                                                              const std::map<std::string, std::string>& current) {
  std::vector<std::pair<std::string, std::string>> plan;
  if (holders.empty() || replicas <= 0) return plan;
  const size_t need = static_cast<size_t>(std::max(0, replicas + 1 - static_cast<int>(holders.size())));
  // Which spares: the current keepers first, then the others in order.
  std::set<std::string> chosen;
  for (const std::string& s : spares) {
    if (chosen.size() < need && current.count(s)) chosen.insert(s);
  }
  for (const std::string& s : spares) {
    if (chosen.size() < need) chosen.insert(s);
  }
  // Which holder: the one it had, while it is a holder; otherwise the one
  // with the fewest keepers (the first of those).
  std::map<std::string, size_t> load;
  for (const std::string& h : holders) load[h] = 0;
  std::map<std::string, std::string> holder_of;
  for (const std::string& s : spares) {
    auto it = current.find(s);
    if (chosen.count(s) && it != current.end() && load.count(it->second)) {
      holder_of[s] = it->second;
      ++load[it->second];
    }
  }
  for (const std::string& s : spares) {
    if (!chosen.count(s) || holder_of.count(s)) continue;
    const std::string* least = &holders.front();
    for (const std::string& h : holders) {
      if (load[h] < load[*least]) least = &h;
    }
    holder_of[s] = *least;
    ++load[*least];
  }
  for (const std::string& s : spares) {
    if (chosen.count(s)) plan.emplace_back(s, holder_of[s]);
  }
  return plan;
}

CommitReplicas::CommitReplicas(int replicas, std::string secret,
                               std::function<std::string(const std::string&)> commit_dir,
                               std::function<std::string(const std::string&)> address,
                               std::function<Launcher&(const std::string&)> launcher_for, Clock& clock,
                               std::map<std::string, std::string>& holders)
    : replicas_(replicas),
      secret_(std::move(secret)),
      commit_dir_(std::move(commit_dir)),
      address_(std::move(address)),
      launcher_for_(std::move(launcher_for)),
      clock_(clock),
      holders_(holders) {
  // A job taken over: the keepers its record names are this plan's own.
  for (auto& [host, holder] : holders_) keepers_[host];
}

void CommitReplicas::back_off(Keeper& k, TimePoint now) {
  k.backoff = k.backoff == Duration{} ? Duration(kRetry) : std::min<Duration>(k.backoff * 2, kMaxRetry);
  k.retry_at = now + k.backoff;
}

void CommitReplicas::drop(const std::string& host, Keeper& k) {
  // Port 0: the holder stops its pusher to this keeper (only that one).
  if (!k.told.empty()) launcher_for_(k.told).replicate(k.told, address_(host), 0, commit_dir_(host));
  k.told.clear();
}

void CommitReplicas::plan(const std::vector<std::string>& holders, const std::vector<std::string>& spares) {
  if (holders.empty()) return;  // nothing to plan from: the keepers keep what they have
  const auto plan = plan_keepers(holders, spares, replicas_, holders_);
  std::vector<std::string> words;
  for (auto& [keeper, holder] : plan) words.push_back(fmt::format("{} from {}", keeper, holder));
  const int hosts = static_cast<int>(holders.size() + plan.size());
  std::string said = words.empty() ? "" : join(words, ", ");
  if (replicas_ > 0 && hosts < replicas_ + 1 && !holders.empty()) {
    said += fmt::format("{}each commit is on {} host(s), fewer than --commit-replicas {} + 1: no more spare hosts",
                        said.empty() ? "" : "; ", hosts, replicas_);
  }
  if (said != last_said_) {
    if (!words.empty()) ERUN_LOG_INFO("commit replicas on spare hosts: {}", said);
    else if (!said.empty()) ERUN_LOG_INFO("commit replicas: {}", said);
    last_said_ = said;
  }
  const std::map<std::string, std::string> wanted(plan.begin(), plan.end());
  const std::set<std::string> holding(holders.begin(), holders.end());
  const std::set<std::string> spare(spares.begin(), spares.end());
  // New holders have the commit only once their workers synced, which the
  // driver does not see: a keeper is retired kRetire after the holders last
  // changed, never sooner.
  const bool new_holders = holding != last_holders_;
  last_holders_ = holding;
  const TimePoint now = clock_.now();
  for (auto it = keepers_.begin(); it != keepers_.end();) {
    Keeper& k = it->second;
    if (wanted.count(it->first)) {
      ++it;
      continue;
    }
    drop(it->first, k);
    if (spare.count(it->first)) {
      // Still a spare, but its copy is beyond the replicas asked for.
      if (!k.retiring || new_holders) k.retire_at = now + kRetire;
      k.retiring = true;
      ++it;
      continue;
    }
    // Its host runs workers now (its replicas go once they hold a commit
    // as new), or it left the spares (out of discovery or blacklisted: its
    // replicas stay, should it come back while they are the newest).
    ERUN_LOG_DEBUG("commit replicas: {} keeps no more", it->first);
    launcher_for_(it->first).unkeep(it->first, /*forget=*/false);
    holders_.erase(it->first);
    it = keepers_.erase(it);
  }
  for (auto& [host, holder] : wanted) {
    Keeper& k = keepers_[host];
    k.retiring = false;
    std::string& now_from = holders_[host];
    if (now_from != holder) {
      drop(host, k);
      now_from = holder;
    }
  }
}

// Forgets the keepers whose retirement is due: their agents drop the replicas.
void CommitReplicas::retire_due(TimePoint now) {
  for (auto it = keepers_.begin(); it != keepers_.end();) {
    if (!it->second.retiring || now < it->second.retire_at) {
      ++it;
      continue;
    }
    ERUN_LOG_DEBUG("commit replicas: {} keeps no more, and its replicas go", it->first);
    launcher_for_(it->first).unkeep(it->first, /*forget=*/true);
    holders_.erase(it->first);
    it = keepers_.erase(it);
  }
}

// Whether the keeper on `host` listens (asking it to keep, or again after a
// back-off); false while it has no port to push to.
bool CommitReplicas::keeper_listens(const std::string& host, Keeper& k, TimePoint now) {
  Launcher& launcher = launcher_for_(host);
  if (!k.asked) {
    if (now < k.retry_at) return false;
    k.asked = launcher.keep(host, commit_dir_(host), secret_);
    k.port = 0;
    k.kept_at = now;
    if (!k.asked) {
      back_off(k, now);
      return false;
    }
  }
  const std::optional<int> port = launcher.keeper_port(host);
  if (k.port == 0 && !port) return false;  // no answer yet
  if (port.value_or(k.port) == 0) {
    // It could not keep (its agent said why), or its agent was lost: ask
    // again after a while.
    k.asked = false;
    k.port = 0;
    back_off(k, now);
    drop(host, k);
    return false;
  }
  if (port && *port != k.port) {
    // The first answer, or a keeper started again on a new port (KEEP is
    // repeated, and an agent whose keeper ended starts another): the
    // holder is told the new port at once.
    if (k.port != 0) k.told_at = TimePoint{};
    k.port = *port;
    k.backoff = Duration{};
  }
  return true;
}

void CommitReplicas::tick() {
  const TimePoint now = clock_.now();
  retire_due(now);
  for (auto& [host, k] : keepers_) {
    if (k.retiring || !keeper_listens(host, k, now)) continue;
    if (now >= k.kept_at + kRetry) {
      (void)launcher_for_(host).keep(host, commit_dir_(host), secret_);
      k.kept_at = now;
    }
    // Said again now and then: a holder's agent started anew since has no
    // pusher (an agent ignores the same target twice).
    const std::string& holder = holders_.at(host);
    if (k.told != holder || now >= k.told_at + kRetry) {
      if (k.told != holder) {
        ERUN_LOG_DEBUG("commit replicas: {} pushes to the keeper on {} (port {})", holder, host, k.port);
      }
      launcher_for_(holder).replicate(holder, address_(host), k.port, commit_dir_(host));
      k.told = holder;
      k.told_at = now;
    }
  }
}

std::map<std::string, std::string> CommitReplicas::serving() const {
  std::map<std::string, std::string> out;
  for (auto& [host, k] : keepers_) {
    if (!k.told.empty() && !k.retiring) out[host] = k.told;
  }
  return out;
}

void CommitReplicas::tend(const Plan& running, const HostSet& usable, const HostSet& discovered,
                          const HostManager& hosts, long recomputations) {
  if (recomputations != planned_at_) {
    planned_at_ = recomputations;
    std::vector<std::string> holders, spares;
    std::set<std::string> seen;
    for (auto& r : running.ranks) {
      if (seen.insert(r.slot.host).second) holders.push_back(r.slot.host);
    }
    for (auto& h : usable.hosts()) {
      if (seen.insert(h.name).second) spares.push_back(h.name);
    }
    // A blacklisted host still keeps, and is sent, replicas (after the
    // usable spares): its workers failed, not its memory, which may hold
    // the only other copy when the holders are lost.
    if (hosts.epoch().blacklisted_now > 0) {
      for (auto& h : discovered.hosts()) {
        if (hosts.is_blacklisted(h.name) && seen.insert(h.name).second) spares.push_back(h.name);
      }
    }
    plan(holders, spares);
  }
  tick();
}

}  // namespace erun
