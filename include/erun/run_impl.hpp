// erun::run(): the elastic loop around a training function. Included at the
// end of state.hpp; the work between attempts (restore, re-join, logging) lives
// in state.cc so this header stays small. fn runs on the training thread; any
// exception other than CommError and HostsUpdated (a failed re-join and a
// CollectiveMismatch included) leaves run() unchanged. Reset callbacks run
// inside the loop, after sync(), so a CommError they raise is recovered like
// any other and a value they set is not overwritten by the synced one.
#pragma once

#include "erun/errors.hpp"
#include "erun/export.hpp"

namespace erun {

namespace detail {
// After a failed attempt: restore() when `comm_error`, log, re-join with the
// last commit id, telling the driver the rank that failed this one (-1:
// unknown) and its fate; the next sync() then tells every rank to run the
// reset callbacks.
ERUN_API void rejoin(State& state, bool comm_error, const char* what, int failed_rank = -1,
                     PeerFate fate = PeerFate::kUnknown);
// Logs an error that a restart would repeat (CollectiveMismatch) with the mark
// that tells the erun driver to end the job rather than reset it.
ERUN_API void no_retry(State& state, const char* what);
}  // namespace detail

template <typename Fn>
auto run(State& state, Fn&& fn) -> decltype(fn(state)) {
  for (;;) {
    try {
      state.sync();
      state.run_pending_reset();
      return fn(state);
    } catch (const CommError& e) {
      detail::rejoin(state, /*comm_error=*/true, e.what(), e.failed_rank(), e.fate());
    } catch (const HostsUpdated& e) {
      detail::rejoin(state, /*comm_error=*/false, e.what());
    } catch (const CollectiveMismatch& e) {
      detail::no_retry(state, e.what());
      throw;
    } catch (const StateLost& e) {
      detail::no_retry(state, e.what());
      throw;
    }
  }
}

}  // namespace erun
