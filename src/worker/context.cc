// erun::init(): the worker's side of the job. Reads the launcher's environment
// once into WorkerOptions and builds the matching Context:
//  - ElasticContext under the erun driver (ERUN_RDZV_ADDR set): joins the
//    driver's rendezvous, builds a hierarchical communicator per generation
//    (shared memory within a host, erun's authenticated TCP transport between
//    hosts), re-joins on membership changes;
//  - StandaloneContext otherwise: a world of one.
#include <cctype>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "collectives/hierarchical.h"
#include "collectives/tcp/tcp_communicator.h"
#include "commits/commit_files.h"
#include "common/log.h"
#include "common/net.h"
#include "common/strings.h"
#include "erun/erun.hpp"
#include "rendezvous/rendezvous.h"
#include "store/memory_store.h"
#include "store/prefix_store.h"
#include "worker/drain_signal.h"
#include "worker/link_probe.h"
#include "worker/timed_communicator.h"
#include "worker/mpi_context.h"
#include "worker/worker_info.h"

namespace erun {
namespace {

struct WorkerOptions {
  std::string rdzv_address;
  int rdzv_port = 0;
  std::string job_id;
  std::string secret;
  std::string host;            // the slot's host as the driver named it
  int local_index = 0;
  std::string advertise;       // address peers reach this worker at
  Duration collective_timeout = std::chrono::seconds(30);
  Duration rendezvous_timeout = std::chrono::seconds(60);
  // How long a join may block: the driver may hold survivors in the
  // rendezvous while it waits for --min-np slots (--elastic-timeout).
  Duration join_timeout = std::chrono::seconds(660);
  Duration driver_grace = Duration::zero();  // ERUN_DRIVER_GRACE: reconnect for this long
  std::string driver_file;  // ERUN_DRIVER_FILE: where its agent says a new driver is (ClientOptions::follow_file)
  std::string checkpoint_dir;
  std::string commit_dir;  // host-memory commits (ERUN_COMMIT_DIR)
  bool timing = true;      // commit intervals to the driver (ERUN_STEP_TIMING=0: off)
  bool preflight = true;   // the compute check before the first join (ERUN_PREFLIGHT=0: off)
  // host:port of a worker on another host to time the link with before the
  // first join (ERUN_PROBE_PEER: the driver names one for a host new to the job).
  std::string probe_peer;
  int commit_replicas = 1;  // ERUN_COMMIT_REPLICAS (--commit-replicas; 0: no buddy copies of sharded pieces)
};

std::string env_or(const char* name, const std::string& fallback = "") {
  const char* v = std::getenv(name);
  return v ? std::string(v) : fallback;
}

long env_int(const char* name, long fallback) {
  long v;
  std::string s = env_or(name);
  if (s.empty()) return fallback;
  if (!parse_int(s, v)) throw Error(fmt::format("erun: {}={} is not an integer", name, s));
  return v;
}

double env_seconds(const char* name, double fallback) {
  std::string s = env_or(name);
  if (s.empty()) return fallback;
  try {
    return std::stod(s);
  } catch (...) {
    throw Error(fmt::format("erun: {}={} is not a number of seconds", name, s));
  }
}

WorkerOptions read_worker_options() {
  WorkerOptions o;
  o.rdzv_address = env_or("ERUN_RDZV_ADDR");
  o.rdzv_port = static_cast<int>(env_int("ERUN_RDZV_PORT", 0));
  o.driver_file = env_or("ERUN_DRIVER_FILE");
  o.job_id = env_or("ERUN_JOB_ID");
  o.secret = env_or("ERUN_SECRET");
  // The secret was only needed to get here: keep it out of children's environments.
  ::unsetenv("ERUN_SECRET");
  o.host = env_or("ERUN_HOSTNAME", "localhost");
  o.local_index = static_cast<int>(env_int("ERUN_LOCAL_INDEX", 0));
  o.advertise = env_or("ERUN_ADVERTISE_ADDR", "127.0.0.1");
  o.collective_timeout = from_seconds(env_seconds("ERUN_COLLECTIVE_TIMEOUT", 30));
  o.rendezvous_timeout = from_seconds(env_seconds("ERUN_RENDEZVOUS_TIMEOUT", 60));
  o.join_timeout = o.rendezvous_timeout + from_seconds(env_seconds("ERUN_ELASTIC_TIMEOUT", 600));
  // A standby (docs/design.md, "Standbys") waits in its first join until a
  // plan takes it; erun stops it when the job ends.
  if (env_or("ERUN_STANDBY") == "1") o.join_timeout = std::chrono::hours(24 * 365);
  o.driver_grace = from_seconds(env_seconds("ERUN_DRIVER_GRACE", 0));
  o.checkpoint_dir = env_or("ERUN_CHECKPOINT_DIR");
  o.commit_dir = env_or("ERUN_COMMIT_DIR");
  o.timing = env_or("ERUN_STEP_TIMING") != "0";
  o.preflight = env_or("ERUN_PREFLIGHT") != "0";
  o.probe_peer = env_or("ERUN_PROBE_PEER");
  o.commit_replicas = static_cast<int>(env_int("ERUN_COMMIT_REPLICAS", 1));
  if (o.rdzv_port <= 0 || o.job_id.empty() || o.secret.empty()) {
    throw Error("erun: ERUN_RDZV_ADDR is set but ERUN_RDZV_PORT, ERUN_JOB_ID or the job secret is missing; "
                "start workers through erun, not by hand");
  }
  return o;
}

// The pre-flight check (docs/design.md, "Stragglers"): a fixed amount of
// arithmetic, three rounds of about 10-20 ms on a current core, timed with
// the wall clock as a whole, so that a worker slowed in bursts (throttled,
// stopped and continued, sharing its core) cannot hide in a lucky round.
// The same work everywhere: the driver compares the times.
uint32_t compute_probe_us() {
  const auto t0 = std::chrono::steady_clock::now();
  volatile double sink = 0;
  for (int round = 0; round < 3; ++round) {
    double x = 1.0 + round, y = 0.5;
    for (int i = 0; i < 8'000'000; ++i) {
      x = x * 1.0000001 + y;
      y = y * 0.9999999 - 1e-9;
    }
    sink = sink + x + y;
  }
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
  return static_cast<uint32_t>(std::min<int64_t>(us, UINT32_MAX));
}

// The pre-flight link probe's bound: a round trip of 1 MiB each way that
// takes longer is a link that holds the job back (under 8 Mbit/s each way).
constexpr auto kLinkProbeTimeout = std::chrono::microseconds(kLinkProbeBoundUs);

// One round trip with the worker at `peer` (host:port), in microseconds: at
// least the bound when it did not finish within it, 0 when it failed
// otherwise (the peer gone, refused): no measurement, said in a warning.
uint32_t link_probe_us(const WorkerOptions& o) {
  const auto colon = o.probe_peer.rfind(':');
  long port = 0;
  if (colon == std::string::npos || !parse_int(std::string_view(o.probe_peer).substr(colon + 1), port) || port <= 0 ||
      port > 65535) {
    ERUN_LOG_WARN("erun: ERUN_PROBE_PEER={} is not host:port; no link probe", o.probe_peer);
    return 0;
  }
  const std::string host = o.probe_peer.substr(0, colon);
  const auto t0 = std::chrono::steady_clock::now();
  auto r = worker::probe_link(host, static_cast<int>(port), o.job_id, o.secret, worker::kLinkProbeBytes,
                              kLinkProbeTimeout);
  const auto took = std::chrono::steady_clock::now() - t0;
  auto us = [](Duration d) {
    return static_cast<uint32_t>(
        std::clamp<int64_t>(std::chrono::duration_cast<std::chrono::microseconds>(d).count(), 1, UINT32_MAX));
  };
  if (r.is_ok()) {
    ERUN_LOG_DEBUG("erun: {} slot {}: link probe with {}: {:.1f} ms", o.host, o.local_index, o.probe_peer,
                  us(r.value()) / 1e3);
    return us(r.value());
  }
  if (took >= kLinkProbeTimeout) {
    ERUN_LOG_WARN("erun: {} slot {}: {} (bound {} ms)", o.host, o.local_index, r.status().message(),
                  std::chrono::duration_cast<std::chrono::milliseconds>(kLinkProbeTimeout).count());
    return us(took);
  }
  ERUN_LOG_WARN("erun: {} slot {}: {}; joining without a link probe", o.host, o.local_index, r.status().message());
  return 0;
}

class StandaloneContext final : public Context {
 public:
  explicit StandaloneContext(std::string checkpoint_dir) : checkpoint_dir_(std::move(checkpoint_dir)) {
    info_.host = "localhost";
    comm_ = make_tcp_communicator(store_, TcpOptions{});  // a world of one: no sockets
  }
  const WorkerInfo& info() const override { return info_; }
  Communicator& comm() override { return *comm_; }
  bool host_update_pending() const override { return false; }
  void rejoin(uint64_t) override { throw Error("erun: a standalone worker (not started by erun) cannot re-join"); }
  bool elastic() const override { return false; }
  std::string checkpoint_dir() const override { return checkpoint_dir_; }

 private:
  std::string checkpoint_dir_;
  WorkerInfo info_;
  MemoryKvStore store_;
  std::unique_ptr<Communicator> comm_;
};

class ElasticContext final : public Context {
 public:
  explicit ElasticContext(WorkerOptions o) : o_(std::move(o)), client_(client_options(o_, this)) {
    if (Status s = client_.connect(); !s) {
      throw Error(fmt::format("erun: cannot reach the driver's rendezvous at {}:{}: {}", o_.rdzv_address,
                              o_.rdzv_port, s.message()));
    }
    // A worker new to the job reports the commit its host kept, which its
    // State resumes from unless a survivor holds a newer one: the driver sees
    // progress across generations in which every worker died (CrashLoopDetector).
    const auto kept = claimed_commits(o_.commit_dir);
    if (o_.preflight) {
      responder_ = std::make_unique<worker::LinkProbeResponder>(o_.advertise, o_.job_id, o_.secret);
      probe_us_ = compute_probe_us();
      if (!o_.probe_peer.empty()) link_us_ = link_probe_us(o_);
    }
    join(kept.empty() ? 0 : kept.front().id, JoinReason::kStart, -1, PeerState::kUnknown);
  }
  ~ElasticContext() override {
    std::lock_guard<std::mutex> lock(comm_mu_);
    if (comm_) comm_->abort();
  }

  const WorkerInfo& info() const override { return info_; }
  Communicator& comm() override { return *comm_; }
  bool host_update_pending() const override { return client_.hosts_updated(); }
  bool drain_pending() const override { return client_.drain_pending(); }
  // The commit intervals since the last report (or the join) and their
  // time in collectives, to the driver, at most every kTimingEvery: a
  // program that commits every millisecond sends ten frames a second, not a
  // thousand. Several States commit at the same steps: the first commit of
  // a step (its id is new) ends an interval.
  void committed(uint64_t commit_id) override {
    if (commit_id == last_commit_seen_) return;
    const auto now = std::chrono::steady_clock::now();
    last_commit_seen_ = commit_id;
    last_commit_at_ = now;
    if (!o_.timing) return;
    ++commits_since_report_;
    if (now - interval_start_ < kTimingEvery) return;
    const int64_t wait_ns = wait_ns_.exchange(0, std::memory_order_relaxed);
    const int64_t interval_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now - interval_start_).count();
    interval_start_ = now;
    client_.report_timing(commit_id, std::exchange(commits_since_report_, 0), static_cast<uint64_t>(interval_ns / 1000),
                          static_cast<uint64_t>(std::max<int64_t>(wait_ns, 0) / 1000));
  }
  void collective_waited(std::chrono::nanoseconds waited) noexcept override {
    if (o_.timing) wait_ns_.fetch_add(waited.count(), std::memory_order_relaxed);
  }
  bool elastic() const override { return true; }
  std::string checkpoint_dir() const override { return o_.checkpoint_dir; }
  PeerLink peer_link() const override { return {o_.advertise, o_.job_id, o_.secret, o_.commit_replicas}; }
  std::string host_commit_stem() const override {
    if (o_.commit_dir.empty()) return {};
    // Simulated hosts (--launcher local with 127.0.0.2, ...) share this
    // machine's /dev/shm: the host is part of the name.
    std::string host;
    for (char c : o_.host) host += std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' ? c : '_';
    return fmt::format("{}/slot-{}-{}", o_.commit_dir, host, o_.local_index);
  }
  std::chrono::milliseconds collective_timeout() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(o_.collective_timeout);
  }
  void rejoin(uint64_t last_commit_id) override { rejoin_because(last_commit_id, RejoinCause{}); }
  void rejoin_because(uint64_t last_commit_id, const RejoinCause& cause) override {
    std::unique_ptr<Communicator> left;
    {
      std::lock_guard<std::mutex> lock(comm_mu_);
      comm_gen_ = -1;
      if (comm_) comm_->abort();
      left = std::move(comm_);
    }
    abort_gpu();
    left.reset();
    JoinReason reason = cause.hosts_updated ? JoinReason::kHostsUpdated : JoinReason::kPeerLost;
    int failed_rank = cause.failed_rank;
    PeerState failed_state = to_peer_state(cause.fate);
    if (client_.peers_lost_generation() == info_.generation) {
      // The driver said which ranks are gone: that, not whatever the aborted
      // collective saw (possibly a survivor that aborted first), is why this
      // worker leaves.
      reason = JoinReason::kPeerLost;
      std::vector<int> lost = client_.peers_lost();
      if (!lost.empty() && std::find(lost.begin(), lost.end(), failed_rank) == lost.end()) {
        failed_rank = lost.front();
        failed_state = PeerState::kUnknown;
      }
    }
    join(last_commit_id, reason, failed_rank, failed_state);
  }

 private:
  static ClientOptions client_options(const WorkerOptions& o, ElasticContext* self) {
    ClientOptions c;
    c.address = o.rdzv_address;
    c.port = o.rdzv_port;
    c.job_id = o.job_id;
    c.secret = o.secret;
    c.join_timeout = o.join_timeout;
    c.reconnect_within = o.driver_grace;
    c.follow_file = o.driver_file;
    c.on_peers_lost = [self](long gen, const std::vector<int>& ranks) { self->on_peers_lost(gen, ranks); };
    return c;
  }

  // The rendezvous client's reader thread: the driver reports ranks of
  // generation `gen` gone. Aborting from here makes a collective blocked on
  // them, and every later one of the generation, throw CommError at once;
  // erun::run() then restores the last commit and re-joins. A notice for a
  // generation this worker is not computing in is only remembered (the
  // client keeps it): one being formed is cancelled through
  // HierOptions::cancelled and the check after it is built.
  void on_peers_lost(long gen, const std::vector<int>& ranks) {
    std::lock_guard<std::mutex> lock(comm_mu_);
    if (gen != comm_gen_ || !comm_) return;
    ERUN_LOG_WARN("{}: the driver reports rank{} {} of generation {} lost; aborting its collectives",
                  who(gen, o_.host, comm_rank_), ranks.size() == 1 ? "" : "s", fmt::join(ranks, ", "), gen);
    comm_->abort();
    abort_gpu_collectives();
  }

  static PeerState to_peer_state(PeerFate f) {
    switch (f) {
      case PeerFate::kDead: return PeerState::kDead;
      case PeerFate::kAlive: return PeerState::kAlive;
      case PeerFate::kSilent: return PeerState::kSilent;
      case PeerFate::kUnknown: break;
    }
    return PeerState::kUnknown;
  }

  // Joins the next generation containing this slot and connects its
  // communicator, telling the driver why (and which rank of the generation
  // it leaves failed it, when known). A generation whose communicator cannot
  // be built (a peer died meanwhile) is left for the next one, up to the join
  // timeout; that JOIN says so.
  void join(uint64_t commit_id, JoinReason reason, int failed_rank, PeerState failed_state) {
    auto deadline = std::chrono::steady_clock::now() + o_.join_timeout;
    JoinRequest req;
    req.slot = SlotKey{o_.host, o_.local_index};
    req.pid = ::getpid();
    req.commit_id = commit_id;
    req.reason = reason;
    req.failed_rank = failed_rank;
    req.failed_state = failed_state;
    req.probe_us = probe_us_;
    req.link_us = link_us_;
    req.probe_port = responder_ ? static_cast<uint32_t>(responder_->port()) : 0;
    while (true) {
      long gen = -1;
      auto t0 = std::chrono::steady_clock::now();
      if (commit_id != 0 && commit_id == last_commit_seen_) {
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t0 - last_commit_at_).count();
        req.commit_age_ms = static_cast<uint32_t>(std::clamp<int64_t>(ms, 1, UINT32_MAX));
      }
      auto r = client_.join(req, &gen);
      if (!r) {
        throw CommError(fmt::format("erun: {} slot {}: join failed: {}", o_.host, o_.local_index, r.message()));
      }
      Topology topo = *r;
      topo.generation = gen;
      info_ = worker_info(topo, o_.host);
      try {
        const bool flat = generation_barrier(topo, std::min(deadline, t0 + o_.rendezvous_timeout));
        connect_generation(topo, flat);
        ERUN_LOG_DEBUG("{}: joined with size {} in {:.3f} s", who(gen, o_.host, r->rank), r->size,
                       seconds(std::chrono::steady_clock::now() - t0));
        return;
      } catch (const CommError& e) {
        if (dynamic_cast<const ShmNoRoom*>(&e) != nullptr) {
          // This host's /dev/shm is full: the next generations go without
          // shared memory (every rank agrees at the barrier), for a while.
          shm_off_until_ = std::chrono::steady_clock::now() + kShmOffFor;
          ERUN_LOG_WARN("{}: {}; the job's next generations use erun's TCP transport among all ranks instead of "
                        "shared memory, for at least {} s",
                        who(gen, o_.host, r->rank), e.what(), kShmOffFor.count());
        } else {
          ERUN_LOG_WARN("{}: could not connect generation {}: {}; waiting for the next", who(gen, o_.host, r->rank),
                        gen, e.what());
        }
        if (std::chrono::steady_clock::now() > deadline) throw;
        req.reason = JoinReason::kFormFailed;
        req.failed_rank = e.failed_rank();
        req.failed_state = to_peer_state(e.fate());
      }
    }
  }

  // Everyone of the generation is here and alive before any pair is
  // connected: a rank that died or left before this point is seen as a
  // stale-generation error once the driver publishes the next one, not as a
  // pair connection that waits out its timeout. The barrier waits until
  // `barrier_end` (at most --rendezvous-timeout: the driver stops a worker
  // that does not join in that time). Rank 0 names a rank that never
  // arrived, so that the driver leaves it out of the next one.
  // It also settles whether the generation goes without shared memory: a
  // rank whose host's /dev/shm had no room for a segment lately says so in
  // its arrival ('f'), rank 0 puts it in "go", and every rank reads it there:
  // true then (HierOptions::flat).
  bool generation_barrier(const Topology& topo, TimePoint barrier_end) {
    KvStore& store = client_.store();
    auto remaining = [&] {
      return std::max<Duration>(barrier_end - std::chrono::steady_clock::now(), std::chrono::seconds(1));
    };
    const std::vector<char> flat_word = {'f'};
    const bool mine = std::chrono::steady_clock::now() < shm_off_until_;
    PrefixStore ready(store, "ready");
    ready.set(std::to_string(topo.rank), mine ? flat_word : std::vector<char>{});
    if (topo.rank != 0) return store.get("go", remaining()) == flat_word;
    bool flat = mine;
    for (int k = 1; k < topo.size; ++k) {
      try {
        flat = (ready.get(std::to_string(k), remaining()) == flat_word) || flat;
      } catch (const CommError& e) {
        if (std::chrono::steady_clock::now() < barrier_end) throw;  // not a timeout: a newer generation
        throw CommError(fmt::format("rank {} did not reach the generation barrier: {}", k, e.what()), k,
                        PeerFate::kUnknown);
      }
    }
    store.set("go", flat ? flat_word : std::vector<char>{});
    return flat;
  }

  // Shared memory among the ranks of a host, erun's TCP transport among the
  // hosts, its pairs authenticated with the job secret (`flat`: TCP among
  // every rank, no shared memory).
  void connect_generation(const Topology& topo, bool flat) {
    const long gen = topo.generation;
    HierOptions h;
    static_cast<Topology&>(h) = topo;
    h.timeout = o_.collective_timeout;
    // The pairs of ranks that just passed the barrier together connect in
    // milliseconds; a peer that dies meanwhile is seen at once (refused
    // connect, closed pair) or when the driver announces the next generation
    // (`cancelled`), not after this bound.
    h.connect_timeout = std::min<Duration>(o_.collective_timeout, std::chrono::seconds(5));
    h.job_id = o_.job_id;
    h.secret = o_.secret;
    h.cancelled = [this, gen] { return client_.hosts_updated() || client_.peers_lost_generation() == gen; };
    h.hostname = o_.host;
    h.address = o_.advertise;
    h.segment_tag = fmt::format("{}-g{}", o_.job_id, gen);
    h.flat = flat;
    PrefixStore coll(client_.store(), "coll");
    auto comm = make_hierarchical_communicator(coll, h);
    // A PEERS_LOST for this generation that arrived while it formed found no
    // communicator to abort: abort it now.
    // A generation's first interval starts once it formed.
    wait_ns_.store(0, std::memory_order_relaxed);
    interval_start_ = std::chrono::steady_clock::now();
    commits_since_report_ = 0;
    std::lock_guard<std::mutex> lock(comm_mu_);
    if (o_.timing) {
      comm_ = std::make_unique<worker::TimedCommunicator>(std::move(comm), &wait_ns_);
    } else {
      comm_ = std::move(comm);
    }
    comm_gen_ = gen;
    comm_rank_ = topo.rank;
    if (client_.peers_lost_generation() == gen) comm_->abort();
  }

  WorkerOptions o_;
  WorkerInfo info_;
  // comm_ is replaced by the training thread and aborted by the client's
  // reader thread (on_peers_lost), both under comm_mu_; the training
  // thread reads it without the lock (it is the only writer).
  std::mutex comm_mu_;
  std::unique_ptr<Communicator> comm_;
  long comm_gen_ = -1;  // the generation of comm_ (-1: none)
  // Stragglers: time inside comm_'s collectives since the interval began.
  std::atomic<int64_t> wait_ns_{0};
  std::chrono::steady_clock::time_point interval_start_ = std::chrono::steady_clock::now();
  uint64_t last_commit_seen_ = 0;
  std::chrono::steady_clock::time_point last_commit_at_{};  // when last_commit_seen_ was made
  uint32_t probe_us_ = 0;  // the pre-flight check's time, in every JOIN
  uint32_t link_us_ = 0;   // the pre-flight link probe's time, in every JOIN
  // Answers other workers' link probes while this worker lives (preflight on).
  std::unique_ptr<worker::LinkProbeResponder> responder_;
  uint64_t commits_since_report_ = 0;
  static constexpr std::chrono::milliseconds kTimingEvery{100};
  int comm_rank_ = -1;
  // Until then this rank asks for generations without shared memory: its
  // host's /dev/shm had no room for a segment (ShmNoRoom).
  std::chrono::steady_clock::time_point shm_off_until_{};
  static constexpr std::chrono::seconds kShmOffFor{60};
  // Declared last: destroyed first, so its reader thread is gone before
  // the communicator it may abort.
  RendezvousClient client_;
};

std::mutex g_mu;
std::unique_ptr<Context> g_context;

}  // namespace

Context& init() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_context) return *g_context;
  // erun hands its level down (ERUN_LOG_LEVEL); a worker outside erun says
  // its info lines.
  init_logging(!env_or("ERUN_VERBOSE").empty() ? LogLevel::kDebug : log_level_from_env(LogLevel::kInfo));
  // A peer that dies mid-write must surface as a CommError, not kill this
  // process: Gloo's TCP transport (selectable between hosts) writes without
  // MSG_NOSIGNAL.
  net::ignore_sigpipe_unless_handled();
  if (!env_or("ERUN_RDZV_ADDR").empty()) {
    // Before the first join, which may wait: a notice then drains as well.
    worker::install_drain_on_sigterm();
    g_context = std::make_unique<ElasticContext>(read_worker_options());
  } else if (launched_by_mpi()) {
    // The world size the launcher announced, to catch an MPI that cannot see it.
    long expected = env_int("OMPI_COMM_WORLD_SIZE", env_int("PMI_SIZE", 0));
    if (expected == 0 && !env_or("SLURM_PROCID").empty()) expected = env_int("SLURM_NTASKS", 0);
    g_context = make_mpi_context(static_cast<int>(expected));
  } else {
    g_context = std::make_unique<StandaloneContext>(env_or("ERUN_CHECKPOINT_DIR"));
  }
  return *g_context;
}

void shutdown() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_context.reset();
}

}  // namespace erun
