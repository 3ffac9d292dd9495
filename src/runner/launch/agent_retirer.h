// AgentRetirer: tells the agents a launcher lost that the job moved on
// (docs/protocol.md, "Retiring a lost agent").
//
// A driver declares an agent lost when it is silent past --heartbeat-timeout
// (its host cut off, stopped, its connection dropped) and goes on without its
// workers. With --driver-grace such an agent keeps them running, waiting for
// a new driver: from where it stands, its erun may be gone. Once its host can
// be reached again those workers are stale (they would pin the GPUs the
// host's next workers need), so the retirer keeps trying to reach the agent's
// attach socket and sends it RETIRE: the agent stops its workers at once and
// exits. Each try is one process (`erun --agent --attach PATH` over the
// launcher's transport) or, on this machine, a connection to the socket; it
// ends with RETIRED (done), SUPERSEDED (a newer driver holds the agent: not
// this one's to retire), the agent found gone (done), the host unreachable
// (ssh's 255: tried again) or past its time limit (killed, tried again).
// Tries are spaced from 0.5 s, doubling up to 1 s, so a host that comes
// back is reached within about a try's limit and a second.
//
// Its own thread does the work; add() and the rest are for any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "common/subprocess.h"

namespace erun {

class AgentRetirer {
 public:
  // Opens one try's channel to the agent at `path` on `host`: the process
  // that reaches it (its stdin and stdout piped, its stderr piped or not),
  // or a connection to the socket (Subprocess::channel()).
  using Open = std::function<Result<Subprocess>(const std::string& host, const std::string& path)>;
  struct Options {
    Duration try_limit = std::chrono::milliseconds(2500);  // one try: reach, ask, hear the answer
    Duration first_gap = std::chrono::milliseconds(500);   // between tries, doubling up to max_gap
    Duration max_gap = std::chrono::seconds(1);
    Duration tick = std::chrono::milliseconds(100);
  };
  // What a try ended with (for tests and the logs).
  enum class Outcome { kRetired, kSuperseded, kGone, kUnreachable, kTimedOut };

  AgentRetirer(Open open, Options options);
  ~AgentRetirer();  // stops trying (what is left is left); kills the tries in flight
  AgentRetirer(const AgentRetirer&) = delete;
  AgentRetirer& operator=(const AgentRetirer&) = delete;

  // The job's secret and the term of the driver whose RETIRE this sends
  // (the first driver's is 1): before add(), and again after a takeover.
  void set_driver(const std::string& secret, uint64_t term);
  // Starts retiring the agent at `path` on `host`; `reason` goes into the
  // agent's log. An agent already being retired is not added twice.
  void add(const std::string& host, const std::string& path, const std::string& reason);
  // Agents not retired yet.
  size_t left() const;
  // Waits until every agent is done or `limit` passed, then stops trying;
  // logs each agent left (its workers stop by themselves within
  // --driver-grace). Returns how many were left.
  size_t finish(Duration limit);
  // Stops trying now, without a word (the job was left to another driver).
  void abandon();
  // How the last try of `path` ended, or nullopt when none ended yet.
  std::optional<Outcome> last_outcome(const std::string& path) const;

 private:
  struct Try;
  struct Entry;
  void run();
  // One round over the entries (mu_ held).
  void tend();
  void start_try(Entry& e);
  // Looks at a try in flight: its answer, its end, its time limit. True when it ended.
  bool check_try(Entry& e, TimePoint now);
  // The frames the agent sent: true when one ended the try (RETIRED, SUPERSEDED, a malformed one).
  bool read_answer(Entry& e, TimePoint now);
  // The try's channel closed without an answer: its process's exit says why. True when the try ended.
  bool channel_closed(Entry& e, TimePoint now);
  void end_try(Entry& e, Outcome outcome, const std::string& detail, TimePoint now);

  Open open_;
  Options options_;
  std::string secret_;  // mu_
  uint64_t term_ = 1;   // mu_
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Entry>> entries_;
  bool stop_ = false;
  std::thread thread_;
};

const char* to_string(AgentRetirer::Outcome o);

}  // namespace erun
