#include "collectives/gloo/gloo_communicator.h"

#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <mutex>
#include <stdexcept>

#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/tcp/pair.h>

#include "collectives/reduce_kernels.h"
#include "common/check.h"
#include "common/net.h"

namespace erun {
namespace {

using Millis = std::chrono::milliseconds;

// gloo sizes are size_t, but keep single transfers well below 2 GiB so that no
// int inside a transport or the kernel's socket calls ever sees a larger count.
constexpr size_t kMaxChunkBytes = size_t{1} << 30;
// Slots of reduce_scatter's point-to-point steps, apart from gloo's own
// collectives' prefixes (gloo/types.h: 0x01 to 0x08).
constexpr uint8_t kReduceScatterSlotPrefix = 0x10;

Millis to_millis(Duration d) {
  return std::max(Millis(1), std::chrono::duration_cast<Millis>(d));
}

// gloo::rendezvous::Store over an erun KvStore (a view the caller scoped).
class StoreAdapter final : public gloo::rendezvous::Store {
 public:
  StoreAdapter(KvStore& store, Duration timeout) : store_(store), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override { store_.set(key, data); }
  std::vector<char> get(const std::string& key) override { return store_.get(key, timeout_); }
  void wait(const std::vector<std::string>& keys) override { wait(keys, to_millis(timeout_)); }
  void wait(const std::vector<std::string>& keys, const Millis& timeout) override {
    // The store wait has its own bound (GlooOptions::store_timeout), which may
    // be longer than the context's connect timeout gloo passes in.
    (void)timeout;
    for (auto& key : keys) store_.get(key, timeout_);
  }

 private:
  KvStore& store_;
  const Duration timeout_;
};

// Reads a tcp::Pair's socket under the pair's own lock (both are protected
// members; naming them through a derived class is the standard way to reach
// them without changing gloo).
struct PairAccess : gloo::transport::tcp::Pair {
  static void shutdown_socket(gloo::transport::tcp::Pair& pair) {
    auto mu = &PairAccess::m_;
    auto fd = &PairAccess::fd_;
    std::lock_guard<std::mutex> lock(pair.*mu);
    int sock = pair.*fd;
    if (sock >= 0) ::shutdown(sock, SHUT_RDWR);
  }
};

// Gloo's reduce callback over the shared kernels (reduce_kernels.h).
template <typename T, ReduceOp OP>
void reduce_into(void* out, const void* a, const void* b, size_t n) {
  kernels::combine<T, OP>(static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b), n);
}

template <typename T>
gloo::AllreduceOptions::Func reduce_function(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage: return &reduce_into<T, ReduceOp::kSum>;
    case ReduceOp::kProduct: return &reduce_into<T, ReduceOp::kProduct>;
    case ReduceOp::kMin: return &reduce_into<T, ReduceOp::kMin>;
    case ReduceOp::kMax: return &reduce_into<T, ReduceOp::kMax>;
  }
  ERUN_CHECK(false);
  return nullptr;
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(KvStore& store, const GlooOptions& o) : options_(o), timeout_(to_millis(o.timeout)) {
    ERUN_CHECK(o.size >= 1 && o.rank >= 0 && o.rank < o.size);
    run("connect", [&] {
      gloo::transport::tcp::attr attr;
      attr.hostname = o.hostname;
      device_ = gloo::transport::tcp::CreateDevice(attr);
      auto context = std::make_shared<gloo::rendezvous::Context>(o.rank, o.size);
      context->setTimeout(o.connect_timeout.count() > 0 ? to_millis(o.connect_timeout) : timeout_);
      StoreAdapter adapter(store, o.store_timeout.count() > 0 ? o.store_timeout : o.timeout);
      context->connectFullMesh(adapter, device_);
      context_ = std::move(context);
    });
  }

  ~GlooCommunicator() override = default;

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }

  void allreduce(void* data, size_t count, DataType type, ReduceOp op) override {
    kernels::visit_cpu_type(type, [&](auto* tag) {
      allreduce_typed<std::remove_pointer_t<decltype(tag)>>(data, count, op);
    });
  }

  // A ring over gloo's point-to-point buffers, not gloo's own
  // reduce-scatter: the Gloo installed here (Debian's 2022 snapshot) has
  // only gloo::ReduceScatterHalvingDoubling, from its older API, which waits
  // with the pairs' fixed timeout (GlooOptions::connect_timeout) instead of
  // the operation's, takes slots from the context's own counter beside the
  // tags numbered here, copies the whole input and allocates two more
  // buffers of its size per call, and counts in int. Each rank sends and
  // receives (size - 1) / size of the input once, half of what an allreduce
  // moves, and keeps two blocks of scratch.
  void reduce_scatter(const void* in, void* out, const std::vector<size_t>& counts, DataType type,
                      ReduceOp op) override {
    if (counts.size() != static_cast<size_t>(size()) || size() == 1) {
      Communicator::reduce_scatter(in, out, counts, type, op);  // its error, or a world of one
      return;
    }
    kernels::visit_cpu_type(type, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      ring_reduce_scatter<T>(static_cast<const T*>(in), static_cast<T*>(out), counts, op);
    });
  }

  void broadcast(void* data, size_t bytes, int root) override {
    ERUN_CHECK(root >= 0 && root < size());
    run("broadcast", [&] {
      auto* p = static_cast<uint8_t*>(data);
      for (size_t off = 0; off < bytes; off += kMaxChunkBytes) {
        size_t n = std::min(kMaxChunkBytes, bytes - off);
        gloo::BroadcastOptions opts(context_);
        opts.setOutput(p + off, n);
        opts.setRoot(root);
        opts.setTag(next_tag());
        opts.setTimeout(timeout_);
        gloo::broadcast(opts);
      }
    });
  }

  void allgather(const void* in, void* out, size_t bytes) override {
    run("allgather", [&] {
      if (bytes == 0) return;
      gloo::AllgatherOptions opts(context_);
      opts.setInput(const_cast<uint8_t*>(static_cast<const uint8_t*>(in)), bytes);
      opts.setOutput(static_cast<uint8_t*>(out), bytes * static_cast<size_t>(size()));
      opts.setTag(next_tag());
      opts.setTimeout(timeout_);
      gloo::allgather(opts);
    });
  }

  std::vector<std::vector<char>> allgatherv(const void* in, size_t bytes) override {
    std::vector<uint64_t> sizes(size());
    uint64_t mine = bytes;
    allgather(&mine, sizes.data(), sizeof(mine));
    std::vector<size_t> counts(sizes.begin(), sizes.end());
    size_t total = 0;
    for (size_t c : counts) total += c;
    std::vector<char> flat(total);
    run("allgatherv", [&] {
      if (total == 0) return;
      gloo::AllgathervOptions opts(context_);
      opts.setInput(const_cast<char*>(static_cast<const char*>(in)), bytes);
      opts.setOutput(flat.data(), counts);
      opts.setTag(next_tag());
      opts.setTimeout(timeout_);
      gloo::allgatherv(opts);
    });
    std::vector<std::vector<char>> result(size());
    size_t off = 0;
    for (int r = 0; r < size(); ++r) {
      result[r].assign(flat.begin() + off, flat.begin() + off + counts[r]);
      off += counts[r];
    }
    return result;
  }

  void barrier() override {
    run("barrier", [&] {
      gloo::BarrierOptions opts(context_);
      opts.setTag(next_tag());
      opts.setTimeout(timeout_);
      gloo::barrier(opts);
    });
  }

  void abort() override {
    std::lock_guard<std::mutex> lock(abort_mu_);
    if (aborted_.exchange(true)) return;
    if (!context_) return;
    // Shutting the sockets down wakes every blocked operation here (the
    // transport sees end-of-stream) and tells the peers at once.
    for (int r = 0; r < size(); ++r) {
      if (r == rank()) continue;
      auto& pair = context_->getPair(r);
      if (auto* tcp = dynamic_cast<gloo::transport::tcp::Pair*>(pair.get())) PairAccess::shutdown_socket(*tcp);
    }
  }

 private:
  template <typename T>
  void allreduce_typed(void* data, size_t count, ReduceOp op) {
    run("allreduce", [&] {
      auto fn = reduce_function<T>(op);
      auto* p = static_cast<T*>(data);
      const size_t chunk = kMaxChunkBytes / sizeof(T);
      for (size_t off = 0; off < count; off += chunk) {
        size_t n = std::min(chunk, count - off);
        gloo::AllreduceOptions opts(context_);
        opts.setOutput(p + off, n);
        opts.setReduceFunction(fn);
        opts.setTag(next_tag());
        opts.setTimeout(timeout_);
        gloo::allreduce(opts);
      }
    });
    if (op == ReduceOp::kAverage) kernels::divide(static_cast<T*>(data), count, size());
  }

  // Step s of size - 1: this rank sends its running result for block
  // r - s - 1 (at step 0 its own input) to the right, receives the left's
  // for block r - s - 2 and adds its own input to it; the last step's
  // block is r, whole. Every step takes a tag, sent or not, so the ranks
  // agree; a step whose block is empty sends nothing (both ends know).
  template <typename T>
  void ring_reduce_scatter(const T* in, T* out, const std::vector<size_t>& counts, ReduceOp op) {
    const int n = size();
    const int r = rank();
    std::vector<size_t> start(1, 0);  // block k begins at start[k]
    for (size_t c : counts) start.push_back(start.back() + c);
    auto block = [n](int k) { return static_cast<size_t>(((k % n) + n) % n); };
    const size_t most = *std::max_element(counts.begin(), counts.end());
    auto fn = reduce_function<T>(op);
    run("reduce_scatter", [&] {
      if (scratch_.size() < 2 * most * sizeof(T)) scratch_.resize(2 * most * sizeof(T));
      T* sent = reinterpret_cast<T*>(scratch_.data());
      T* got = sent + most;
      const int right = (r + 1) % n;
      const int left = (r + n - 1) % n;
      const T* from = in + start[block(r - 1)];
      for (int s = 0; s < n - 1; ++s) {
        const uint32_t tag = next_tag();
        const size_t out_block = block(r - s - 1);
        const size_t in_block = block(r - s - 2);
        const size_t out_n = counts[out_block];
        const size_t in_n = counts[in_block];
        std::unique_ptr<gloo::transport::UnboundBuffer> send, recv;
        const uint64_t slot = gloo::Slot::build(kReduceScatterSlotPrefix, tag);
        if (in_n > 0) {
          recv = context_->createUnboundBuffer(got, in_n * sizeof(T));
          recv->recv(left, slot);
        }
        if (out_n > 0) {
          send = context_->createUnboundBuffer(const_cast<T*>(from), out_n * sizeof(T));
          send->send(right, slot);
        }
        if (recv && !recv->waitRecv(timeout_)) throw CommError("the receive was aborted");
        if (send && !send->waitSend(timeout_)) throw CommError("the send was aborted");
        if (aborted_) throw CommError("aborted");
        // out may be this rank's block of in itself: fn reads each element before it writes it.
        T* into = s == n - 2 ? out : sent;
        if (in_n > 0) fn(into, got, in + start[in_block], in_n);
        from = into;
      }
    });
    if (op == ReduceOp::kAverage) kernels::divide(out, counts[static_cast<size_t>(r)], n);
  }

  uint32_t next_tag() { return tag_++; }

  // Runs one operation and turns every failure into a CommError; after one, the
  // communicator refuses further work.
  template <typename F>
  void run(const char* what, F&& body) {
    if (aborted_) fail(what, "the communicator was aborted");
    if (broken_) fail(what, "an earlier operation failed: " + broken_reason_);
    try {
      body();
    } catch (const CommError& e) {
      mark_broken(e.what());
      fail(what, e.what());
    } catch (const gloo::Exception& e) {
      mark_broken(e.what());
      fail(what, aborted_ ? std::string("the communicator was aborted (") + e.what() + ")" : e.what());
    } catch (const std::invalid_argument&) {
      throw;
    } catch (const std::exception& e) {
      // gloo reports protocol violations (GLOO_ENFORCE) as plain exceptions.
      mark_broken(e.what());
      fail(what, e.what());
    }
    if (aborted_) {
      mark_broken("aborted");
      fail(what, "the communicator was aborted");
    }
  }

  void mark_broken(const std::string& reason) {
    if (!broken_) broken_reason_ = reason;
    broken_ = true;
  }

  [[noreturn]] void fail(const char* what, const std::string& cause) const {
    throw CommError("gloo " + std::string(what) + " failed on rank " + std::to_string(rank()) + " of " +
                    std::to_string(size()) + " (timeout " +
                    std::to_string(timeout_.count()) + " ms): " + cause +
                    "; rebuild the communicator (restore and re-join)");
  }

  const GlooOptions options_;
  const Millis timeout_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  uint32_t tag_ = 0;
  std::vector<char> scratch_;  // reduce_scatter's two blocks, kept between calls
  bool broken_ = false;
  std::string broken_reason_;
  std::mutex abort_mu_;
  std::atomic<bool> aborted_{false};
};

}  // namespace

std::unique_ptr<Communicator> make_gloo_communicator(KvStore& store, const GlooOptions& options) {
  // Gloo writes with writev(): a peer that shut its sockets (aborted, or
  // gone) raises SIGPIPE, which must be a CommError, not this process's end.
  net::ignore_sigpipe_unless_handled();
  return std::make_unique<GlooCommunicator>(store, options);
}

}  // namespace erun
