// The typed exceptions a worker sees. CommError: a peer died, hung past the
// collective timeout, or the communicator was aborted; restore the last commit
// and re-join (it may name the rank that failed). HostsUpdated: the membership
// is changing and every rank agreed on it at the same step; re-join without
// restoring. erun::run() handles both.
// CollectiveMismatch: the ranks made different collective calls at the same
// point (one called a collective the others did not, or with another type,
// count, root or reduce op; or they disagree on the commit id). It is a bug in
// the program, not a failure: re-joining would only repeat it, so erun::run()
// lets it through and the job ends with its message, which names the ranks and
// their calls.
#pragma once

#include <stdexcept>
#include <string>

#include "erun/export.hpp"

namespace erun {

inline constexpr int kFatalExitCode = 121;

class ERUN_API Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What a rank saw of the peer that failed it. kSilent: a peer on another host
// that did not send or receive in time, or whose connection closed; its
// process is not observable from here, and it may itself be blocked on
// another peer (the driver decides with the other ranks' reports).
enum class PeerFate { kUnknown = 0, kDead = 1, kAlive = 2, kSilent = 3 };

class ERUN_API CommError : public Error {
 public:
  using Error::Error;
  // `failed_rank`: the rank (of the communicator's generation) that failed this
  // one, -1 when unknown; `fate`: whether its process was gone or alive but
  // not arriving (stopped, hung, slow), or silent over the network. Both
  // travel to the driver on re-join.
  CommError(const std::string& what, int failed_rank, PeerFate fate)
      : Error(what), failed_rank_(failed_rank), fate_(fate) {}
  int failed_rank() const { return failed_rank_; }
  PeerFate fate() const { return fate_; }

 private:
  int failed_rank_ = -1;
  PeerFate fate_ = PeerFate::kUnknown;
};

class ERUN_API CollectiveMismatch : public Error {
 public:
  using Error::Error;
};

// Committed state that no living host holds any more: rows of a sharded
// entry whose every copy was lost (docs/state.md, "Sharded entries").
// Re-joining cannot bring them back, so erun::run() lets it through, as it
// does a CollectiveMismatch; the message names the entries and rows.
class ERUN_API StateLost : public Error {
 public:
  using Error::Error;
};

class ERUN_API HostsUpdated : public Error {
 public:
  HostsUpdated() : Error("erun: hosts updated; re-joining the next generation") {}
};

}  // namespace erun
