#include "runner/hosts/host_manager.h"

#include <algorithm>

namespace erun {

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

HostSet HostManager::usable(const HostSet& discovered) const {
  if (epoch().blacklisted_now == 0) return discovered;
  std::vector<Host> out;
  out.reserve(discovered.size());
  for (auto& h : discovered.hosts()) {
    if (!is_blacklisted(h.name)) out.push_back(h);
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
