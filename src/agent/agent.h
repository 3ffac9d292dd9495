// The erun agent: one per host, started by the driver (`erun --agent`) over
// ssh, as a Slurm step, or as a local child. Its channel to the driver is its
// own stdin (the job secret line, then frames, see protocol.h) and stdout.
// It starts each worker in its own session with the agent's own environment
// (the login environment over ssh, erun's own locally) and the variables the
// driver sent set over it, plus ERUN_SECRET, forwards the worker's output as whole lines
// (and appends it to per-rank files on this host when START names a directory),
// reports its exit at once with its last stderr lines, and signals, terminates
// or kills it on request.
//
// No worker outlives the job: when the driver's channel ends (EOF, a malformed
// frame, SHUTDOWN, no frame for the heartbeat timeout, SIGTERM/SIGHUP), the
// agent stops every worker session (SIGTERM, the worker's grace, SIGKILL) and
// exits. A watchdog process it forks at start (own session, knows every
// worker's process group) does the same when the agent itself dies, even of
// SIGKILL, or stops writing to it (frozen or hung) for the heartbeat timeout
// + 2 s, which it then SIGKILLs; a killed watchdog is started again.
// Single-threaded; run_agent() owns the process (signal mask, SIGCHLD).
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
  std::string relay_dir = "/tmp";  // where the relay's private socket directory is made ($TMPDIR)
};

// Runs until the driver is gone or says SHUTDOWN; returns the agent's exit
// code (0 after SHUTDOWN, 1 when the driver's channel was lost or broken).
int run_agent(const AgentOptions& options);

}  // namespace erun::agent
