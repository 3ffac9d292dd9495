// JobPhase::kStopping: every live worker is sent a signal, SIGKILLed when
// it outlives --term-grace (+2 s), and named as stuck 10 s after that; then
// the job waits for hosts or ends (docs/design.md, "The driver's states").
// The driver begins a stop (Driver::stop()) and, each turn, reaps the exits
// and asks settled().
#pragma once

#include <functional>

#include "common/clock.h"
#include "runner/driver_states.h"
#include "runner/driver_workers.h"

namespace erun {

class JobStop {
 public:
  // Sends `signal` to every live worker (SIGTERM or 0: a terminate(), which
  // the agent follows with SIGKILL after the grace); pending and member
  // ones become kStopping. Once they are gone the job goes to `then`:
  // kWaitingForHosts, or kDone with what `exit_code` returns (1 without one).
  void begin(Workers& workers, int signal, JobPhase then, std::function<int()> exit_code, TimePoint now,
             Duration term_grace);
  // erun itself was sent SIGKILL's wish (the signal forwarded as such): no grace.
  void kill_now() { kill_requested_ = true; }
  // Another signal while stopping: passed on to the live workers (SIGTERM
  // went out already), and a stop that would have waited for hosts ends the
  // job with 128 + `received` instead.
  void again(Workers& workers, int received, int forward);
  // After this turn's exits were reaped: true once every worker is gone, or
  // 10 s after the SIGKILL (the ones still there named in the log).
  bool settled(Workers& workers, TimePoint now, Duration term_grace, long generation);

  JobPhase then() const { return then_; }
  // The job's exit code, with then() == kDone.
  int exit_code() const { return exit_code_ ? exit_code_() : 1; }

 private:
  JobPhase then_ = JobPhase::kDone;
  std::function<int()> exit_code_;
  TimePoint kill_at_{};      // SIGKILL to those still running
  TimePoint give_up_at_{};   // after the SIGKILL: report the ones still not gone
  bool killed_ = false;      // the SIGKILL went out
  bool kill_requested_ = false;
};

}  // namespace erun
