#include "runner/policies/departed.h"

#include <unordered_set>

namespace erun {

void DepartedHosts::listed(const HostSet& before, const HostSet& after) {
  std::unordered_set<std::string_view> now;
  now.reserve(after.size());
  for (const Host& h : after.hosts()) {
    now.insert(h.name);
    hosts_.erase(h.name);
  }
  for (const Host& h : before.hosts()) {
    if (!now.count(h.name)) hosts_.insert(h.name);
  }
}

Actions DepartedHosts::tend(const JobSnapshot& s, const std::function<bool(const std::string&)>& keeps) {
  if (hosts_.empty() || s.now < next_tend_) return {};
  next_tend_ = s.now + std::chrono::seconds(1);
  const std::set<std::string> working = s.working_hosts();
  Actions out;
  for (auto it = hosts_.begin(); it != hosts_.end();) {
    if (working.count(*it) || keeps(*it)) {
      ++it;
    } else {
      out.push_back(act::ReleaseAgent{*it});
      it = hosts_.erase(it);
    }
  }
  return out;
}

}  // namespace erun
