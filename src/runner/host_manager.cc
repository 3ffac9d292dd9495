#include "runner/host_manager.h"

#include <algorithm>

namespace erun {

bool HostManager::record_failure(const std::string& host) {
  auto& r = records_[host];
  ++changes_;
  if (++r.failures_in_a_row < policy_.blacklist_after) return false;
  r.failures_in_a_row = 0;
  Duration cooldown = policy_.cooldown_min;
  for (int i = 0; i < r.times_blacklisted && cooldown < policy_.cooldown_max; ++i) cooldown *= 2;
  cooldown = std::min(cooldown, policy_.cooldown_max);
  r.times_blacklisted++;
  ++blacklistings_;
  r.until = clock_.now() + cooldown;
  return true;
}

void HostManager::record_success(const std::string& host) {
  auto it = records_.find(host);
  if (it != records_.end() && it->second.failures_in_a_row != 0) {
    it->second.failures_in_a_row = 0;
    ++changes_;
  }
}

bool HostManager::is_blacklisted(const std::string& host) const {
  auto it = records_.find(host);
  return it != records_.end() && it->second.until > clock_.now();
}

TimePoint HostManager::blacklisted_until(const std::string& host) const {
  auto it = records_.find(host);
  return it == records_.end() ? TimePoint{} : it->second.until;
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
  e.blacklistings = blacklistings_;
  auto now = clock_.now();
  for (auto& [host, r] : records_) e.blacklisted_now += r.until > now;
  return e;
}

std::vector<std::string> HostManager::blacklisted() const {
  std::vector<std::string> out;
  for (auto& [host, r] : records_) {
    if (r.until > clock_.now()) out.push_back(host);
  }
  return out;
}

std::vector<HostHistory> HostManager::history() const {
  std::vector<HostHistory> out;
  const TimePoint now = clock_.now();
  for (auto& [host, r] : records_) {
    if (r.failures_in_a_row == 0 && r.times_blacklisted == 0) continue;
    out.push_back(HostHistory{host, r.failures_in_a_row, r.times_blacklisted,
                              r.until > now ? r.until - now : Duration::zero()});
  }
  return out;
}

void HostManager::restore(const std::vector<HostHistory>& h) {
  const TimePoint now = clock_.now();
  ++changes_;
  for (auto& one : h) {
    auto& r = records_[one.host];
    r.failures_in_a_row = one.failures_in_a_row;
    r.times_blacklisted = one.times_blacklisted;
    r.until = one.blacklisted_for > Duration::zero() ? now + one.blacklisted_for : TimePoint{};
    if (r.until > now) ++blacklistings_;
  }
}

}  // namespace erun
