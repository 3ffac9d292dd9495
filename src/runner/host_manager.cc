#include "runner/host_manager.h"

#include <algorithm>

namespace erun {

bool HostManager::record_failure(const std::string& host) {
  auto& r = history_[host];
  if (++r.failures_in_a_row < policy_.blacklist_after) return false;
  r.failures_in_a_row = 0;
  Duration cooldown = policy_.cooldown_min;
  for (int i = 0; i < r.times_blacklisted && cooldown < policy_.cooldown_max; ++i) cooldown *= 2;
  cooldown = std::min(cooldown, policy_.cooldown_max);
  r.times_blacklisted++;
  r.blacklisted_until = clock_.now() + cooldown;
  return true;
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
