// HostDiscovery: where the current host set comes from. discover() may block
// up to its own timeout and is called from one thread at a time (the
// DiscoveryLoop's). A failure is a Status with a message fit for the user; it
// never throws.
//
// DiscoveryLoop runs discovery on its own thread every interval and keeps the
// newest good result, so a slow or hanging script never holds up the driver.
// Call first() (if at all) before start(); the accessors are thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "common/clock.h"
#include "common/status.h"
#include "discovery/host_set.h"

namespace erun {

class HostDiscovery {
 public:
  virtual ~HostDiscovery() = default;
  virtual Result<HostSet> discover() = 0;
  // For logs: "script ./discover_hosts.sh", "static hosts".
  virtual std::string describe() const = 0;
};

// Runs a user command line through `/bin/sh -c` (as horovodrun does, so
// "./discover.sh --flag" works; a script path needs +x and a #! line) in its own
// process group, kills that group when it runs past the timeout (and after it
// exits, so nothing it started lingers), and parses its stdout. Errors carry
// the exit status and the tail of its stderr.
class ScriptDiscovery final : public HostDiscovery {
 public:
  ScriptDiscovery(std::string script, Duration timeout, int default_slots);
  Result<HostSet> discover() override;
  std::string describe() const override;

 private:
  struct Run;
  // Runs the script once, bounded by the timeout; kills what is left of it.
  Result<Run> run_script();
  // Why the run gives no host set (it hung, printed too much, failed), or nullopt.
  std::optional<std::string> failure(const Run& run) const;

  std::string script_;
  Duration timeout_;
  int default_slots_;
  // The previous output and its parse: the same 20,000 lines every second are
  // parsed once.
  std::string last_output_;
  std::optional<HostSet> last_parsed_;
};

// A fixed host set (-H, --hostfile, Slurm, localhost).
class StaticDiscovery final : public HostDiscovery {
 public:
  explicit StaticDiscovery(HostSet hosts, std::string description = "static hosts")
      : hosts_(std::move(hosts)), description_(std::move(description)) {}
  Result<HostSet> discover() override { return hosts_; }
  std::string describe() const override { return description_; }

 private:
  HostSet hosts_;
  std::string description_;
};

// For tests: returns whatever was last set (a host set or an error).
class FakeDiscovery final : public HostDiscovery {
 public:
  void set(HostSet hosts);
  void set_error(std::string message);
  Result<HostSet> discover() override;
  std::string describe() const override { return "fake discovery"; }
  int calls() const { return calls_.load(); }

 private:
  std::mutex mu_;
  Result<HostSet> next_ = HostSet();
  std::atomic<int> calls_{0};
};

class DiscoveryLoop {
 public:
  struct Snapshot {
    HostSet hosts;
    long version = 0;          // bumps whenever the good host set changes
    TimePoint updated{};       // when that host set was first seen
    std::string last_error;    // of the latest attempt, empty when it succeeded
    long failures_in_a_row = 0;
  };

  DiscoveryLoop(HostDiscovery& discovery, Duration interval);
  ~DiscoveryLoop();  // stops the thread (waits for a running discover() to end)

  // Runs discovery once on the caller's thread: the first discovery decides
  // whether the job can start at all.
  Status first();
  void start();  // then every interval on the loop's thread
  void stop();
  Snapshot snapshot() const;
  // The snapshot's version alone: a cheap check before copying a big host set.
  long version() const;
  // Blocks until the version differs from `seen` or timeout; returns the newest.
  Snapshot wait_for_change(long seen, Duration timeout) const;
  // Asks for a discovery now instead of at the end of the interval.
  void poke();

 private:
  void run();
  void apply(const Result<HostSet>& r);
  HostDiscovery& discovery_;
  Duration interval_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  Snapshot snap_;
  bool stop_ = false;
  bool poked_ = false;
  bool attempted_ = false;           // a discovery has run (first() or the loop)
  bool have_good_ = false;           // snap_.hosts came from a successful discovery
  std::set<std::string> warned_;     // errors already logged in this failure streak
  std::thread thread_;
};

}  // namespace erun
