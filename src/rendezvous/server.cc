// RendezvousServer: three parts under one mutex.
//   ServerLoop (server_loop.h): the I/O thread, sockets, the handshake,
//     frames, relay streams, deadlines; it knows nothing of joins or keys.
//   ServerMembership (server_membership.h): joins, slots, publish, pushes,
//     snapshots; no sockets.
//   KvService (kv_service.h): the generation's store with its waiting gets;
//     no sockets.
// This file wires them: it decodes each authenticated frame and hands it to
// the part it is for, tells both services when a connection closes, and
// takes the mutex for the driver's calls. The services send through the
// loop's Outbox.
//
// Scale (aimed at 100,000 connections; docs/performance.md section 9
// measures up to 19,700): no per-join work over all connections or members
// (ServerMembership's slot indexes), snapshot() copies lists rebuilt only
// when they changed (SlotIndex), and publish() and the pushes to members
// queue their frames and return: the I/O thread sends them in batches,
// giving the mutex back between batches. Authentication uses the secret's
// precomputed HMAC pads and nonces from a pooled CSPRNG draw.
#include <mutex>

#include "common/check.h"
#include "common/log.h"
#include "rendezvous/kv_service.h"
#include "rendezvous/rendezvous.h"
#include "rendezvous/server_loop.h"
#include "rendezvous/server_membership.h"
#include "rendezvous/wire.h"

namespace erun {

using wire::Type;

struct RendezvousServer::Impl final : ServerLoop::Handler {
  explicit Impl(const ServerOptions& o) : loop(o, mu, *this), kv(loop), membership(loop) {
    if (o.resume_generation >= 0) membership.resume_after(o.resume_generation);
  }
  // The I/O thread calls into the services: it stops before they go.
  ~Impl() override { loop.stop(); }

  mutable std::mutex mu;  // every part's state
  ServerLoop loop;
  KvService kv;
  ServerMembership membership;

  // ---- ServerLoop::Handler (I/O thread, mutex held) -----------------------

  void on_frame(ConnId conn, const wire::Header& h, std::string_view payload) override {
    auto type = static_cast<Type>(h.type);
    Request r{conn, h.request_id, h.generation};
    switch (type) {
      case Type::kJoin: return on_join(r, payload);
      case Type::kKvSet:
      case Type::kKvGet:
      case Type::kKvCheck: return on_kv(r, type, payload);
      case Type::kTiming: {
        auto t = wire::decode_timing(payload);
        if (!t) return loop.refuse(conn, fmt::format("malformed TIMING payload ({} bytes)", payload.size()));
        return membership.timing(r, *t);
      }
      default:
        return loop.refuse(conn, fmt::format("unexpected {} after authentication", wire::type_name(h.type)));
    }
  }

  void on_closing(ConnId conn, std::string_view why) override { membership.closed(conn, why); }

  void on_closed(ConnId conn) override {
    membership.released(conn);
    kv.drop(conn);
  }

  bool is_worker(ConnId conn) const override { return membership.joined(conn); }
  int64_t generation() const override { return membership.generation(); }
  TimePoint next_deadline() const override { return kv.next_deadline(); }
  void on_deadline(TimePoint now) override { kv.expire_next(now); }

  void on_join(const Request& r, std::string_view payload) {
    auto parsed = wire::decode_join(payload);
    if (!parsed) {
      return loop.refuse(r.conn, fmt::format("malformed JOIN payload ({} bytes; a worker built from another erun "
                                             "version?)",
                                             payload.size()));
    }
    if (auto why = membership.join(r, loop.peer(r.conn), std::move(*parsed))) loop.refuse(r.conn, *why);
  }

  // The store answers only requests of the current generation; a payload is
  // decoded after that check.
  void on_kv(const Request& r, Type type, std::string_view payload) {
    if (!kv.admit(r)) return;
    if (type == Type::kKvSet) {
      auto kvs = wire::decode_kv_set(payload);
      if (!kvs) return loop.refuse(r.conn, fmt::format("malformed KV_SET payload ({} bytes)", payload.size()));
      return kv.set(r, kvs->first, kvs->second);
    }
    if (type == Type::kKvGet) {
      auto kvg = wire::decode_kv_get(payload);
      if (!kvg) return loop.refuse(r.conn, fmt::format("malformed KV_GET payload ({} bytes)", payload.size()));
      return kv.get(r, kvg->first, kvg->second, std::chrono::steady_clock::now());
    }
    auto keys = wire::decode_kv_check(payload);
    if (!keys) return loop.refuse(r.conn, fmt::format("malformed KV_CHECK payload ({} bytes)", payload.size()));
    kv.check(r, *keys);
  }

  // ---- the driver's calls ---------------------------------------------------

  // Runs `f` under the mutex with the sends it makes queued for the I/O
  // thread, then wakes it.
  template <class F>
  void queued(F&& f) {
    {
      std::lock_guard<std::mutex> lock(mu);
      loop.queue_sends(true);
      f();
      loop.queue_sends(false);
    }
    loop.wake();
  }
};

RendezvousServer::RendezvousServer(ServerOptions options) : impl_(std::make_unique<Impl>(options)) {}
RendezvousServer::~RendezvousServer() = default;

Status RendezvousServer::start() {
  ERUN_CHECK(!impl_->loop.started());
  return impl_->loop.start();
}

int RendezvousServer::port() const { return impl_->loop.port(); }

std::vector<JoinRequest> RendezvousServer::waiting() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return *impl_->membership.waiting();
}

std::vector<JoinRequest> RendezvousServer::members() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return *impl_->membership.members();
}

// Older generations' gets fail first (stale generation), then the listed
// slots' waiting joins get their assignments.
void RendezvousServer::publish(long gen, const std::vector<RankAssignment>& ranks) {
  impl_->queued([&] {
    ERUN_CHECK(gen > impl_->membership.generation());
    impl_->kv.new_generation(gen);
    impl_->membership.publish(gen, ranks);
  });
}

long RendezvousServer::generation() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->membership.generation();
}

void RendezvousServer::notify_hosts_updated(long gen, bool drain) {
  impl_->queued([&] { impl_->membership.notify_hosts_updated(gen, drain); });
}

void RendezvousServer::notify_peers_lost(long gen, const std::vector<int>& ranks) {
  impl_->queued([&] { impl_->membership.notify_peers_lost(gen, ranks); });
}

MembershipSnapshot RendezvousServer::snapshot() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->membership.snapshot();
}

long RendezvousServer::refused() const { return impl_->loop.refused(); }

long RendezvousServer::relay_connections() const { return impl_->loop.relay_connections(); }

}  // namespace erun
