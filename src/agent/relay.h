// Relay: carries this host's workers' rendezvous connections, each one
// authenticated on the agent's unix socket, over one connection to the driver
// (docs/protocol.md, "Relaying"). Single-threaded, driven by the agent's poll
// loop (add_fds, on_events, tick); only resolving the driver's name may block.
#pragma once

#include <poll.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "common/fd.h"
#include "common/handshake.h"
#include "common/net.h"
#include "common/status.h"

namespace erun::agent {

struct RelayOptions {
  std::string job_id;
  std::string secret;
  std::string upstream_host;  // the driver's rendezvous address and port
  int upstream_port = 0;
  std::string log_prefix;     // "agent on HOST (pid P)"
  std::string parent_dir = "/tmp";  // where the private socket directory is made
  Duration io_timeout = std::chrono::seconds(10);
  size_t max_frame_bytes = 64 << 20;
  // A lost upstream pauses the relay (see pause()): the agent resumes it
  // for a new driver, or for the same one when its channel stays up.
  bool pause_on_loss = false;
};

class Relay {
 public:
  // Makes the private directory and listens in it.
  static Result<std::unique_ptr<Relay>> create(RelayOptions options);
  ~Relay();
  Relay(const Relay&) = delete;
  Relay& operator=(const Relay&) = delete;

  // What a worker's ERUN_RDZV_ADDR says: "unix:/path/to/socket".
  std::string address() const { return "unix:" + path_; }
  // The private directory the socket is in.
  const std::string& directory() const { return dir_; }
  const RelayOptions& options() const { return o_; }
  // Appends the descriptors to poll; on_events() takes the same vector back
  // (from index `first`, which add_fds() returns) after poll().
  size_t add_fds(std::vector<pollfd>& fds);
  void on_events(const std::vector<pollfd>& fds, size_t first);
  // Deadlines: handshakes, half frames, unread writes, the upstream's connect.
  void tick(TimePoint now);
  // The driver is gone (docs/protocol.md, "Taking a job over"): the
  // upstream is dropped and not tried again, and workers that reconnect are
  // turned away quietly until resume(), so that their clients keep retrying
  // until a driver is there. resume() points the upstream at a new driver's
  // rendezvous (port 0: the same address; an empty host: the same host) and
  // connects it.
  void pause();
  void resume(const std::string& host, int port);
  bool paused() const { return paused_; }
  TimePoint paused_since() const { return paused_since_; }
  // Counts, for logs and tests.
  size_t streams() const { return locals_.size(); }
  long refused() const { return refused_; }

 private:
  enum class Phase { kHello, kAuth, kReady };
  struct Local {
    Fd fd;
    Phase phase = Phase::kHello;
    handshake::Responder hs;
    std::string rbuf, wbuf;
    TimePoint deadline = TimePoint::max();  // handshake, then a half frame or unread output
    bool close_after_write = false;         // the server closed the stream: flush, then close
    uint32_t stream = 0;                    // 0 until its first frame is relayed
  };
  enum class Up { kNone, kConnecting, kChallenge, kAuthOk, kReady };

  explicit Relay(RelayOptions o);
  void accept_all();
  void on_local(uint64_t key, short revents);
  void parse_local(uint64_t key, Local& l);
  void refuse_local(uint64_t key, const std::string& why);
  void close_local(uint64_t key, bool tell_upstream);
  bool write_local(Local& l);
  void start_upstream();
  void on_upstream(short revents);
  void parse_upstream();
  void upstream_frame(uint16_t type, int64_t generation, std::string_view payload);
  void lose_upstream(const std::string& why);
  // Connects to the next address in up_addrs_; false when none is left.
  bool connect_next(std::string* why);
  void send_upstream(std::string bytes);
  void write_upstream();

  RelayOptions o_;
  uint64_t job_hash_;
  handshake::Proofs proofs_;
  std::string dir_, path_;
  Fd listen_fd_;
  std::map<uint64_t, Local> locals_;  // by accept order
  uint64_t next_key_ = 1;
  // A worker's stream id is given with its first relayed frame, so that ids
  // reach the server in increasing order (it drops frames of lower unknown ids).
  uint32_t next_stream_ = 1;
  std::unordered_map<uint32_t, uint64_t> streams_;  // stream id -> locals_ key
  bool want_upstream_ = false;  // a worker authenticated: connect upstream after this round
  long refused_ = 0;

  Fd up_fd_;
  Up up_ = Up::kNone;
  handshake::Initiator up_hs_;
  std::string up_rbuf_, up_wbuf_;
  std::string held_;  // RELAY frames of authenticated workers until the upstream is ready
  TimePoint up_deadline_ = TimePoint::max();
  // The driver's addresses not tried yet in this connection attempt (a name
  // may resolve to IPv6 and IPv4; the first that connects is used).
  std::vector<net::Address> up_addrs_;
  bool full_warned_ = false;  // a refusal at kMaxRelayStreams was logged
  bool paused_ = false;
  TimePoint paused_since_{};
};

}  // namespace erun::agent
