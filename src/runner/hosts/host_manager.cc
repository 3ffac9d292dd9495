#include "runner/hosts/host_manager.h"

#include <algorithm>

#include "common/log.h"
#include "runner/observe/event_log.h"

namespace erun {

bool HostManager::count_failure(const std::string& host, bool unreachable, EventSink& events) {
  const Blacklisting b = record_failure(host, unreachable);
  if (!b) return false;
  if (b.again) {
    ERUN_LOG_WARN("{} still cannot be reached: it sits out another {:.0f} s (the same cooldown: an outage is not the "
                  "host's fault), then is tried again",
                  host, seconds(blacklisted_until(host) - clock_.now()));
  } else {
    ERUN_LOG_WARN("{} blacklisted for {:.0f} s after {} failure(s) in a row: the job goes on without it, then tries "
                  "it again (see --blacklist-after and --blacklist-cooldown-range)",
                  host, seconds(blacklisted_until(host) - clock_.now()), policy_.blacklist_after);
  }
  events.emit(ev::HostBlacklisted{.host = host});
  return true;
}

HostManager::Blacklisting HostManager::record_failure(const std::string& host, bool unreachable) {
  auto& r = history_[host];
  if (unreachable && r.blacklisted_until > clock_.now()) return {};
  if (++r.failures_in_a_row < policy_.blacklist_after) return {};
  r.failures_in_a_row = 0;
  // The cooldown of blacklisting number `n` (from 0).
  auto cooldown_of = [&](int n) {
    Duration cooldown = policy_.cooldown_min;
    for (int i = 0; i < n && cooldown < policy_.cooldown_max; ++i) cooldown *= 2;
    return std::min(cooldown, policy_.cooldown_max);
  };
  if (unreachable && r.times_blacklisted > 0) {
    r.blacklisted_until = clock_.now() + cooldown_of(r.times_blacklisted - 1);
    return {true, true};
  }
  r.blacklisted_until = clock_.now() + cooldown_of(r.times_blacklisted);
  r.times_blacklisted++;
  return {true, false};
}

void HostManager::record_success(const std::string& host) {
  auto it = history_.find(host);
  if (it == history_.end()) return;
  it->second.failures_in_a_row = 0;
  if (it->second.times_blacklisted == 0) history_.erase(it);  // nothing left to carry
}

bool HostManager::is_blacklisted(const std::string& host) const {
  auto it = history_.find(host);
  return it != history_.end() && it->second.blacklisted_until > clock_.now();
}

TimePoint HostManager::blacklisted_until(const std::string& host) const {
  auto it = history_.find(host);
  return it == history_.end() ? TimePoint{} : it->second.blacklisted_until;
}

HostSet HostManager::usable(const HostSet& discovered, const std::vector<SlotKey>& kept) const {
  if (epoch().blacklisted_now == 0) return discovered;
  // `kept` is sorted: a host's slots lie together.
  auto holds = [&](const std::string& host) {
    auto it = std::lower_bound(kept.begin(), kept.end(), host,
                               [](const SlotKey& k, const std::string& h) { return k.host < h; });
    return it != kept.end() && it->host == host;
  };
  std::vector<Host> out;
  out.reserve(discovered.size());
  for (auto& h : discovered.hosts()) {
    if (!is_blacklisted(h.name) || holds(h.name)) out.push_back(h);
  }
  return HostSet(std::move(out));
}

HostManager::Epoch HostManager::epoch() const {
  Epoch e;
  auto now = clock_.now();
  for (auto& [host, r] : history_) {
    e.blacklistings += r.times_blacklisted;
    e.blacklisted_now += r.blacklisted_until > now;
  }
  return e;
}

std::vector<std::string> HostManager::blacklisted() const {
  std::vector<std::string> out;
  for (auto& [host, r] : history_) {
    if (r.blacklisted_until > clock_.now()) out.push_back(host);
  }
  return out;
}

}  // namespace erun
