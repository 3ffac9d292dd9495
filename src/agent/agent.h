// The erun agent (`erun --agent`): one per host, it starts, signals and reaps
// that host's workers for the driver; its watchdog stops them if the agent
// dies (docs/protocol.md, "The agent protocol"). Single-threaded; run_agent()
// owns the process (signal mask, SIGCHLD).
#pragma once

#include <string>

#include "common/clock.h"

namespace erun::agent {

struct AgentOptions {
  int in_fd = 0;   // from the driver
  int out_fd = 1;  // to the driver
  std::string host;  // this host's name, for HELLO and logs
  Duration heartbeat_interval = std::chrono::seconds(1);
  // The driver silent this long: treated as gone.
  Duration heartbeat_timeout = std::chrono::seconds(5);
  Duration secret_timeout = std::chrono::seconds(60);  // for the first line
  // Relay the workers' rendezvous connections (agent/relay.h): a worker whose
  // START env names the driver's rendezvous (ERUN_RDZV_ADDR, ERUN_RDZV_PORT,
  // ERUN_JOB_ID) gets this agent's socket as ERUN_RDZV_ADDR instead.
  bool relay = false;
  std::string relay_dir = "/tmp";  // where the relay's and the attach socket's private directories are made ($TMPDIR)
  // --driver-grace: when the driver's channel breaks without SHUTDOWN (erun
  // killed, the connection dropped, heartbeats lost), the workers keep
  // running this long while the agent holds their output and exits for a
  // new driver, which reaches it through its attach socket
  // (docs/protocol.md, "Taking a job over"). 0: the workers stop at once.
  Duration driver_grace = Duration::zero();
  // --drain-timeout: SIGTERM to the agent, or a worker that takes its own
  // SIGTERM as a notice (it writes 'D' on its ERUN_AGENT_FD), drains the
  // host: DRAINING to the driver, whose plan leaves the host's workers out at
  // their next commit; the agent exits once they are gone, and stops any
  // still running after this (plus 10 s for the driver's own deadline).
  // 0: SIGTERM stops the workers at once.
  Duration drain_timeout = Duration::zero();
};


// Runs until the driver is gone or says SHUTDOWN; returns the agent's exit
// code (0 after SHUTDOWN, 1 when the driver's channel was lost or broken).
// Every process, signal, file and socket call goes through `env`.
int run_agent(const AgentOptions& options);  // on Env::real() (agent/env.h)

// `erun --agent --attach PATH`: connects to a running agent's attach socket
// and carries bytes between it and this process's stdin and stdout, so that
// a new driver reaches the agent as it reaches a new one (a local child, or
// over ssh) and no new port is opened. Returns 0 when either side ended, 1
// when the socket cannot be reached (the agent is gone).
int run_attach_pump(const std::string& path, int in_fd = 0, int out_fd = 1);

}  // namespace erun::agent
