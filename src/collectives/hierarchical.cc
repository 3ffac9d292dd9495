#include "collectives/hierarchical.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#include <unistd.h>
#include <stdexcept>

#include "collectives/call_signature.h"
#include "collectives/gloo/gloo_communicator.h"
#include "collectives/shm/shm_communicator.h"
#include "collectives/tcp/tcp_communicator.h"
#include "collectives/reduce_kernels.h"
#include "common/check.h"
#include "store/prefix_store.h"

namespace erun {
namespace {

void put_u64(std::vector<char>& out, uint64_t v) {
  const char* p = reinterpret_cast<const char*>(&v);
  out.insert(out.end(), p, p + sizeof(v));
}

uint64_t get_u64(const std::vector<char>& in, size_t& pos) {
  if (pos + sizeof(uint64_t) > in.size()) throw CommError("hierarchical: truncated gather record (do all ranks run the same erun build?)");
  uint64_t v;
  std::memcpy(&v, in.data() + pos, sizeof(v));
  pos += sizeof(v);
  return v;
}

// The communicator among one rank per host: rank/size as given, listening on
// the host's address; its keys under "gloo/" or "tcp/" in `store`, a view the
// caller scoped.
std::unique_ptr<Communicator> make_cross(KvStore& store, const HierOptions& o, int rank, int size) {
  const std::string& address = o.address.empty() ? o.hostname : o.address;
  if (o.cross == CrossTransport::kGloo) {
    PrefixStore gloo_scope(store, "gloo");
    GlooOptions go;
    go.rank = rank;
    go.size = size;
    go.timeout = o.timeout;
    go.connect_timeout = o.connect_timeout;
    go.store_timeout = o.connect_timeout;
    go.hostname = address;
    return make_gloo_communicator(gloo_scope, go);
  }
  PrefixStore tcp_scope(store, "tcp");
  TcpOptions to;
  to.rank = rank;
  to.size = size;
  to.timeout = o.timeout;
  to.connect_timeout = o.connect_timeout;
  to.address = address;
  to.job_id = o.job_id;
  to.secret = o.secret;
  to.generation = o.generation;
  to.cancelled = o.cancelled;
  to.machine_ranks = o.local_size;
  return make_tcp_communicator(tcp_scope, to);
}

// A failure of the leaders' communicator, its failed rank already global.
class CrossHostError : public CommError {
 public:
  using CommError::CommError;
};

// The thread a host leader runs its pipelined cross-host steps on: started
// on the leader's first pipelined allreduce and kept for the communicator's
// life, one step at a time. start() and wait() are called by the thread that
// runs the communicator's operations.
class StepThread {
 public:
  StepThread() = default;
  StepThread(const StepThread&) = delete;
  StepThread& operator=(const StepThread&) = delete;
  ~StepThread() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  // Runs `step` on the thread; the step started before must have been waited for.
  void start(std::function<void()> step) {
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    {
      std::lock_guard<std::mutex> lock(mu_);
      step_ = std::move(step);
      done_ = false;
      error_ = nullptr;
    }
    pending_ = true;
    cv_.notify_all();
  }

  // A step was started and not waited for yet.
  bool pending() const { return pending_; }

  // Waits for the step started last; rethrows what it threw.
  void wait() {
    pending_ = false;
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || step_; });
      if (stop_) return;
      std::function<void()> step = std::exchange(step_, nullptr);
      lock.unlock();
      std::exception_ptr error;
      try {
        step();
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      error_ = error;
      done_ = true;
      cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> step_;  // the step to run; empty once taken
  bool done_ = true;            // the step started last has returned
  bool stop_ = false;
  std::exception_ptr error_;    // what it threw
  bool pending_ = false;        // the caller's side only
  std::thread thread_;
};

class HierCommunicator final : public Communicator {
 public:
  HierCommunicator(KvStore& store, const HierOptions& o) : o_(o) {
    ERUN_CHECK(o.size >= 1 && o.rank >= 0 && o.rank < o.size);
    ERUN_CHECK(o.local_size >= 1 && o.local_rank >= 0 && o.local_rank < o.local_size);
    // Keys in `store` (a view the caller scoped): host/<hostname>/shm/... for
    // each host's segment, cross/tcp/... (or gloo/) for the leaders' mesh.
    ShmOptions so;
    so.rank = o.local_rank;
    so.size = o.local_size;
    so.timeout = o.timeout;
    so.segment_tag = o.segment_tag;
    so.cancelled = o.cancelled;
    so.outside_work =
        "its cross-host step as this host's leader: a remote host is not answering or is slow (the leader's own "
        "error says which)";
    PrefixStore host_scope(store, "host/" + o.hostname + "/shm");
    local_ = make_shm_communicator(host_scope, so);
    if (leader()) {
      ERUN_CHECK(o.cross_size >= 1 && o.cross_rank >= 0 && o.cross_rank < o.cross_size);
      PrefixStore cross_scope(store, "cross");
      guarded([&] { across_hosts([&] { cross_ = make_cross(cross_scope, o, o.cross_rank, o.cross_size); }); });
    }
    // Where every rank lives: its host's index and its local rank there; and
    // whether its host has a CPU to spare for the pipeline's helper thread
    // (every host must agree on the pipeline: it changes the leaders' calls).
    guarded([&] {
      const int32_t mine[2] = {o.local_rank, o.local_size < ::sysconf(_SC_NPROCESSORS_ONLN) ? 1 : 0};
      auto all = gather_all(mine, sizeof(mine));
      host_of_ = std::move(all.host_of);
      hosts_ = *std::max_element(host_of_.begin(), host_of_.end()) + 1;
      local_of_.resize(o.size);
      bool spare_cpus = true;
      for (int r = 0; r < o.size; ++r) {
        int32_t theirs[2];
        if (all.by_rank[r].size() != sizeof(theirs)) throw CommError("hierarchical: rank " + std::to_string(r) + " is missing");
        std::memcpy(theirs, all.by_rank[r].data(), sizeof(theirs));
        local_of_[r] = theirs[0];
        spare_cpus = spare_cpus && theirs[1] != 0;
      }
      pipeline_ = o.pipeline == HierPipeline::kOn || (o.pipeline == HierPipeline::kAuto && spare_cpus);
      global_of_local_.assign(o.local_size, -1);
      for (int r = 0; r < o.size; ++r) {
        if (host_of_[r] == host_of_[o.rank] && local_of_[r] >= 0 && local_of_[r] < o.local_size) {
          global_of_local_[local_of_[r]] = r;
        }
      }
    });
  }

  int rank() const override { return o_.rank; }
  int size() const override { return o_.size; }

  void allreduce(void* data, size_t count, DataType type, ReduceOp op) override {
    if (type == DataType::kFloat16 || type == DataType::kBFloat16) {
      throw std::invalid_argument(std::string("erun: CPU allreduce does not support ") + to_string(type) +
                                  "; convert to float32 or use the NCCL communicator for GPU buffers");
    }
    const ReduceOp inner = op == ReduceOp::kAverage ? ReduceOp::kSum : op;
    guarded([&] {
      const size_t bytes = count * data_type_size(type);
      if (pipeline_ && bytes >= o_.pipeline_bytes && hosts() > 1) return allreduce_pipelined(static_cast<char*>(data), count, type, inner);
      local_->allreduce(data, count, type, inner);
      if (leader() && cross_->size() > 1) across_hosts([&] { cross_->allreduce(data, count, type, inner); });
      local_->broadcast(data, bytes, 0);
    });
    if (op == ReduceOp::kAverage) kernels::divide(data, count, type, size());
  }

  // Each host reduces the whole vector in shared memory, the leaders
  // reduce-scatter it among the hosts (each host's part: its ranks' blocks),
  // and each leader hands its host's part to its ranks. Among the leaders
  // this is the first half of an allreduce's bytes (TCP's reduce-scatter),
  // and on each host the broadcast carries the host's part, not the whole
  // vector. The caller's blocks are in rank order and a host's ranks need
  // not be adjacent: the vector is laid out host by host first.
  void reduce_scatter(const void* in, void* out, const std::vector<size_t>& counts, DataType type,
                      ReduceOp op) override {
    if (counts.size() != static_cast<size_t>(size()) || type == DataType::kFloat16 || type == DataType::kBFloat16) {
      return Communicator::reduce_scatter(in, out, counts, type, op);  // its error, as every backend's
    }
    const size_t esize = data_type_size(type);
    const HostLayout layout = host_layout(counts);
    std::vector<char>& all = scratch_all_;  // kept: a fresh 64 MiB a call doubled its time (page faults)
    all.resize(layout.total * esize);
    for (int r = 0; r < size(); ++r) {
      const size_t n = counts[static_cast<size_t>(r)] * esize;
      if (n) std::memcpy(all.data() + layout.at[r] * esize, static_cast<const char*>(in) + layout.given_at[r] * esize, n);
    }
    const ReduceOp inner = op == ReduceOp::kAverage ? ReduceOp::kSum : op;
    const int host = host_of_[rank()];
    std::vector<char>& part = scratch_part_;
    part.resize(layout.host_counts[host] * esize);
    guarded([&] {
      local_->allreduce(all.data(), layout.total, type, inner);
      if (leader() && cross_->size() > 1) {
        across_hosts([&] { cross_->reduce_scatter(all.data(), part.data(), layout.host_counts, type, inner); });
      } else if (leader() && !part.empty()) {
        std::memcpy(part.data(), all.data(), part.size());
      }
      local_->broadcast(part.data(), part.size(), 0);
    });
    const size_t mine = counts[static_cast<size_t>(rank())];
    if (mine) std::memcpy(out, part.data() + (layout.at[rank()] - layout.host_at[host]) * esize, mine * esize);
    if (op == ReduceOp::kAverage) kernels::divide(out, mine, type, size());
  }

  void broadcast(void* data, size_t bytes, int root) override {
    ERUN_CHECK(root >= 0 && root < size());
    const int root_host = host_of_[root];
    const bool on_root_host = host_of_[rank()] == root_host;
    guarded([&] {
      if (on_root_host) local_->broadcast(data, bytes, local_of_[root]);
      if (leader() && cross_->size() > 1) across_hosts([&] { cross_->broadcast(data, bytes, root_host); });
      if (!on_root_host) local_->broadcast(data, bytes, 0);
    });
  }

  void allgather(const void* in, void* out, size_t bytes) override {
    guarded([&] {
      auto all = gather_all(in, bytes);
      for (int r = 0; r < size(); ++r) {
        if (all.by_rank[r].size() != bytes) throw CommError("hierarchical allgather: rank " + std::to_string(r) + " gave a different size (every rank must pass allgather the same number of bytes)");
        if (bytes) std::memcpy(static_cast<char*>(out) + r * bytes, all.by_rank[r].data(), bytes);
      }
    });
  }

  std::vector<std::vector<char>> allgatherv(const void* in, size_t bytes) override {
    std::vector<std::vector<char>> result;
    guarded([&] { result = std::move(gather_all(in, bytes).by_rank); });
    return result;
  }

  void barrier() override {
    guarded([&] {
      local_->barrier();
      if (leader() && cross_->size() > 1) across_hosts([&] { cross_->barrier(); });
      local_->barrier();
    });
  }

  void abort() override {
    local_->abort();
    if (cross_) cross_->abort();
  }

 private:
  struct Gathered {
    std::vector<std::vector<char>> by_rank;
    std::vector<int> host_of;
  };

  bool leader() const { return o_.local_rank == 0; }

  // A reduce-scatter's vector laid out host by host (the hosts in the
  // leaders' rank order, each host's ranks in rank order), in elements.
  struct HostLayout {
    size_t total = 0;
    std::vector<size_t> given_at;     // by rank: its block in the caller's vector
    std::vector<size_t> at;           // by rank: its block in the host-by-host vector
    std::vector<size_t> host_at;      // by host: its part in the host-by-host vector
    std::vector<size_t> host_counts;  // by host: its part's length
  };

  HostLayout host_layout(const std::vector<size_t>& counts) const {
    HostLayout l;
    l.given_at.resize(size());
    l.at.resize(size());
    l.host_at.assign(hosts(), 0);
    l.host_counts.assign(hosts(), 0);
    for (int r = 0; r < size(); ++r) {
      l.given_at[r] = l.total;
      l.total += counts[static_cast<size_t>(r)];
      l.host_counts[host_of_[r]] += counts[static_cast<size_t>(r)];
    }
    for (int h = 1; h < hosts(); ++h) l.host_at[h] = l.host_at[h - 1] + l.host_counts[h - 1];
    std::vector<size_t> next = l.host_at;
    for (int r = 0; r < size(); ++r) {
      l.at[r] = next[host_of_[r]];
      next[host_of_[r]] += counts[static_cast<size_t>(r)];
    }
    return l;
  }

  // Runs the leader's part among the hosts, marked in the segment as work
  // outside it: a rank of this host that times out waiting for the leader
  // meanwhile reports a remote host, not this healthy leader, as the cause.
  // A failed rank the leaders' communicator names is a host index there: it
  // is rethrown as that host leader's global rank (a CrossHostError, which
  // guarded() does not map again).
  template <typename F>
  void across_hosts(F&& body) {
    OutsideMark mark(*local_);
    try {
      body();
    } catch (const CrossHostError&) {
      throw;
    } catch (const CommError& e) {
      if (e.failed_rank() < 0) throw;
      throw CrossHostError(e.what(), leader_of_host(e.failed_rank()), e.fate());
    }
  }

  // The global rank of host `host`'s leader; -1 while the rank map is not known yet.
  int leader_of_host(int host) const {
    for (size_t r = 0; r < host_of_.size() && r < local_of_.size(); ++r) {
      if (host_of_[r] == host && local_of_[r] == 0) return static_cast<int>(r);
    }
    return -1;
  }

  // The number of hosts, the same on every rank (cross_size is not: it
  // counts the hosts with a rank of the same local rank).
  int hosts() const { return hosts_; }

  // Large allreduce in chunks: the leader reduces chunk k+1 in shared memory
  // and broadcasts chunk k-1 back to its host while chunk k crosses the hosts
  // on a helper thread, instead of three sequential phases over the whole
  // buffer. Every rank of a host makes the same shm calls in the same order
  // (allreduce 0, allreduce 1, broadcast 0, allreduce 2, broadcast 1, ...),
  // the leader's cross-host calls stay one at a time, and each chunk is
  // reduced in the same order as without the pipeline.
  void allreduce_pipelined(char* data, size_t count, DataType type, ReduceOp op) {
    const size_t esize = data_type_size(type);
    const size_t per = std::clamp<size_t>(count / 4, (256 << 10) / esize, (4 << 20) / esize);
    const size_t chunks = (count + per - 1) / per;
    auto at = [&](size_t k) { return data + k * per * esize; };
    auto len = [&](size_t k) { return std::min(per, count - k * per); };
    try {
      for (size_t k = 0; k < chunks; ++k) {
        local_->allreduce(at(k), len(k), type, op);
        if (leader()) {
          if (k > 0) across_hosts([&] { crossing_.wait(); });
          crossing_.start([this, &at, &len, k, type, op] { cross_->allreduce(at(k), len(k), type, op); });
        }
        if (k > 0) local_->broadcast(at(k - 1), len(k - 1) * esize, 0);
      }
      if (leader()) across_hosts([&] { crossing_.wait(); });
      local_->broadcast(at(chunks - 1), len(chunks - 1) * esize, 0);
    } catch (...) {
      // Never leave a step running on the helper thread, nor wait for it to time out.
      if (crossing_.pending()) {
        cross_->abort();
        try {
          crossing_.wait();
        } catch (...) {
        }
      }
      throw;
    }
  }

  // Every rank's bytes, by global rank: gathered on each host, exchanged among
  // the leaders, broadcast back on each host.
  Gathered gather_all(const void* in, size_t bytes) {
    std::vector<char> mine;
    put_u64(mine, static_cast<uint64_t>(rank()));
    mine.insert(mine.end(), static_cast<const char*>(in), static_cast<const char*>(in) + bytes);
    auto locals = local_->allgatherv(mine.data(), mine.size());
    std::vector<char> all;
    if (leader()) {
      std::vector<char> host_block;
      put_u64(host_block, locals.size());
      for (auto& entry : locals) {
        put_u64(host_block, entry.size());
        host_block.insert(host_block.end(), entry.begin(), entry.end());
      }
      std::vector<std::vector<char>> hosts;
      across_hosts([&] { hosts = cross_->allgatherv(host_block.data(), host_block.size()); });
      put_u64(all, hosts.size());
      for (auto& h : hosts) all.insert(all.end(), h.begin(), h.end());
    }
    uint64_t total = all.size();
    local_->broadcast(&total, sizeof(total), 0);
    all.resize(total);
    local_->broadcast(all.data(), total, 0);

    Gathered g;
    g.by_rank.resize(size());
    g.host_of.assign(size(), -1);
    size_t pos = 0;
    const uint64_t n_hosts = get_u64(all, pos);
    for (uint64_t h = 0; h < n_hosts; ++h) {
      const uint64_t n_local = get_u64(all, pos);
      for (uint64_t l = 0; l < n_local; ++l) {
        const uint64_t len = get_u64(all, pos);
        size_t start = pos;
        const uint64_t r = get_u64(all, pos);
        if (len < sizeof(uint64_t) || start + len > all.size() || r >= static_cast<uint64_t>(size())) {
          throw CommError("hierarchical: malformed gather record (host " + std::to_string(h) +
                          "; do all ranks run the same erun build?)");
        }
        g.by_rank[r].assign(all.begin() + pos, all.begin() + start + len);
        g.host_of[r] = static_cast<int>(h);
        pos = start + len;
      }
    }
    for (int r = 0; r < size(); ++r) {
      if (g.host_of[r] < 0) {
        throw CommError("hierarchical: rank " + std::to_string(r) +
                        " is on no host; check local_rank/local_size/cross_rank of every rank");
      }
    }
    return g;
  }

  // Runs one operation; on a CommError aborts both layers so that the ranks
  // of this host (through the segment) and the other leaders (through their
  // sockets) fail at once, and rethrows. A collective mismatch seen by this
  // host's shm part (every rank of the host sees it) aborts too, so that the
  // other hosts stop at once, and is rethrown naming global ranks.
  // A failed rank named by the shared-memory layer is a local rank of this
  // host: it is rethrown as the rank of the whole communicator (one named by
  // the leaders' layer was mapped by across_hosts()).
  template <typename F>
  void guarded(F&& body) {
    try {
      body();
    } catch (const CrossHostError& e) {
      abort();
      throw CommError(e.what(), e.failed_rank(), e.fate());
    } catch (const CommError& e) {
      abort();
      if (e.failed_rank() < 0) throw;
      throw CommError(e.what(), global_rank_of_local(e.failed_rank()), e.fate());
    } catch (const CallMismatch& e) {
      abort();
      std::vector<RankCall> calls = e.calls();
      for (RankCall& c : calls) {
        if (int g = global_rank_of_local(c.rank); g >= 0) c.rank = g;
      }
      throw CallMismatch("hierarchical communicator on host " + o_.hostname + " (rank " + std::to_string(rank()) +
                             "; the calls are this host's parts of the operations): " + e.where(),
                         std::move(calls));
    }
  }

  // -1 while the rank map is not known yet (or the rank is not on this host).
  int global_rank_of_local(int local) const {
    if (local < 0 || static_cast<size_t>(local) >= global_of_local_.size()) return -1;
    return global_of_local_[local];
  }

  const HierOptions o_;
  std::unique_ptr<ShmCommunicator> local_;
  std::unique_ptr<Communicator> cross_;
  std::vector<int> host_of_;
  int hosts_ = 1;
  bool pipeline_ = false;  // the same on every rank
  std::vector<int32_t> local_of_;
  std::vector<int> global_of_local_;  // global rank of each local rank of this host
  // reduce_scatter's vector laid out host by host, and this host's part:
  // kept from call to call (the size of the largest so far).
  std::vector<char> scratch_all_;
  std::vector<char> scratch_part_;
  // A leader's pipelined cross-host steps. Declared last: its thread is
  // joined before the communicators it uses are destroyed.
  StepThread crossing_;
};

}  // namespace

std::unique_ptr<Communicator> make_hierarchical_communicator(KvStore& store, const HierOptions& o) {
  if (o.flat) {
    PrefixStore flat_scope(store, "flat");
    return make_cross(flat_scope, o, o.rank, o.size);
  }
  if (o.local_size == o.size) {
    ShmOptions so;
    so.rank = o.rank;
    so.size = o.size;
    so.timeout = o.timeout;
    so.segment_tag = o.segment_tag;
    so.cancelled = o.cancelled;
    PrefixStore shm_scope(store, "shm");
    return make_shm_communicator(shm_scope, so);
  }
  if (o.local_size == 1 && o.cross_size == o.size) return make_cross(store, o, o.rank, o.size);
  return std::make_unique<HierCommunicator>(store, o);
}

}  // namespace erun
