// ServerLoop: the rendezvous server's sockets, nothing of joins or keys; it
// hands each authenticated frame to the Handler (docs/protocol.md, "Threads and
// scale", "Relaying"). The I/O thread works under the server's mutex; others
// send under it, then wake(). Sockets close on the I/O thread only (reap()).
#pragma once

#include <sys/resource.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <queue>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "common/fd.h"
#include "common/handshake.h"
#include "common/status.h"
#include "rendezvous/admission.h"
#include "rendezvous/outbox.h"
#include "rendezvous/rendezvous.h"
#include "rendezvous/wire.h"

namespace erun {

class ServerLoop final : public Outbox {
 public:
  // What the loop hands up, on the I/O thread with the mutex held.
  class Handler {
   public:
    virtual ~Handler() = default;
    // An authenticated frame of a worker's connection (RELAY frames are the loop's).
    virtual void on_frame(ConnId conn, const wire::Header& h, std::string_view payload) = 0;
    // `conn` closes: nothing more is read from it or sent to it. `why` is
    // set for a quiet close, empty for a refusal (logged by the loop).
    virtual void on_closing(ConnId conn, std::string_view why) = 0;
    // The loop is done with `conn` (at the end of the batch that closed it).
    virtual void on_closed(ConnId conn) = 0;
    // True when `conn` joined as a worker: it may not become a relay connection.
    virtual bool is_worker(ConnId conn) const = 0;
    // The generation in the header of the loop's own frames and in its logs.
    virtual int64_t generation() const = 0;
    // The Handler's deadlines: the earliest (TimePoint::max(): none), and
    // taking that one once it is due; run in time order with the loop's own.
    virtual TimePoint next_deadline() const = 0;
    virtual void on_deadline(TimePoint now) = 0;
  };

  ServerLoop(const ServerOptions& options, std::mutex& mu, Handler& handler);
  ~ServerLoop() override;
  ServerLoop(const ServerLoop&) = delete;
  ServerLoop& operator=(const ServerLoop&) = delete;

  // Listens and starts the I/O thread.
  Status start();
  bool started() const { return static_cast<bool>(listen_fd_); }
  // Stops and joins the I/O thread (idempotent; before the Handler goes).
  void stop();
  int port() const { return bound_port_; }
  // Wakes the I/O thread (after sending from another thread).
  void wake();
  // While on, frames sent are queued for the I/O thread, which sends them in
  // batches, giving the mutex back between batches (a publish of 100,000
  // assignments returns without 100,000 sends). Mutex held.
  void queue_sends(bool on) { queue_sends_ = on; }
  long refused() const { return refused_.load(); }
  long relay_connections() const { return relays_.load(); }

  // Outbox; mutex held.
  void send(ConnId conn, wire::Type type, int64_t generation, uint32_t request_id,
            std::string_view payload) override;
  void close(ConnId conn, const std::string& reason) override;
  bool peer_closed(ConnId conn) override;
  // A protocol violation: logged, counted, ERROR "refused: ..." and closed.
  void refuse(ConnId conn, const std::string& reason);
  // The peer's address ("ADDR:PORT", or the agent's and the stream's; empty
  // for a connection that is gone).
  const std::string& peer(ConnId conn) const;

 private:
  enum class Phase { kHello, kAuth, kReady };

  struct Conn {
    ConnId id = 0;
    Fd fd;  // invalid for a relayed stream
    std::string peer;
    Phase phase = Phase::kHello;
    handshake::Responder hs;

    std::vector<char> rbuf;
    size_t rlen = 0;
    std::string wbuf;
    size_t woff = 0;
    bool want_out = false;

    TimePoint handshake_deadline = TimePoint::max();
    TimePoint frame_deadline = TimePoint::max();
    TimePoint write_deadline = TimePoint::max();

    bool doomed = false;

    // Relaying: an agent's connection carries its host's workers as streams,
    // each a Conn of its own (fd -1) handled like a direct connection.
    bool relay = false;                              // this is an agent's relay connection
    std::unordered_map<uint32_t, ConnId> streams;    // relay: stream id -> its Conn
    uint32_t last_stream = 0;                        // relay: the newest stream id (ids only grow)
    ConnId parent = 0;                               // a stream: its relay connection's id
    uint32_t stream = 0;                             // a stream: its id there
    bool closed_by_agent = false;                    // a stream: the agent closed it (no RELAY_CLOSED back)
  };

  // Timers that are not a connection's deadlines.
  static constexpr ConnId kListenId = 0;              // resume accepting
  static constexpr ConnId kBurstId = UINT64_MAX - 1;  // the refusal burst's log line

  struct Timer {
    TimePoint when;
    ConnId conn;  // a connection's deadlines, kListenId or kBurstId
    bool operator>(const Timer& o) const { return when > o.when; }
  };

  // server_loop.cc
  Status listen();
  void loop();
  int next_timeout_ms();
  void flush_queued();
  void push_timer(TimePoint when, ConnId conn) { timers_.push({when, conn}); }
  void pause_accepting(Duration d);
  bool make_room();
  void accept_all();
  void on_readable(Conn& c);
  void parse(Conn& c);
  void handle(Conn& c, const wire::Header& h, std::string_view payload);
  void handshake(Conn& c, const wire::Header& h, std::string_view payload);
  void on_relay(Conn& c, wire::Type type, std::string_view payload);
  Conn& open_stream(Conn& relay, uint32_t stream);
  void run_timers(TimePoint now);
  void run_timer(const Timer& t, TimePoint now);

  // server_loop_send.cc
  Conn* find(ConnId id) const;
  Conn* parent_of(const Conn& c) const;
  void send_frame(Conn& c, wire::Type type, int64_t generation, uint32_t request_id, std::string_view payload);
  void send_bytes(Conn& c, std::string_view frame);
  void flush(Conn& c);
  void watch_output(Conn& c, bool on);
  void refuse(Conn& c, const std::string& reason);
  void refuse_relayed(Conn& c, const std::string& reason);
  void send_refusal(Conn& c, const std::string& reason);
  void close_quietly(Conn& c, const std::string& reason);
  void doom(Conn& c, std::string_view why);
  void close_streams(Conn& relay);
  void reap();
  std::string log_prefix() const { return erun::log_prefix(handler_.generation()); }

  const ServerOptions opt_;
  std::mutex& mu_;
  Handler& handler_;
  const uint64_t job_hash_;
  const handshake::Proofs proofs_;
  handshake::NoncePool nonces_;  // server nonces, drawn 128 at a time
  rlim_t fd_limit_ = 0;
  Fd listen_fd_, ep_, wake_fd_;
  int bound_port_ = 0;
  std::thread io_;
  std::atomic<bool> stop_{false};
  std::atomic<long> refused_{0};
  std::atomic<long> relays_{0};  // open relay connections

  // Under mu_.
  std::unordered_map<ConnId, std::unique_ptr<Conn>> conns_;
  ConnId next_conn_ = 1;
  ConnId reading_ = 0;  // the connection whose frames are being handled (its replies wait)
  std::vector<ConnId> doomed_;
  std::priority_queue<Timer, std::vector<Timer>, std::greater<Timer>> timers_;
  bool accept_paused_ = false;
  Admission admission_;
  size_t closed_since_trim_ = 0;
  std::vector<char> scratch_;  // the I/O thread's read buffer
  bool queue_sends_ = false;
  std::vector<ConnId> to_flush_;  // connections with frames queued for the I/O thread
};

}  // namespace erun
