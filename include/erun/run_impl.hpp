// erun::run(): the elastic loop around a training function. Included at the
// end of state.hpp; the work between attempts (restore, re-join, logging) lives
// in state.cc so this header stays small. fn runs on the training thread; any
// exception other than CommError and HostsUpdated (a failed re-join included)
// leaves run() unchanged. Reset callbacks run inside the loop, so a CommError
// they raise is recovered like any other.
#pragma once

#include <utility>

#include "erun/errors.hpp"

namespace erun {

namespace detail {
// After a failed attempt: restore() when `comm_error`, log, re-join with the
// last commit id, telling the driver the rank that failed this one (-1:
// unknown) and its fate. Returns the world size before the re-join.
int rejoin(State& state, bool comm_error, const char* what, int failed_rank = -1,
           PeerFate fate = PeerFate::kUnknown);
// Runs the reset callbacks with (old_size, the current size).
void reset(State& state, int old_size);
}  // namespace detail

template <typename Fn>
auto run(State& state, Fn&& fn) -> decltype(fn(state)) {
  int reset_from = 0;  // world size before the last re-join; 0 when none is pending
  for (;;) {
    try {
      if (reset_from > 0) detail::reset(state, std::exchange(reset_from, 0));
      state.sync();
      return fn(state);
    } catch (const CommError& e) {
      reset_from = detail::rejoin(state, /*comm_error=*/true, e.what(), e.failed_rank(), e.fate());
    } catch (const HostsUpdated& e) {
      reset_from = detail::rejoin(state, /*comm_error=*/false, e.what());
    }
  }
}

}  // namespace erun
