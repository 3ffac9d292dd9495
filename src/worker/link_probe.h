// The pre-flight link probe (docs/design.md, "Stragglers"): a worker
// launched on a host new to the job times one round trip of kLinkProbeBytes
// with a worker of the job on another host before it first joins, and sends
// the time in its JOIN; the driver holds the host back when its link is far
// slower than the job's (or the round trip does not finish within the
// probe's bound). Every worker answers such probes while it lives
// (LinkProbeResponder), on its advertised address.
//
// The exchange, after erun's mutual HMAC handshake under the job secret
// (common/handshake.h, bound to the job id):
//   prober: "ERUNPROB" nonce(32)           responder: nonce(32) proof(32)
//   prober: proof(32)
//   prober: u32 length (at most kLinkProbeBytes), the bytes
//   responder: the same bytes back, then closes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/clock.h"
#include "common/fd.h"
#include "common/serial_server.h"
#include "common/status.h"

namespace erun::worker {

inline constexpr uint32_t kLinkProbeBytes = 1u << 20;

// Answers probes on `address` (an ephemeral port) from a thread of its own,
// one connection at a time, each bounded by `io_timeout`. A connection that
// fails the handshake is closed and changes nothing.
class LinkProbeResponder {
 public:
  LinkProbeResponder(const std::string& address, const std::string& job_id, const std::string& secret,
                     Duration io_timeout = std::chrono::seconds(2));
  ~LinkProbeResponder();
  LinkProbeResponder(const LinkProbeResponder&) = delete;
  LinkProbeResponder& operator=(const LinkProbeResponder&) = delete;
  // The port it listens on; 0 when it could not listen (the worker then
  // answers no probe: nobody is held back for it).
  int port() const { return server_->port(); }

 private:
  std::unique_ptr<net::SerialServer> server_;
};

// One round trip of `bytes` (at most kLinkProbeBytes) with the responder at
// host:port, handshake included, within `timeout`: the time it took, or why
// it failed (a timeout says so).
Result<Duration> probe_link(const std::string& host, int port, const std::string& job_id, const std::string& secret,
                            uint32_t bytes, Duration timeout);

}  // namespace erun::worker
