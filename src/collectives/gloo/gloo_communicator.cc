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

  // reduce_scatter stays the base class's allreduce of a copy. The Gloo
  // installed here (Debian's 2022 snapshot) has one reduce-scatter,
  // gloo::ReduceScatterHalvingDoubling, from its older API, and it cannot
  // keep erun's contract: it waits with the pairs' fixed timeout (the
  // connect timeout, GlooOptions::connect_timeout), not the operation's; it
  // takes slots from the context's own counter, beside the tags this class
  // numbers from 0 for the newer API; it reduces in place (a full copy of
  // the const input) into two more buffers of the input's size it allocates
  // per call; and its counts are int.

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
