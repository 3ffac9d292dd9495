// AgentConnection: one host's agent as AgentLauncher drives it (its process,
// the reader thread, the frames both ways, its workers' state), and the pipe
// helpers it shares with the launcher. Internal to src/runner: only
// launcher_agent.cc includes it.
#pragma once

#include <signal.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "agent/protocol.h"
#include "common/oom.h"
#include "common/subprocess.h"

#include "runner/launch/launcher_agent.h"

namespace erun {

namespace launcher_internal {

using SteadyClock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// Blocks SIGPIPE in this thread while it lives, and discards one that a
// write raised meanwhile: a closed reader is an EPIPE, never the end of a
// program that did not ignore SIGPIPE (erun's main does; a test or an
// embedding program need not). Every write to a pipe here goes through
// write_within() or flush_locked(), which hold one, whatever the thread.
class SigpipeBlocked {
 public:
  SigpipeBlocked();
  ~SigpipeBlocked();
  SigpipeBlocked(const SigpipeBlocked&) = delete;
  SigpipeBlocked& operator=(const SigpipeBlocked&) = delete;

 private:
  sigset_t pipe_, old_;
  bool was_pending_ = false;
};

// Writes everything to a non-blocking fd within `limit`; false on EPIPE,
// another error, or the time running out.
bool write_within(int fd, std::string_view data, Duration limit);

inline long to_ms(Duration d) { return static_cast<long>(std::chrono::duration_cast<std::chrono::milliseconds>(d).count()); }

}  // namespace launcher_internal

using launcher_internal::SigpipeBlocked;
using launcher_internal::SteadyClock;
using launcher_internal::to_ms;
using launcher_internal::write_within;

// One host's agent: its process (the agent, ssh or srun), the reader thread,
// and the state of every worker started through it.
class AgentConnection {
 public:
  // With `stderr_hint`, the process's stderr is a pipe (SpawnOptions::pipe_stderr)
  // that a thread of this connection copies to erun's stderr.
  AgentConnection(std::string host, Subprocess process, AgentLaunchOptions options, std::string via,
                  StderrHint stderr_hint, std::shared_ptr<std::atomic<uint64_t>> paths_version = nullptr);

  ~AgentConnection();

  // Sends the secret line. A transport that ended before it took it (ssh
  // refused, a host key it cannot verify) is found lost by the reader, as one
  // that ends a moment later: its workers end with 255 and the transport's
  // reason, whichever of the two won the race.
  void send_secret(const std::string& secret);

  // Starts the reader thread, once: after the first worker is registered, so
  // a transport already gone fails that worker with the host.
  void start_reader();

  // Called (on whichever thread finds it) once the agent is lost, with its
  // host, its attach socket and why; set before start_reader().
  using OnLost = std::function<void(const std::string& host, const std::string& attach_path, const std::string& why)>;
  void on_lost(OnLost f);

  // Lost before it ever answered (no HELLO) because its transport could not
  // reach the host (ssh's exit 255) or no HELLO came within the start timeout.
  bool unreachable();

  const std::string& host() const { return host_; }
  long process_pid() const { return process_.pid(); }

  bool lost();

  bool hello_seen();

  std::string attach_path();
  uint64_t superseded();
  // The agent said DRAINING (its host leaves on notice): the reason, once.
  std::optional<std::string> take_draining();
  bool draining();
  // RECORDED, once per attach socket, when the record names `path`.
  void confirm_recorded(const std::string& path);

  // A worker the agent reported in STATE, with the read ends of its output pipes.
  struct Adopted {
    agent::WorkerReport report;
    int out_r = -1, err_r = -1;
  };
  // Waits for the agent's STATE (after ATTACH); its workers, or why not.
  Result<std::vector<Adopted>> wait_state(Duration limit);

  // This driver leaves the agent to another: nothing more is sent, the
  // agent's process is left running, and every worker reads as ended.
  void abandon();

  // KEEP: the answer comes as KEEPING (keeper_port(), the last answer's
  // port until the next answer).
  void keep(const std::string& commit_dir);
  // UNKEEP: a KEEP after it waits for a new answer (a new keeper, a new port).
  void unkeep(bool forget);
  std::optional<int> keeper_port();

  // Registers a worker (its output goes into the write ends) and sends START.
  void start_worker(const agent::Start& start, int out_w, int err_w);

  // Queues a frame and writes what the pipe takes now; the reader thread
  // writes the rest. Never blocks the driver's thread on a busy agent: a
  // stuck agent is caught by the heartbeat timeout instead.
  void send(const agent::Message& m);

  std::optional<ExitStatus> exit_of(uint64_t id);

  TimePoint exited_at_of(uint64_t id);

  std::optional<std::vector<std::string>> exit_stderr_of(uint64_t id);

  long pid_of(uint64_t id);

  void forget(uint64_t id);

  // Waits until the worker ended, up to `limit`.
  bool wait_exit(uint64_t id, Duration limit);

  // SHUTDOWN and EOF: the agent stops its workers and exits. The reader
  // thread closes the agent's stdin once the queue is written.
  void begin_shutdown();

  // Waits for the reader thread (it ends with the agent), then SIGKILLs.
  void finish_shutdown(Duration limit);

 private:
  struct Slot {
    int rank = 0;
    long generation = 0;
    long pid = 0;
    int out_w = -1, err_w = -1;
    std::optional<ExitStatus> exit;
    TimePoint exited_at{};  // when `exit` was first set
    std::optional<std::vector<std::string>> exit_stderr;  // EXITED's lines
  };

  // Every end goes through here (mu_ held): the moment the first one was
  // learned orders the ends the driver finds at one look (a late EXITED
  // after the host was lost changes the status, not the moment).
  static void set_exit(Slot& s, ExitStatus e);

  // A line of the transport's stderr that stderr_hint_ recognised, and its fix.
  struct TransportFailure {
    std::string line;
    std::string hint;
  };

  // The worker ends with the lost host (255); a recognised transport failure
  // becomes its report, so the job's root cause says how to fix it.
  void fail_with_host_locked(Slot& s);

  // What the transport's stderr said, once it ended or `limit` passed: a
  // failing ssh writes its reason before it exits.
  std::optional<TransportFailure> transport_failure(Duration limit);

  void recognise_stderr_line(std::string_view line);

  // The stderr thread: copies the agent's stderr (ssh's errors, the remote
  // agent's log lines) to erun's stderr as it comes and looks at each line.
  // Once stopped, it reads what is already there (up to 64 KiB) and ends.
  void forward_stderr(int fd);

  // Writes queued frames without blocking; false on a write error (EPIPE).
  bool flush_locked();

  void close_stdin_locked();

  static void close_writers(Slot& s);

  void mark_lost(const std::string& why);

  // What to do about a lost agent, with mu_ held.
  std::string lost_hint(const char* if_repeats) const;

  // mark_lost() with mu_ held: false when the connection was lost (or left)
  // already, or the agent ended as it was told (drained, or closing).
  bool mark_lost_locked(const std::string& why);

  void handle(agent::Message m);
  // handle()'s OUTPUT: copies the chunk into its worker's pipe (mu_ not held).
  void deliver_output(const agent::Output& o);
  // handle()'s STATE, with mu_ held: adopts the workers the agent reported.
  void adopt_state_locked(const agent::State& st);

  void run();
  // channel_ended()'s parts: how the agent's process ended (an OOM kill
  // noted), and the reason its loss gives.
  std::optional<ExitStatus> reap_process(bool eof);
  std::string end_reason(const std::optional<ExitStatus>& status);

  // Reads what the agent sent and handles every whole frame; false at the
  // channel's end (EOF, an error, a malformed frame: then it is lost).
  bool read_frames(agent::FrameReader& reader, std::vector<char>& chunk);

  // Declares the agent lost when it was silent too long (or never said
  // HELLO); sends a heartbeat when one is due.
  void check_heartbeats();

  // The agent's channel ended (or the launcher stops): its exit status says
  // why; its workers end with 255, as lost unless erun was closing it.
  void channel_ended(bool eof);

  std::shared_ptr<std::atomic<uint64_t>> paths_version_;
  std::string host_;
  Subprocess process_;
  OomWatch process_oom_;  // taken at its start: was its SIGKILL the OOM killer's?
  bool agent_oom_killed_ = false;  // it was (mu_)
  // ENDED from the agent's watchdog: the agent died on its host without a
  // word, killed by the OOM killer or not (mu_).
  std::optional<agent::Ended> ended_;
  AgentLaunchOptions options_;
  std::string via_;
  StderrHint stderr_hint_;
  std::thread thread_;
  std::thread stderr_thread_;
  std::atomic<bool> stop_{false};
  SteadyClock::time_point last_heard_;  // reader thread only

  std::mutex write_mu_;  // the agent's stdin: the queue and its state
  std::string outbox_;
  std::atomic<bool> closing_{false};  // SHUTDOWN queued: close stdin once written
  std::atomic<bool> stdin_open_{true};
  std::atomic<SteadyClock::time_point> last_sent_;

  // `get` of worker `id`'s slot under mu_, or `none` when there is no such worker.
  template <typename T, typename F>
  T of_worker(uint64_t id, T none, F get) {
    std::lock_guard lock(mu_);
    auto it = workers_.find(id);
    return it == workers_.end() ? none : get(it->second);
  }

  std::mutex mu_;  // everything below
  std::condition_variable cv_;
  std::map<uint64_t, Slot> workers_;
  std::optional<std::string> lost_;
  std::optional<TransportFailure> transport_failure_;  // the first line stderr_hint_ recognised
  bool stderr_done_ = true;                             // no stderr pipe, or it ended
  bool hello_ = false;
  std::string attach_path_;   // HELLO's
  std::string recorded_path_; // the attach socket RECORDED was sent for
  bool state_seen_ = false;   // STATE came (a connection that attached)
  std::vector<Adopted> adopted_;
  uint64_t superseded_ = 0;   // SUPERSEDED's term
  std::optional<std::string> draining_;  // DRAINING's reason
  bool draining_told_ = false;           // take_draining() returned it
  bool abandoned_ = false;
  bool reader_done_ = false;
  std::optional<int> keeper_port_;  // KEEPING's port; unset until it came
  bool had_worker_ = false;         // START was sent through it (a spare's agent had none)
  bool unreachable_ = false;        // see unreachable()
  OnLost on_lost_;
};


}  // namespace erun
