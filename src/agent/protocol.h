// The agent protocol's codec: the frames that the driver and a host's agent
// exchange over the agent's stdin and stdout, encoded and decoded without I/O
// (docs/protocol.md, "The agent protocol").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include "common/status.h"

namespace erun::agent {

// 2: EXITED carries the worker's last stderr lines; START an output directory.
// 3: KEEP, KEEPING and REPLICATE (commit replicas on spare hosts).
// 4: UNKEEP.
// 5: HELLO names the attach socket; ATTACH, STATE, SUPERSEDED and RECORDED (a driver that takes over).
// 6: DRAINING (a host that leaves on notice).
// 7: RETIRE and RETIRED (an agent its driver lost is told that the job moved on).
// 8: EXITED says whether the kernel's OOM killer ended the worker.
// 9: ENDED (the agent's watchdog: the agent died without a word).
inline constexpr uint32_t kProtocolVersion = 9;
inline constexpr size_t kMaxFrame = 4u << 20;   // whole frame, header included
inline constexpr size_t kMaxSecret = 4096;      // the secret line
// Bounds of EXITED's stderr lines: at most this many lines, each at most
// kExitTailLineMax bytes (a longer line is cut and ends in "..."), all of
// them together at most kExitTailBytes (the oldest go first).
inline constexpr size_t kExitTailLines = 20;
inline constexpr size_t kExitTailLineMax = 512;
inline constexpr size_t kExitTailBytes = 4096;

// Each message names its type byte and its name, and lists its fields in
// wire order once (fields()): the encoder and the decoder both walk that
// list, so a new message is one struct and one entry in Message.

// agent -> driver
struct Hello {
  static constexpr uint8_t kType = 1;
  static constexpr const char* kName = "HELLO";
  uint32_t version = kProtocolVersion;
  std::string host;  // the agent's hostname
  int64_t pid = 0;
  // The agent's attach socket ("" without --driver-grace): where a new
  // driver's `erun --agent --attach PATH` reaches this agent.
  std::string attach_path;
  auto fields() { return std::tie(version, host, pid, attach_path); }
};
struct Started {
  static constexpr uint8_t kType = 2;
  static constexpr const char* kName = "STARTED";
  uint64_t id = 0;
  int64_t pid = 0;
  auto fields() { return std::tie(id, pid); }
};
struct StartFailed {
  static constexpr uint8_t kType = 3;
  static constexpr const char* kName = "START_FAILED";
  uint64_t id = 0;
  std::string why;
  auto fields() { return std::tie(id, why); }
};
struct Output {
  static constexpr uint8_t kType = 4;
  static constexpr const char* kName = "OUTPUT";
  uint64_t id = 0;
  uint8_t stream = 1;  // 1 stdout, 2 stderr
  std::string data;    // whole lines (a line longer than the agent's limit comes in pieces)
  auto fields() { return std::tie(id, stream, data); }
};
struct Exited {
  static constexpr uint8_t kType = 5;
  static constexpr const char* kName = "EXITED";
  uint64_t id = 0;
  int32_t code = 0;    // exit code when signal == 0
  int32_t signal = 0;  // terminating signal
  // The worker's last stderr lines, oldest first, without their newlines (a
  // partial last line counts); within the kExitTail* bounds.
  std::vector<std::string> stderr_tail;
  uint8_t oom_killed = 0;  // 1: the SIGKILL was the OOM killer's (common/oom.h)
  auto fields() { return std::tie(id, code, signal, stderr_tail, oom_killed); }
};
struct Heartbeat {
  static constexpr uint8_t kType = 6;
  static constexpr const char* kName = "HEARTBEAT";
  auto fields() { return std::tie(); }
};

// driver -> agent
struct Start {
  static constexpr uint8_t kType = 16;
  static constexpr const char* kName = "START";
  uint64_t id = 0;
  int64_t generation = 0;
  int32_t rank = 0;
  int32_t slot = 0;
  std::vector<std::string> argv;
  std::vector<std::pair<std::string, std::string>> env;  // the worker's whole env (+ ERUN_SECRET)
  std::string cwd;
  uint64_t term_grace_ms = 5000;
  // Non-empty: the agent also appends the worker's stdout and stderr to
  // output_dir/rank.N/{stdout,stderr} on its host (--output-filename).
  std::string output_dir;
  auto fields() { return std::tie(id, generation, rank, slot, argv, env, cwd, term_grace_ms, output_dir); }
};
struct Signal {
  static constexpr uint8_t kType = 17;
  static constexpr const char* kName = "SIGNAL";
  uint64_t id = 0;
  int32_t sig = 0;
  auto fields() { return std::tie(id, sig); }
};
struct Terminate {  // SIGTERM to the worker's session, SIGKILL after the grace
  static constexpr uint8_t kType = 18;
  static constexpr const char* kName = "TERMINATE";
  uint64_t id = 0;
  auto fields() { return std::tie(id); }
};
struct Kill {
  static constexpr uint8_t kType = 19;
  static constexpr const char* kName = "KILL";
  uint64_t id = 0;
  auto fields() { return std::tie(id); }
};
struct Shutdown {  // stop every worker (as Terminate) and exit
  static constexpr uint8_t kType = 20;
  static constexpr const char* kName = "SHUTDOWN";
  auto fields() { return std::tie(); }
};

// Commit replicas (docs/state.md, "Replicas on spare hosts").
// agent -> driver, the answer to KEEP: the port its keeper listens on, or 0 and why not.
struct Keeping {
  static constexpr uint8_t kType = 7;
  static constexpr const char* kName = "KEEPING";
  uint32_t port = 0;
  std::string why;
  auto fields() { return std::tie(port, why); }
};
// driver -> agent: hold `commit_dir` (the host's ERUN_COMMIT_DIR) and keep the
// commits that holders push to it, on a host that runs no worker of the job.
struct Keep {
  static constexpr uint8_t kType = 21;
  static constexpr const char* kName = "KEEP";
  std::string commit_dir;
  auto fields() { return std::tie(commit_dir); }
};
// driver -> agent: push this host's newest commits to the keeper at
// host:port whose directory is `keeper_dir`; an empty host stops pushing.
struct Replicate {
  static constexpr uint8_t kType = 22;
  static constexpr const char* kName = "REPLICATE";
  std::string host;
  uint32_t port = 0;
  std::string keeper_dir;
  auto fields() { return std::tie(host, port, keeper_dir); }
};

// driver -> agent: keep no more. The keeper ends; the replicas it stored
// stay while no worker of this host holds a commit as new as theirs (then
// they go), unless `forget`: then they go at once, when no worker runs here
// (the commit is on enough hosts without this one).
struct Unkeep {
  static constexpr uint8_t kType = 23;
  static constexpr const char* kName = "UNKEEP";
  bool forget = false;
  auto fields() { return std::tie(forget); }
};

// A driver that takes over a running job (docs/protocol.md, "Taking a job
// over"). driver -> agent, the first frame on an attach connection (after
// the secret line): obey driver `term` from now on (it must be above every
// term the agent obeyed), and relay the workers' rendezvous to
// rdzv_host:rdzv_port (port 0: keep the relay's address).
struct Attach {
  static constexpr uint8_t kType = 24;
  static constexpr const char* kName = "ATTACH";
  uint64_t term = 0;
  std::string rdzv_host;
  uint32_t rdzv_port = 0;
  auto fields() { return std::tie(term, rdzv_host, rdzv_port); }
};
// One worker an agent runs, as STATE reports it.
struct WorkerReport {
  uint64_t id = 0;
  int64_t generation = 0;  // the generation it was started for
  int32_t rank = 0;        // its rank then
  int32_t slot = 0;
  int64_t pid = 0;
  bool exited = false;     // ended in the driver's absence: its EXITED follows
  auto fields() { return std::tie(id, generation, rank, slot, pid, exited); }
};
// agent -> driver, the answer to ATTACH (after HELLO): the workers it runs,
// and those whose EXITED no driver has seen yet; the frames the agent held
// for a driver (their output, their exits) follow it.
struct State {
  static constexpr uint8_t kType = 8;
  static constexpr const char* kName = "STATE";
  uint64_t term = 0;
  std::vector<WorkerReport> workers;
  uint64_t dropped_output = 0;  // output chunks dropped while no driver read them
  auto fields() { return std::tie(term, workers, dropped_output); }
};
// agent -> driver: this agent obeys driver `term` now: sent to the driver it leaves (which then exits without
// touching the workers), and to an ATTACH whose term is not above it.
struct Superseded {
  static constexpr uint8_t kType = 9;
  static constexpr const char* kName = "SUPERSEDED";
  uint64_t term = 0;
  auto fields() { return std::tie(term); }
};

// driver -> agent: the job record now names this agent's attach socket, so
// a new driver can find it. Only an agent told so keeps its workers through
// --driver-grace; one that loses its driver before stops them at once (no
// new driver could reach it).
struct Recorded {
  static constexpr uint8_t kType = 25;
  static constexpr const char* kName = "RECORDED";
  auto fields() { return std::tie(); }
};

// agent -> driver: a notice that this host is leaving (SIGTERM to the agent,
// or a worker's library took its own SIGTERM as one): the driver drains it,
// its workers leave at their next commit (docs/design.md, "Draining a
// host"). The agent exits once they are gone.
struct Draining {
  static constexpr uint8_t kType = 10;
  static constexpr const char* kName = "DRAINING";
  std::string reason;
  auto fields() { return std::tie(reason); }
};

// An agent its driver lost (silent past --heartbeat-timeout: a partition, a
// stopped host) keeps its workers through --driver-grace, but the job moved
// on without them (docs/protocol.md, "Retiring a lost agent"). driver ->
// agent, the first frame on an attach connection (after the secret line):
// the driver of `term` (the agent's own, or a newer one) failed this host;
// stop every worker now and exit, releasing the job's host memory.
struct Retire {
  static constexpr uint8_t kType = 26;
  static constexpr const char* kName = "RETIRE";
  uint64_t term = 0;
  std::string reason;
  auto fields() { return std::tie(term, reason); }
};
// agent -> driver, the answer to RETIRE: it stops `workers` workers and exits
// (a RETIRE whose term is below the agent's gets SUPERSEDED instead).
struct Retired {
  static constexpr uint8_t kType = 11;
  static constexpr const char* kName = "RETIRED";
  uint32_t workers = 0;
  auto fields() { return std::tie(workers); }
};

// agent -> driver, written by the agent's watchdog on the agent's channel
// once the agent died without ending on purpose (SIGKILL, a crash), as the
// last bytes of the stream: over ssh the driver sees only ssh's exit 255,
// and this says what happened on the host. `oom_killed`: the OOM kill count
// of the agent's memory cgroup rose since the agent was last heard
// (common/oom.h). A frame the agent left half written before it (its
// channel is non-blocking) tears the framing: FrameReader::trailing_ended()
// finds this frame at the stream's end all the same.
struct Ended {
  static constexpr uint8_t kType = 12;
  static constexpr const char* kName = "ENDED";
  uint8_t oom_killed = 0;
  auto fields() { return std::tie(oom_killed); }
};

using Message = std::variant<Hello, Started, StartFailed, Output, Exited, Heartbeat, Start, Signal, Terminate,
                             Kill, Shutdown, Keeping, Keep, Replicate, Unkeep, Attach, State, Superseded, Recorded,
                             Draining, Retire, Retired, Ended>;

// The frame for one message, header included.
std::string encode(const Message& message);
// A readable name for logs ("START", "EXITED", ...).
const char* message_name(const Message& message);

// The last lines of a byte stream within EXITED's bounds, built as the
// stream is read: feed() the bytes in order, finish() at its end (a partial
// last line becomes a line). Keeps at most the bounded lines and one cut
// partial line, never the stream.
class LineTail {
 public:
  void feed(std::string_view bytes);
  void finish();
  const std::vector<std::string>& lines() const { return lines_; }

 private:
  void push(std::string line);
  std::vector<std::string> lines_;
  size_t bytes_ = 0;     // of lines_
  std::string partial_;  // at most kExitTailLineMax bytes of the current line
  bool cut_ = false;     // the current line was longer
  bool started_ = false; // bytes of the current line were seen
};

// Splits a byte stream into messages. feed() appends; next() returns the next
// whole message, nullopt when more bytes are needed, or an error for a
// malformed frame (after which the stream cannot be trusted: stop reading).
class FrameReader {
 public:
  void feed(std::string_view bytes) { buffer_.append(bytes); }
  Result<std::optional<Message>> next();
  size_t buffered() const { return buffer_.size() - consumed_; }
  // At the stream's end, with bytes left that next() could not make a
  // message of (a frame cut short by the writer's death): the ENDED frame
  // they end with, if any.
  std::optional<Ended> trailing_ended() const;

 private:
  std::string buffer_;
  size_t consumed_ = 0;
};

// Decodes one frame's body (type byte and payload, without the length).
Result<Message> decode(std::string_view body);

}  // namespace erun::agent
