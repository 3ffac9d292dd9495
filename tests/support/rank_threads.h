// Ranks as threads: run_ranks() runs one body per rank on its own thread,
// joins them and rethrows the first exception; a deadline turns a hung rank
// into a test failure instead of a hung test. run_comms() does the same with
// one Communicator per rank, made by a Backend over one shared MemoryKvStore.
// cpu_backends() describes erun's CPU communicators as the tests use them
// (shm, tcp over distinct loopback addresses, gloo, hierarchical with ranks
// interleaved over two loopback "hosts"), plus staged-over-tcp on device
// buffers when erun is built with CUDA. Header-only.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "collectives/gloo/gloo_communicator.h"
#include "collectives/hierarchical.h"
#include "collectives/shm/shm_communicator.h"
#include "collectives/tcp/tcp_communicator.h"
#include "erun/communicator.hpp"
#include "store/memory_store.h"

#if ERUN_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "collectives/cuda/staged_communicator.h"
#endif

namespace erun::testing {

struct RunOptions {
  // Every rank must have returned by then. When it passes, on_deadline runs
  // (e.g. aborts the ranks' communicators so that blocked operations throw);
  // a rank still running `grace` later ends the test binary with a message,
  // since a thread cannot be cancelled.
  std::chrono::milliseconds deadline{std::chrono::seconds(90)};
  std::chrono::milliseconds grace{std::chrono::seconds(15)};
  std::function<void()> on_deadline;
};

// Runs body(rank) for rank 0..n-1 on n threads, joins them and rethrows the
// first exception any rank raised (gtest assertions inside the body are
// recorded as usual). Past the deadline the test fails with "deadline".
inline void run_ranks(int n, const std::function<void(int rank)>& body, const RunOptions& options = {}) {
  std::mutex mu;
  std::condition_variable cv;
  int running = n;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!first) first = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mu);
      --running;
      cv.notify_all();
    });
  }
  bool late = false;
  {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, options.deadline, [&] { return running == 0; })) {
      late = true;
      lock.unlock();
      if (options.on_deadline) options.on_deadline();
      lock.lock();
      if (!cv.wait_for(lock, options.grace, [&] { return running == 0; })) {
        std::fprintf(stderr, "run_ranks: %d of %d ranks still running %lld ms past the deadline; giving up\n",
                     running, n, static_cast<long long>(options.grace.count()));
        std::fflush(stderr);
        std::_Exit(1);
      }
    }
  }
  for (auto& t : threads) t.join();
  if (late) {
    ADD_FAILURE() << "run_ranks: the ranks ran past the deadline of " << options.deadline.count() << " ms";
  }
  if (first) std::rethrow_exception(first);
}

using CommFactory = std::function<std::unique_ptr<Communicator>(KvStore& store, int rank, int size)>;

// A communicator as the tests make it.
struct Backend {
  std::string name;
  CommFactory make;
  // Every rank ends an allreduce with the same bits, whatever the inputs.
  bool bitwise_equal = true;
  // float16/bfloat16 reduce; otherwise they are std::invalid_argument.
  bool half_precision = false;
  // Empty when usable here; otherwise why the tests skip it.
  std::function<std::string()> unavailable;
};

// Runs fn(rank, comm) on n threads, each with backend.make's communicator
// over one shared store (`shared`, or a fresh MemoryKvStore); a rank whose
// body throws aborts its communicator so that the others fail now rather than
// at their timeout, and the deadline aborts them all.
inline void run_comms(const Backend& backend, int n, const std::function<void(int rank, Communicator& comm)>& fn,
                      RunOptions options = {}, KvStore* shared = nullptr) {
  MemoryKvStore own;
  KvStore& store = shared ? *shared : own;
  std::mutex mu;
  std::vector<Communicator*> comms(n, nullptr);
  auto user_on_deadline = options.on_deadline;
  options.on_deadline = [&] {
    if (user_on_deadline) user_on_deadline();
    std::lock_guard<std::mutex> lock(mu);
    for (Communicator* c : comms) {
      if (c) c->abort();
    }
  };
  run_ranks(
      n,
      [&](int r) {
        auto comm = backend.make(store, r, n);
        {
          std::lock_guard<std::mutex> lock(mu);
          comms[r] = comm.get();
        }
        struct Unregister {
          std::mutex& mu;
          Communicator*& slot;
          ~Unregister() {
            std::lock_guard<std::mutex> lock(mu);
            slot = nullptr;
          }
        } unregister{mu, comms[r]};
        try {
          EXPECT_EQ(comm->rank(), r) << backend.name;
          EXPECT_EQ(comm->size(), n) << backend.name;
          fn(r, *comm);
        } catch (...) {
          comm->abort();
          throw;
        }
      },
      options);
}

// As run_comms for bodies that return an error text ("" when fine) instead of
// throwing: returns every rank's error ("rank R: ...", one a line; a throw
// counts as its what()), "" when all passed. A rank with an error aborts its
// communicator so that the others fail now rather than at their timeout.
inline std::string run_comms_errors(const Backend& backend, int n,
                                    const std::function<std::string(int rank, Communicator& comm)>& fn,
                                    RunOptions options = {}) {
  std::mutex mu;
  std::string errors;
  auto record = [&](const std::string& who, const std::string& err) {
    std::lock_guard<std::mutex> lock(mu);
    errors += who + ": " + err + "\n";
  };
  try {
    run_comms(
        backend, n,
        [&](int r, Communicator& comm) {
          std::string err;
          try {
            err = fn(r, comm);
          } catch (const std::exception& e) {
            err = e.what();
          }
          if (err.empty()) return;
          comm.abort();
          record("rank " + std::to_string(r), err);
        },
        std::move(options));
  } catch (const std::exception& e) {
    record("a rank's communicator", e.what());
  }
  return errors;
}

// Each backend's options, as its own tests set them: rank, size and a 60 s
// timeout, plus what the backend needs.
template <typename Options>
Options rank_options(int rank, int size) {
  Options o;
  o.rank = rank;
  o.size = size;
  o.timeout = std::chrono::seconds(60);
  return o;
}

inline ShmOptions shm_options(int rank, int size) {
  auto o = rank_options<ShmOptions>(rank, size);
  o.segment_tag = "ranktest" + std::to_string(::getpid());
  return o;
}

inline std::string loopback_address(int index) { return "127.0.0." + std::to_string(2 + index); }

inline TcpOptions tcp_options(int rank, int size) {
  auto o = rank_options<TcpOptions>(rank, size);
  o.address = loopback_address(rank);
  o.job_id = "job-rank-threads";
  o.secret = "rank-threads-secret-0123456789abcdef";
  o.generation = 3;
  return o;
}

inline GlooOptions gloo_options(int rank, int size) { return rank_options<GlooOptions>(rank, size); }

// Ranks interleaved over `hosts` loopback hosts: rank r on host r % hosts,
// local rank r / hosts; local and cross ranks as Horovod defines them.
inline HierOptions hier_options(int rank, int size, int hosts) {
  auto o = rank_options<HierOptions>(rank, size);
  o.local_rank = rank / hosts;
  o.local_size = 0;
  o.cross_rank = rank % hosts;
  o.cross_size = 0;
  for (int q = 0; q < size; ++q) {
    if (q % hosts == rank % hosts) o.local_size++;
    if (q / hosts == rank / hosts) o.cross_size++;
  }
  o.hostname = "127.0.0." + std::to_string(rank % hosts + 1);
  o.job_id = "hier-rank-threads";
  o.secret = "hier-rank-threads-secret";
  o.segment_tag = "hierranktest" + std::to_string(::getpid());
  o.pipeline = HierPipeline::kOn;  // whatever the machine's CPUs
  return o;
}

#if ERUN_HAVE_CUDA
inline int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

// A StagedGpuCommunicator behind the Communicator interface: host buffers go
// to the device and back around each staged operation; allgatherv and
// barrier (which it does not have) go to its CPU communicator.
class StagedAsCommunicator final : public Communicator {
 public:
  StagedAsCommunicator(std::unique_ptr<Communicator> cpu, const StagedOptions& options)
      : cpu_(std::move(cpu)), staged_(*cpu_, options) {}
  int rank() const override { return cpu_->rank(); }
  int size() const override { return cpu_->size(); }
  void allreduce(void* data, size_t count, DataType type, ReduceOp op) override {
    const size_t bytes = count * data_type_size(type);
    Device d(bytes);
    d.put(data, bytes);
    staged_.allreduce(d.ptr, count, type, op, nullptr);
    d.get(data, bytes);
  }
  void broadcast(void* data, size_t bytes, int root) override {
    Device d(bytes);
    d.put(data, bytes);
    staged_.broadcast(d.ptr, bytes, root, nullptr);
    d.get(data, bytes);
  }
  void allgather(const void* in, void* out, size_t bytes) override {
    Device din(bytes), dout(bytes * size());
    din.put(in, bytes);
    staged_.allgather(din.ptr, dout.ptr, bytes, nullptr);
    dout.get(out, bytes * size());
  }
  std::vector<std::vector<char>> allgatherv(const void* in, size_t bytes) override {
    return cpu_->allgatherv(in, bytes);
  }
  void barrier() override { cpu_->barrier(); }
  void abort() override { staged_.abort(); }

 private:
  struct Device {
    void* ptr = nullptr;
    explicit Device(size_t bytes) {
      if (bytes && cudaMalloc(&ptr, bytes) != cudaSuccess) throw std::runtime_error("cudaMalloc failed");
    }
    ~Device() {
      if (ptr) cudaFree(ptr);
    }
    void put(const void* host, size_t bytes) {
      if (bytes && cudaMemcpy(ptr, host, bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
        throw std::runtime_error("cudaMemcpy to the device failed");
      }
    }
    void get(void* host, size_t bytes) {
      if (bytes && cudaMemcpy(host, ptr, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
        throw std::runtime_error("cudaMemcpy from the device failed");
      }
    }
  };
  std::unique_ptr<Communicator> cpu_;
  StagedGpuCommunicator staged_;
};
#endif

inline Backend backend(std::string name, CommFactory make) {
  Backend b;
  b.name = std::move(name);
  b.make = std::move(make);
  return b;
}
inline Backend shm_backend() {
  return backend("shm", [](KvStore& s, int r, int n) -> std::unique_ptr<Communicator> {
    return make_shm_communicator(s, shm_options(r, n));
  });
}
inline Backend tcp_backend() {
  return backend("tcp", [](KvStore& s, int r, int n) { return make_tcp_communicator(s, tcp_options(r, n)); });
}
inline Backend gloo_backend() {
  return backend("gloo", [](KvStore& s, int r, int n) { return make_gloo_communicator(s, gloo_options(r, n)); });
}
// Two loopback hosts, ranks interleaved (with 4 ranks: two hosts of two).
inline Backend hier_backend() {
  return backend("hier",
                 [](KvStore& s, int r, int n) { return make_hierarchical_communicator(s, hier_options(r, n, 2)); });
}
inline Backend staged_backend() {
  Backend b;
  b.name = "staged";
  b.half_precision = true;
#if ERUN_HAVE_CUDA
  b.make = [](KvStore& s, int r, int n) -> std::unique_ptr<Communicator> {
    StagedOptions o;
    o.timeout = std::chrono::seconds(60);
    o.chunk_bytes = 64 << 10;  // several chunks for the larger cases
    return std::make_unique<StagedAsCommunicator>(make_tcp_communicator(s, tcp_options(r, n)), o);
  };
  b.unavailable = [] {
    return cuda_device_count() > 0 ? std::string() : std::string("no CUDA device visible (no GPU or no driver)");
  };
#else
  b.make = [](KvStore&, int, int) -> std::unique_ptr<Communicator> { return nullptr; };
  b.unavailable = [] { return std::string("erun was built without CUDA"); };
#endif
  return b;
}

}  // namespace erun::testing
