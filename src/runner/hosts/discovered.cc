#include "runner/hosts/discovered.h"

#include "common/log.h"
#include "runner/observe/event_log.h"

namespace erun {

std::optional<HostSet> DiscoveredHosts::refresh(DiscoveryLoop& loop, HostDiscovery& discovery, bool synchronous,
                                                Duration interval, TimePoint now, EventSink& events) {
  if (synchronous) {
    if (now - last_at < interval) return std::nullopt;
    last_at = now;
    auto r = discovery.discover();
    if (!r) {
      if (r.message() != last_error) {
        ERUN_LOG_WARN("host discovery failed, keeping the previous {} host(s): {}; erun runs the script again every "
                      "{:.0f} s: fix the script or what it reads",
                      listed.size(), r.message(), seconds(interval));
      }
      last_error = r.message();
      return std::nullopt;
    }
    last_error.clear();
    if (*r == listed) return std::nullopt;
    ERUN_LOG_INFO("hosts changed: {} (now {})", diff_hosts(listed, *r).summary(), r->summary());
    events.emit(ev::HostsChanged{.hosts = r->to_string()});
    return std::move(*r);
  }
  if (loop.version() == version) return std::nullopt;  // no copy of the host set per tick
  auto snap = loop.snapshot();
  if (snap.version == version) return std::nullopt;
  ERUN_LOG_INFO("hosts changed: {} (now {})", diff_hosts(listed, snap.hosts).summary(), snap.hosts.summary());
  events.emit(ev::HostsChanged{.hosts = snap.hosts.to_string()});
  version = snap.version;
  return std::move(snap.hosts);
}

void DiscoveredHosts::derive(HostSet usable, const std::function<bool(const std::string&)>& is_local) {
  hosts = std::move(usable);
  ++epoch;
  all_local = true;
  for (auto& h : hosts.hosts()) all_local = all_local && is_local(h.name);
}

}  // namespace erun
