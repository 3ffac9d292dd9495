// The agent protocol's codec: the frames that the driver and a host's agent
// exchange over the agent's stdin and stdout, encoded and decoded without I/O
// (docs/protocol.md, "The agent protocol").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "common/status.h"

namespace erun::agent {

// 2: EXITED carries the worker's last stderr lines; START an output directory.
// 3: KEEP, KEEPING and REPLICATE (commit replicas on spare hosts).
// 4: UNKEEP.
inline constexpr uint32_t kProtocolVersion = 4;
inline constexpr size_t kMaxFrame = 4u << 20;   // whole frame, header included
inline constexpr size_t kMaxSecret = 4096;      // the secret line
// Bounds of EXITED's stderr lines: at most this many lines, each at most
// kExitTailLineMax bytes (a longer line is cut and ends in "..."), all of
// them together at most kExitTailBytes (the oldest go first).
inline constexpr size_t kExitTailLines = 20;
inline constexpr size_t kExitTailLineMax = 512;
inline constexpr size_t kExitTailBytes = 4096;

// agent -> driver
struct Hello {
  uint32_t version = kProtocolVersion;
  std::string host;  // the agent's hostname
  int64_t pid = 0;
};
struct Started {
  uint64_t id = 0;
  int64_t pid = 0;
};
struct StartFailed {
  uint64_t id = 0;
  std::string why;
};
struct Output {
  uint64_t id = 0;
  uint8_t stream = 1;  // 1 stdout, 2 stderr
  std::string data;    // whole lines (a line longer than the agent's limit comes in pieces)
};
struct Exited {
  uint64_t id = 0;
  int32_t code = 0;    // exit code when signal == 0
  int32_t signal = 0;  // terminating signal
  // The worker's last stderr lines, oldest first, without their newlines (a
  // partial last line counts); within the kExitTail* bounds.
  std::vector<std::string> stderr_tail;
};
struct Heartbeat {};

// driver -> agent
struct Start {
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
};
struct Signal {
  uint64_t id = 0;
  int32_t sig = 0;
};
struct Terminate {  // SIGTERM to the worker's session, SIGKILL after the grace
  uint64_t id = 0;
};
struct Kill {
  uint64_t id = 0;
};
struct Shutdown {};  // stop every worker (as Terminate) and exit

// Commit replicas (docs/state.md, "Replicas on spare hosts").
// agent -> driver, the answer to KEEP: the port its keeper listens on, or 0 and why not.
struct Keeping {
  uint32_t port = 0;
  std::string why;
};
// driver -> agent: hold `commit_dir` (the host's ERUN_COMMIT_DIR) and keep the
// commits that holders push to it, on a host that runs no worker of the job.
struct Keep {
  std::string commit_dir;
};
// driver -> agent: push this host's newest commits to the keeper at
// host:port whose directory is `keeper_dir`; an empty host stops pushing.
struct Replicate {
  std::string host;
  uint32_t port = 0;
  std::string keeper_dir;
};

// driver -> agent: keep no more. The keeper ends; the replicas it stored
// stay while no worker of this host holds a commit as new as theirs (then
// they go), unless `forget`: then they go at once, when no worker runs here
// (the commit is on enough hosts without this one).
struct Unkeep {
  bool forget = false;
};

using Message = std::variant<Hello, Started, StartFailed, Output, Exited, Heartbeat, Start, Signal, Terminate,
                             Kill, Shutdown, Keeping, Keep, Replicate, Unkeep>;

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

 private:
  std::string buffer_;
  size_t consumed_ = 0;
};

// Decodes one frame's body (type byte and payload, without the length).
Result<Message> decode(std::string_view body);

}  // namespace erun::agent
