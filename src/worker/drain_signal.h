// A worker's SIGTERM as a notice to leave (docs/design.md, "Draining a
// host"). Under an erun agent with --drain-timeout, the worker's environment
// names a control socket (ERUN_AGENT_FD). The handler installed here reads
// it: an 'S' the agent wrote before its SIGTERM (a stop on purpose), or the
// socket's end (the agent is gone), and the signal kills as it would
// without erun; otherwise the SIGTERM came from elsewhere (a scheduler's
// preemption, an eviction, an operator), and the handler writes 'D' to the
// agent, which drains the host: its workers leave the job at their next
// commit. A second such SIGTERM kills at once.
#pragma once

namespace erun::worker {

// Installs the handler when ERUN_AGENT_FD names a socket, ERUN_DRAIN_ON_SIGTERM
// is not "0", and SIGTERM's disposition is still the default (a program with
// its own handler keeps it). Returns whether it did.
bool install_drain_on_sigterm();

}  // namespace erun::worker
