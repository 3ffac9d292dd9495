#include "runner/stopping.h"

#include <signal.h>

#include "common/log.h"

namespace erun {

void JobStop::begin(Workers& workers, int signal, JobPhase then, std::function<int()> exit_code, TimePoint now,
                    Duration term_grace) {
  then_ = then;
  exit_code_ = std::move(exit_code);
  for (auto& w : workers) {
    if (!w.alive()) continue;
    if (w.state == WorkerState::kPending || w.state == WorkerState::kMember) w.set_state(WorkerState::kStopping);
    if (signal == SIGTERM || signal == 0) w.handle->terminate();
    else w.handle->signal(signal);
  }
  kill_at_ = now + term_grace + std::chrono::seconds(2);
  killed_ = false;
}

void JobStop::again(Workers& workers, int received, int forward) {
  for (auto& w : workers) {
    if (w.alive() && forward != SIGTERM) w.handle->signal(forward);
  }
  if (then_ == JobPhase::kWaitingForHosts) {
    then_ = JobPhase::kDone;
    exit_code_ = [received] { return 128 + received; };
  }
}

bool JobStop::settled(Workers& workers, TimePoint now, Duration term_grace, long generation) {
  if (all_exited(workers)) return true;
  if (!killed_) {
    if (now < kill_at_ && !kill_requested_) return false;
    for (auto& w : workers) {
      if (!w.alive()) continue;
      ERUN_LOG_WARN("{}: did not stop within {:.1f} s of SIGTERM, killing it (raise --term-grace if it "
                    "needs longer to shut down)",
                    who(generation, w.assignment.slot.host, w.assignment.rank), seconds(term_grace));
      w.handle->kill();
    }
    killed_ = true;
    give_up_at_ = now + std::chrono::seconds(10);
    return false;
  }
  if (now < give_up_at_) return false;
  for (auto& w : workers) {
    if (w.exit) continue;
    ERUN_LOG_ERROR("{}: still not gone 10 s after SIGKILL; it may be stuck in the kernel (D state) or its "
                   "host unreachable: check the host",
                   who(generation, w.assignment.slot.host, w.assignment.rank));
  }
  return true;
}

}  // namespace erun
