// The hosts as the driver last heard of them from discovery: as listed
// (draining marks included) and as the plans may use them (less the hosts
// that drain), and when to look again. refresh() reads the discovery loop
// (or, in deterministic tests, runs discovery itself); the driver hands a
// changed list to its drain policy, then derive() sets the usable hosts.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "common/clock.h"
#include "discovery/discovery.h"

namespace erun {

class EventSink;

struct DiscoveredHosts {
  HostSet listed;           // as discovery lists them (draining marks included)
  HostSet hosts;            // listed less the draining hosts: what the plans use
  bool all_local = true;    // every usable host launches locally
  long version = -1;        // the discovery loop's snapshot they came from
  long epoch = 0;           // bumps whenever the usable slots may change (the plan cache and standbys look again)
  TimePoint last_at{};      // the last discovery (start(); then in refresh() when synchronous)
  std::string last_error;   // the last failure logged

  // The hosts discovery lists now, when they differ from `listed` (logged,
  // and written as hosts_changed); nullopt when nothing changed or a
  // discovery failed (the previous hosts are kept, the failure logged once).
  // `synchronous`: runs `discovery` here every `interval` instead of
  // reading `loop`'s snapshot.
  std::optional<HostSet> refresh(DiscoveryLoop& loop, HostDiscovery& discovery, bool synchronous, Duration interval,
                                 TimePoint now, EventSink& events);
  // hosts = `usable` (listed less the draining hosts); all_local from
  // `is_local(host)` over them; the epoch moves on.
  void derive(HostSet usable, const std::function<bool(const std::string&)>& is_local);
};

}  // namespace erun
