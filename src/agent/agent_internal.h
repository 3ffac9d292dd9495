// The agent's insides, shared by its files (not for other libraries):
// agent.cc the loop, the workers and their output; agent_channel.cc the
// driver's channel (frames out, a lost driver, the attach socket, a new
// driver taking over, `erun --agent --attach`); agent_commits.cc the
// host-memory commit directory, commit replicas and the persister.
// Single-threaded: the agent's one thread owns everything here.
#pragma once

#include "agent/agent.h"

#include <signal.h>
#include <sys/socket.h>
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <vector>
#include <fmt/format.h>
#include "agent/protocol.h"
#include "agent/commit_dir.h"
#include "agent/env.h"
#include "agent/replicas.h"
#include "agent/persister.h"
#include "agent/relay.h"
#include "agent/watchdog.h"
#include "commits/replica.h"
#include "common/log.h"
#include "common/net.h"
#include "common/oom.h"
#include "common/private_files.h"
#include "common/status_line.h"
#include "common/strings.h"
#include "common/subprocess.h"

extern char** environ;

namespace erun::agent::internal {


using SteadyClock = std::chrono::steady_clock;
namespace si = erun::state_internal;
using namespace std::chrono_literals;

constexpr size_t kReadChunk = 64 * 1024;
constexpr size_t kMaxLine = 64 * 1024;              // longer lines are forwarded in pieces
constexpr size_t kMaxOutbound = 64u * 1024 * 1024;  // output dropped beyond this backlog
// After a worker is reaped, how long its EXITED waits for its pipes' EOF
// (a process that left its session may hold them open for ever).
constexpr Duration kExitOutputWait = 200ms;
// The watchdog takes an agent that wrote it nothing for the heartbeat
// timeout plus this for frozen or hung (the driver has declared the host
// lost by then), kills it and stops its workers.
constexpr Duration kWatchdogSlack = 2s;

// ---- the agent ------------------------------------------------------------

struct Stream {
  int fd = -1;
  int file_fd = -1;  // --output-filename on this host, or -1
  std::string partial;
};

struct Worker {
  uint64_t id = 0;
  long generation = 0;
  int rank = 0;
  int slot = 0;
  pid_t pid = -1;
  Stream out, err;
  LineTail err_tail;  // the last stderr lines, for EXITED
  Duration grace = 5s;
  std::optional<SteadyClock::time_point> kill_at;  // after TERMINATE
  // The agent's end of the worker's control socket (ERUN_AGENT_FD in the
  // worker, with --drain-timeout), or -1: 'S' before a SIGTERM the agent
  // sends on purpose (a stop, not a notice); 'D' from the worker's library
  // when it took a SIGTERM as a notice to leave.
  int ctl = -1;
  // Reaped: its EXITED waits for the pipes' EOF until output_deadline. No
  // signal goes to its pid any more.
  std::optional<ExitStatus> reaped;
  SteadyClock::time_point output_deadline{};
  OomWatch oom;  // taken at its start: was its SIGKILL the OOM killer's?
};

class Agent {
 public:
  // Every side effect goes through `env` (Env::real() in production).
  Agent(const AgentOptions& o, Env& env) : o_(o), env_(env) {}

  // begin(), step() until it returns false, finish(); the exit code.
  int run();
  // The steps of run(), public for tests that drive the agent on a fake Env.
  // Signals, the job secret, the watchdog, HELLO; false: the agent cannot start.
  bool begin();
  // One round of the loop: the timers, then one poll and what it found;
  // false once the agent is done.
  bool step();
  // Flushes to the driver, stops the helpers, releases the job's host
  // memory and the attach socket.
  void finish();
  int exit_code() const { return lost_ ? 1 : 0; }

 private:
  void keep_in_touch(SteadyClock::time_point now);
  void kill_overdue(SteadyClock::time_point now);
  bool stopped(SteadyClock::time_point now);
  void poll_once(SteadyClock::time_point now);
  int poll_timeout_ms(SteadyClock::time_point now) const;

  void log_prefix_init() { me_ = fmt::format("agent on {} (pid {})", o_.host, env_.pid()); }
  bool write_fully(int fd, std::string_view data) { return env_.write_fully(fd, data); }
  void close_fd(int& fd) { env_.close_fd(fd); }
  bool holding() const { return !attached_ && o_.driver_grace > Duration::zero() && !stopping_; }
  void send(const Message& m);
  void flush_outbound();
  // The driver's channel broke without SHUTDOWN: with --driver-grace the
  // workers keep running and the agent waits for a new driver; without, it
  // stops them (stop_all).
  void lose_driver(const std::string& why);
  void close_channel();
  // The attach socket (--driver-grace): a new driver's connection proves the
  // job secret and sends ATTACH with a higher term; it then becomes the
  // driver's channel.
  bool listen_for_attach();
  void accept_attachers();
  void on_attacher(size_t i);
  // Forgets attacher i; `close`: closes its connection too.
  void drop_attacher(size_t i, bool close = true);
  void take_over_channel(int fd, const Attach& a, std::string_view rest);
  // RETIRE on an attach connection `fd`: answers it, and stops every worker
  // and the agent when its term is this agent's or newer.
  void retire_on_request(int fd, const Retire& r);
  // A new driver elsewhere (ATTACH with a port): the workers that reach the
  // driver themselves (no relay) read where it is from the attach
  // directory's `driver` file ("HOST PORT"; ERUN_DRIVER_FILE), written here.
  void tell_direct_workers(const Attach& a);
  State state_report() const;
  bool read_secret();
  void on_driver_bytes();
  // Feeds bytes from the driver and handles every whole frame in them.
  void handle_frames(std::string_view bytes);
  void handle(Message m);
  void start(const Start& s);
  std::vector<std::string> worker_env(const Start& s);
  SpawnOptions spawn_options(const Start& s, int ctl);
  void add_worker(const Start& s, const Spawned& p);
  void open_output_files(Worker& w, const Start& s);
  void on_sigchld();
  void pump(Worker& w, Stream& s, uint8_t stream, bool final);
  // Sends EXITED for reaped workers whose pipes ended or whose wait is over.
  void report_exits(SteadyClock::time_point now);
  void stop_all(const std::string& why, bool lost);
  // SIGTERM to the worker's session, as a stop order: its library must not
  // take it as a notice to drain (docs/design.md, "Draining a host").
  void terminate(Worker& w);
  // The host leaves the job on notice: DRAINING to the driver, which takes
  // its workers out at their next commit; the agent exits once they are gone.
  void begin_drain(const std::string& why);
  void on_worker_ctl(Worker& w);
  // Draining: ends the agent once its workers are gone, or stops them past
  // the deadline.
  void tend_drain(SteadyClock::time_point now);
  void ensure_watchdog();
  // Tells the watchdog how long the job's host memory must outlive this
  // agent: until grace_until_ while no driver holds the job, else its
  // default (a driver starts the host's agent again).
  void tell_watchdog_grace();
  std::string grace_line();  // its "G <ms>" line
  // Hands the watchdog the driver's channel (send_channel_to_watchdog()), or "o" when there is none.
  void tell_watchdog_channel();
  void relay_env(std::map<std::string, std::string>& env);
  Worker* find(uint64_t id);
  Worker* live(uint64_t id);  // a worker not reaped yet

  AgentOptions o_;
  Env& env_;
  std::string me_;
  std::string secret_;
  std::string inbound_;  // bytes read after the secret line
  FrameReader reader_;
  std::string outbound_;   // whole frames; the first is written from head_sent_ on
  size_t head_sent_ = 0;
  size_t dropped_output_ = 0;
  int in_fd_ = -1, out_fd_ = -1;  // the driver's channel: stdin/stdout, or an attach connection
  bool attached_ = true;          // a driver's channel is open
  bool recorded_ = false;         // RECORDED came: a new driver can find this agent
  bool silent_ = false;           // attached, but the driver is past its heartbeat timeout
  uint64_t term_ = 1;             // the driver obeyed: the first one is term 1
  SteadyClock::time_point grace_until_{};
  // Workers whose EXITED is queued but not yet written: a new driver learns
  // them from STATE.
  std::map<uint64_t, WorkerReport> departed_;
  std::string attach_dir_, attach_path_;
  // The driver's rendezvous as the first worker that reaches it itself (no
  // relay) was given it (empty: none does): where ERUN_DRIVER_FILE points
  // them from when a new driver names only its port.
  std::string direct_rdzv_host_;
  int attach_listen_ = -1;
  struct Attacher {
    int fd = -1;
    std::string in;
    SteadyClock::time_point deadline;
  };
  std::vector<Attacher> attachers_;
  bool driver_open_ = true;   // reading the driver's channel
  bool out_open_ = true;      // writing to it
  bool stopping_ = false;
  bool lost_ = false;
  bool draining_ = false;
  bool sigterm_seen_ = false;  // a second SIGTERM to the agent stops at once
  SteadyClock::time_point drain_deadline_{};
  SteadyClock::time_point stop_deadline_{};
  SteadyClock::time_point last_heard_{};
  SteadyClock::time_point last_sent_{};
  int sig_fd_ = -1;
  int watchdog_fd_ = -1;
  SteadyClock::time_point last_watchdog_word_{};  // the last "H" to the watchdog
  std::map<uint64_t, Worker> workers_;
  // The job's host-memory commit directory (the first START's
  // ERUN_COMMIT_DIR) and this agent's shared lock on its lease.
  void hold_commit_dir(const std::map<std::string, std::string>& env);
  bool hold_commit_dir(const std::string& dir);
  // Commit replicas (agent/replicas.h): KEEP starts the keeper, REPLICATE
  // (re)targets the pusher.
  void keep(const Keep& k);
  void unkeep(const Unkeep& u);
  void replicate(const Replicate& r);
  void stop_pushers();
  // While no keeper runs: removes the replicas that this host's workers
  // hold a commit as new as (all of them after UNKEEP with forget, while no
  // worker runs), now and then until none is left. Armed by UNKEEP and by
  // START (an agent started anew may find a lost one's replicas).
  void sweep_replicas(SteadyClock::time_point now);
  void arm_sweep(bool all);
  KeeperProcess keeper_;
  bool sweeping_ = false;
  bool sweep_all_ = false;  // UNKEEP said forget, and no START came since
  SteadyClock::time_point next_sweep_{};
  std::chrono::milliseconds sweep_every_{1000};  // doubles while nothing goes
  struct Pusher {
    int channel = -1;
    std::string to;  // host:port
  };
  std::map<std::string, Pusher> pushers_;  // by the keeper's commit directory
  // With ERUN_CHECKPOINT_DIR too, the persister that writes its newest
  // commit to disk (agent/persister.h); `cwd` resolves a relative directory.
  void start_persister(const std::map<std::string, std::string>& env, const std::string& cwd);
  std::string commit_dir_;
  int commit_lease_fd_ = -1;
  int persister_fd_ = -1;
  bool persister_tried_ = false;  // at the first START, once
  // The helpers' stderr (route_helper_stderr()): a pipe whose lines go on,
  // whole, to the agent's own stderr, so that only the agent holds the
  // driver's (which it gives up when the driver is lost).
  void open_helper_stderr();
  void pump_helper_stderr(bool all);
  int helper_err_read_ = -1, helper_err_write_ = -1;
  std::string helper_err_;
  std::unique_ptr<Relay> relay_;  // made for the first worker that has a rendezvous to relay
  bool relay_failed_ = false;     // could not be made: workers connect directly
};


// The length of the frame that starts at `p` (its header included).
size_t frame_size(const char* p);
// Whether a forked helper's channel hung up: the helper ended.
bool helper_ended(Env& env, int channel);

}  // namespace erun::agent::internal
