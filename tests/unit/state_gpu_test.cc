// The public GPU API (Context::gpu(), State::register_device_buffer) with
// threads as ranks: each thread has its own Context over a Gloo communicator,
// all on this machine's first GPU, so a world of 2-4 shares one device and
// uses the host-staged path, and a world of one uses NCCL. Without a device
// (or without CUDA) the device tests skip with the reason; what can be
// checked without one (clear errors) runs everywhere.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <thread>

#include "collectives/gloo/gloo_communicator.h"
#include "commits/host_commits.h"
#include "erun/erun.hpp"
#include "store/memory_store.h"
#include "store/prefix_store.h"

#if ERUN_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace erun {
namespace {

using namespace std::chrono_literals;

// A rank of a world made of threads; next_generation() plays a re-join.
class ThreadContext final : public Context {
 public:
  ThreadContext(int rank, int size, std::chrono::milliseconds timeout) : timeout_(timeout) {
    info_.rank = rank;
    info_.size = size;
    info_.local_rank = rank;
    info_.local_size = size;
    info_.host = "localhost";
  }
  void connect(KvStore& store) {
    GlooOptions g;
    g.rank = info_.rank;
    g.size = info_.size;
    g.timeout = timeout_;
    PrefixStore scoped(store, "gen" + std::to_string(info_.generation));
    comm_ = make_gloo_communicator(scoped, g);
  }
  // Every rank of the generation is past its last operation (an out-of-band
  // barrier through the store), then the old communicators are aborted.
  void next_generation(KvStore& store) {
    const std::string left = "left/" + std::to_string(info_.generation) + "/";
    store.set(left + std::to_string(info_.rank), {});
    for (int r = 0; r < info_.size; ++r) store.get(left + std::to_string(r), timeout_);
    abort_gpu();
    comm_->abort();
    info_.generation += 1;
    connect(store);
  }
  const WorkerInfo& info() const override { return info_; }
  std::string host_commit_stem() const override { return stem_; }
  void set_host_commit_stem(std::string stem) { stem_ = std::move(stem); }
  Communicator& comm() override { return *comm_; }
  bool host_update_pending() const override { return false; }
  void rejoin(uint64_t) override { throw Error("ThreadContext cannot re-join"); }
  bool elastic() const override { return false; }
  std::chrono::milliseconds collective_timeout() const override { return timeout_; }
  // What the GPU communicator reported as time inside its collectives.
  int64_t waited_ns() const { return waited_ns_.load(); }

 private:
  void collective_waited(std::chrono::nanoseconds waited) noexcept override { waited_ns_ += waited.count(); }
  std::atomic<int64_t> waited_ns_{0};
  WorkerInfo info_;
  std::string stem_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<Communicator> comm_;
};

// Runs fn on `size` threads, each with its own connected ThreadContext.
void run_world(int size, const std::function<void(ThreadContext&, KvStore&)>& fn,
               std::chrono::milliseconds timeout = 20s) {
  MemoryKvStore store;
  std::vector<std::thread> threads;
  std::mutex mu;
  std::exception_ptr first;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        ThreadContext ctx(r, size, timeout);
        ctx.connect(store);
        fn(ctx, store);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

#if !ERUN_HAVE_CUDA

TEST(GpuApi, BuiltWithoutCudaIsAClearError) {
  EXPECT_FALSE(built_with_cuda());
  EXPECT_EQ(gpu_device_count(), 0);
  run_world(1, [](ThreadContext& ctx, KvStore&) {
    float x = 0;
    try {
      ctx.gpu().allreduce(&x, 1, DataType::kFloat32, ReduceOp::kSum);
      FAIL() << "must throw";
    } catch (const Error& e) {
      EXPECT_TRUE(contains(e.what(), "erun was built without CUDA")) << e.what();
    }
    EXPECT_THROW(ctx.gpu().device(), Error);
    State state(ctx);
    try {
      state.register_device_buffer("w", &x, sizeof(x));
      FAIL() << "must throw";
    } catch (const Error& e) {
      EXPECT_TRUE(contains(e.what(), "built without CUDA")) << e.what();
    }
  });
}

#else

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

// Skips the test, with the reason, where there is no device to run it on.
#define REQUIRE_GPU()                                                                           \
  do {                                                                                          \
    if (gpu_device_count() == 0) GTEST_SKIP() << "no CUDA device visible (no GPU or no driver)"; \
  } while (0)

TEST(GpuApi, NoDeviceIsAClearError) {
  if (gpu_device_count() > 0) GTEST_SKIP() << "a CUDA device is present: the no-device error cannot be seen";
  run_world(1, [](ThreadContext& ctx, KvStore&) {
    try {
      ctx.gpu().device();
      FAIL() << "must throw";
    } catch (const Error& e) {
      EXPECT_TRUE(contains(e.what(), "sees no CUDA device")) << e.what();
    }
    float x = 0;
    EXPECT_THROW(ctx.gpu().allreduce(&x, 1, DataType::kFloat32, ReduceOp::kSum), Error);
  });
}

TEST(DeviceState, HostMemoryIsRefused) {
  run_world(1, [](ThreadContext& ctx, KvStore&) {
    State state(ctx);
    std::vector<float> host(16);
    try {
      state.register_device_buffer("w", host.data(), 64);
      FAIL() << "host memory must be refused";
    } catch (const Error& e) {
      EXPECT_TRUE(contains(e.what(), "is not CUDA device memory")) << e.what();
      EXPECT_TRUE(contains(e.what(), "'w'")) << e.what();
    }
  });
}

template <typename T>
std::vector<T> to_host(const void* dev, size_t n) {
  std::vector<T> out(n);
  EXPECT_EQ(cudaMemcpy(out.data(), dev, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return out;
}

template <typename T>
T* to_device(const std::vector<T>& v) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(v.size(), 1) * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  // A pageable copy may still be landing when cudaMemcpy returns, and the
  // tests' streams are non-blocking: they do not wait for the legacy stream.
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return static_cast<T*>(p);
}

// Allreduce (float32 over several pipeline chunks, int64), broadcast from the
// last rank and allgather, checked element by element on every rank.
void check_collectives(ThreadContext& ctx, cudaStream_t stream) {
  const int rank = ctx.rank(), size = ctx.size();
  const size_t n = (size_t{5} << 20) + 3;  // 20 MiB of float: three 8 MiB chunks
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = static_cast<float>((rank * 7 + i) % 13);
  float* df = to_device(f);
  ctx.gpu().allreduce(df, n, DataType::kFloat32, ReduceOp::kSum, stream);
  std::vector<float> got = to_host<float>(df, n);
  for (size_t i = 0; i < n; ++i) {
    float want = 0;
    for (int r = 0; r < size; ++r) want += static_cast<float>((r * 7 + i) % 13);
    ASSERT_EQ(got[i], want) << "rank " << rank << " float32 element " << i;
  }
  std::vector<int64_t> big(1000);
  for (size_t i = 0; i < big.size(); ++i) big[i] = (int64_t{1} << 40) * (rank + 1) + static_cast<int64_t>(i);
  int64_t* di = to_device(big);
  ctx.gpu().allreduce(di, big.size(), DataType::kInt64, ReduceOp::kMax, stream);
  std::vector<int64_t> gi = to_host<int64_t>(di, big.size());
  for (size_t i = 0; i < gi.size(); ++i) ASSERT_EQ(gi[i], (int64_t{1} << 40) * size + static_cast<int64_t>(i));
  const int root = size - 1;
  for (size_t i = 0; i < n; ++i) f[i] = rank == root ? static_cast<float>(i % 1009) : -1.0f;
  CUDA_OK(cudaMemcpy(df, f.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_OK(cudaDeviceSynchronize());  // `stream` may be non-blocking: it does not wait for the copy
  ctx.gpu().broadcast(df, n * sizeof(float), root, stream);
  got = to_host<float>(df, n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], static_cast<float>(i % 1009)) << "broadcast element " << i;
  const size_t bytes = 4099;
  char* in = nullptr;
  char* out = nullptr;
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&in), bytes));
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&out), bytes * size));
  CUDA_OK(cudaMemset(in, rank + 1, bytes));
  CUDA_OK(cudaDeviceSynchronize());
  ctx.gpu().allgather(in, out, bytes, stream);
  std::vector<char> all = to_host<char>(out, bytes * size);
  for (int r = 0; r < size; ++r) {
    ASSERT_EQ(all[r * bytes], static_cast<char>(r + 1));
    ASSERT_EQ(all[r * bytes + bytes - 1], static_cast<char>(r + 1));
  }
  cudaFree(df);
  cudaFree(di);
  cudaFree(in);
  cudaFree(out);
}

TEST(GpuApi, StagedPathAmongRanksSharingTheGpu) {
  REQUIRE_GPU();
  for (int size : {2, 3, 4}) {
    run_world(size, [](ThreadContext& ctx, KvStore&) {
      ctx.gpu().set_device(0);  // every thread on the same GPU: the ranks share it
      EXPECT_EQ(ctx.gpu().backend(), GpuBackend::kStaged);
      cudaStream_t stream;
      CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      check_collectives(ctx, stream);
      cudaStreamDestroy(stream);
    });
  }
}

TEST(GpuApi, NcclInAWorldOfOne) {
  REQUIRE_GPU();
  if (!built_with_nccl()) GTEST_SKIP() << "erun was built without NCCL";
  run_world(1, [](ThreadContext& ctx, KvStore&) {
    EXPECT_EQ(ctx.gpu().backend(), GpuBackend::kNccl);
    check_collectives(ctx, nullptr);
  });
}

// The NCCL path's collectives count as time in collectives for the
// straggler timing (Context::collective_waited); the staged path's are not
// counted there, as they go through comm(), which a worker's context times
// itself (counting them here would count them twice).
TEST(GpuApi, NcclCollectivesCountAsTimeInCollectivesAndStagedOnesOnlyOnce) {
  REQUIRE_GPU();
  if (!built_with_nccl()) GTEST_SKIP() << "erun was built without NCCL";
  for (GpuBackend backend : {GpuBackend::kNccl, GpuBackend::kStaged}) {
    run_world(1, [backend](ThreadContext& ctx, KvStore&) {
      ctx.gpu().set_backend(backend);
      std::vector<float> v(size_t{1} << 20, 1.0f);
      float* d = to_device(v);
      ctx.gpu().allreduce(d, v.size(), DataType::kFloat32, ReduceOp::kSum, nullptr);
      ctx.gpu().broadcast(d, v.size() * sizeof(float), 0, nullptr);
      cudaFree(d);
      EXPECT_EQ(ctx.gpu().backend(), backend);
      if (backend == GpuBackend::kNccl) {
        EXPECT_GT(ctx.waited_ns(), 0);
      } else {
        EXPECT_EQ(ctx.waited_ns(), 0);
      }
    });
  }
}

TEST(GpuApi, RebuiltForEveryGeneration) {
  REQUIRE_GPU();
  run_world(2, [](ThreadContext& ctx, KvStore& store) {
    ctx.gpu().set_device(0);
    for (int gen = 0; gen < 3; ++gen) {
      std::vector<int32_t> v(100, ctx.rank() + 1 + gen);
      int32_t* d = to_device(v);
      ctx.gpu().allreduce(d, v.size(), DataType::kInt32, ReduceOp::kSum, nullptr);
      EXPECT_EQ(to_host<int32_t>(d, v.size())[99], 3 + 2 * gen);
      cudaFree(d);
      ctx.next_generation(store);  // the old backend is aborted; the next call builds a new one
    }
  });
}

TEST(GpuApi, APeerThatStopsCallingIsACommErrorWithinTheTimeout) {
  REQUIRE_GPU();
  run_world(
      2,
      [](ThreadContext& ctx, KvStore&) {
        ctx.gpu().set_device(0);
        ASSERT_EQ(ctx.gpu().backend(), GpuBackend::kStaged);
        if (ctx.rank() == 1) return;  // rank 1 never calls the allreduce
        float* d = nullptr;
        CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&d), 4096));
        auto t0 = std::chrono::steady_clock::now();
        EXPECT_THROW(ctx.gpu().allreduce(d, 1024, DataType::kFloat32, ReduceOp::kSum, nullptr), CommError);
        EXPECT_LT(std::chrono::steady_clock::now() - t0, 20s);
        // The generation stays broken until the next one.
        EXPECT_THROW(ctx.gpu().allreduce(d, 1024, DataType::kFloat32, ReduceOp::kSum, nullptr), CommError);
        cudaFree(d);
      },
      2s);
}

void check_commit_restore(bool async) {
  run_world(1, [async](ThreadContext& ctx, KvStore&) {
    ctx.gpu().device();
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const size_t n = (size_t{16} << 20) / sizeof(int32_t);
    std::vector<int32_t> a(n);
    for (size_t i = 0; i < n; ++i) a[i] = static_cast<int32_t>(i * 2654435761u);
    int32_t* d = to_device(a);
    State state(ctx);
    State::DeviceBufferOptions o;
    o.stream = stream;
    o.async = async;
    state.register_device_buffer("w", d, n * sizeof(int32_t), o);
    state.sync();
    state.commit();
    // Enqueued right after commit() on the buffer's stream: must not reach the commit.
    CUDA_OK(cudaMemsetAsync(d, 0x5a, n * sizeof(int32_t), stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    EXPECT_EQ(to_host<int32_t>(d, 1)[0], 0x5a5a5a5a);
    state.restore();
    EXPECT_EQ(to_host<int32_t>(d, n), a);
    EXPECT_EQ(state.commit_id(), 1u);
    cudaFree(d);
    cudaStreamDestroy(stream);
  });
}

TEST(DeviceState, CommitAndRestore) {
  REQUIRE_GPU();
  check_commit_restore(false);
}

TEST(DeviceState, AsynchronousCommitIsOrderedBeforeLaterWorkOnTheStream) {
  REQUIRE_GPU();
  check_commit_restore(true);
}

TEST(DeviceState, SyncSpreadsTheNewestCommitToEveryRank) {
  REQUIRE_GPU();
  run_world(3, [](ThreadContext& ctx, KvStore&) {
    ctx.gpu().set_device(0);
    const size_t n = 300000;  // 1.2 MB
    std::vector<float> v(n, static_cast<float>(ctx.rank() + 10));
    float* d = to_device(v);
    State state(ctx);
    state.register_device_buffer("w", d, n * sizeof(float));
    state.sync();  // nobody committed: rank 0's values are everyone's baseline
    EXPECT_EQ(to_host<float>(d, n), std::vector<float>(n, 10.0f)) << "rank " << ctx.rank();
    std::vector<float> own(n, static_cast<float>(ctx.rank() + 20));
    CUDA_OK(cudaMemcpy(d, own.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    state.commit();  // commit 1 everywhere, each rank with its own values
    state.restore();
    EXPECT_EQ(to_host<float>(d, n), own) << "rank " << ctx.rank();
    state.sync();  // the root is rank 0: the lowest of the newest
    EXPECT_EQ(to_host<float>(d, n), std::vector<float>(n, 20.0f)) << "rank " << ctx.rank();
    CUDA_OK(cudaMemset(d, 0, n * sizeof(float)));
    state.restore();  // the synced commit is this rank's commit now
    EXPECT_EQ(to_host<float>(d, n), std::vector<float>(n, 20.0f)) << "rank " << ctx.rank();
    cudaFree(d);
  });
}

TEST(DeviceState, SyncGoesOverNcclWithAGpuPerRank) {
  REQUIRE_GPU();
  if (!built_with_nccl()) GTEST_SKIP() << "erun was built without NCCL";
  const int n = std::min(gpu_device_count(), 4);
  if (n < 2) GTEST_SKIP() << "needs 2 or more GPUs (one per rank)";
  run_world(n, [](ThreadContext& ctx, KvStore&) {
    ctx.gpu().set_device(ctx.rank());
    const size_t count = 300000;
    std::vector<float> v(count, static_cast<float>(ctx.rank() + 10));
    float* d = to_device(v);
    int32_t host_value = ctx.rank();
    State state(ctx);
    state.register_device_buffer("w", d, count * sizeof(float));
    state.register_value("h", &host_value);
    state.sync();  // baseline: rank 0's values
    EXPECT_EQ(ctx.gpu().backend(), GpuBackend::kNccl);
    EXPECT_EQ(to_host<float>(d, count), std::vector<float>(count, 10.0f)) << "rank " << ctx.rank();
    EXPECT_EQ(host_value, 0);
    // Every rank commits its own values; the root is then rank 0 (the lowest
    // of the newest), and the others' buffers are zeroed so that only what
    // arrives counts.
    std::vector<float> own(count, static_cast<float>(ctx.rank() + 20));
    CUDA_OK(cudaMemcpy(d, own.data(), count * sizeof(float), cudaMemcpyHostToDevice));
    host_value = ctx.rank() + 100;
    state.commit();
    if (ctx.rank() != 0) {
      CUDA_OK(cudaMemset(d, 0, count * sizeof(float)));
    }
    state.sync();
    const std::vector<float> newest(count, 20.0f);
    EXPECT_EQ(to_host<float>(d, count), newest) << "rank " << ctx.rank();
    EXPECT_EQ(host_value, 100) << "rank " << ctx.rank();
    EXPECT_EQ(state.commit_id(), 1u);
    CUDA_OK(cudaMemset(d, 0, count * sizeof(float)));
    state.restore();  // the buffer received over NCCL is this rank's commit now
    EXPECT_EQ(to_host<float>(d, count), newest) << "rank " << ctx.rank();
    cudaFree(d);
  });
}

// Under erun a device buffer's commit is copied straight into the worker's
// host-memory commit file (on /dev/shm, registered with CUDA), synchronously
// or on a side stream; the file is whole once every copy landed, restore()
// reads it back from there, and the next worker on the host adopts it when
// every worker that made it is gone, then commits on top of it.
void check_device_commits_in_host_memory(bool async) {
  char tmpl[] = "/dev/shm/erun-gpu-host-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string root = tmpl, dir = root + "/job", stem = dir + "/slot-0";
  const size_t n = (size_t{3} << 20) + 5;  // 12 MB of float
  const size_t small = 1000;               // a second buffer, on the default stream
  auto floats_of = [](const std::vector<char>& b) {
    std::vector<float> v(b.size() / sizeof(float));
    std::memcpy(v.data(), b.data(), v.size() * sizeof(float));
    return v;
  };
  // The newest whole commit in the host's files: its id, and w's and b's values.
  auto expect_in_host_memory = [&](uint64_t id, float w, float b) {
    auto f = state_internal::HostCommits::newest(dir);
    ASSERT_TRUE(f) << "commit " << id;
    EXPECT_EQ(f->snapshot.commit_id, id);
    int found = 0;
    for (auto& [name, bytes] : f->snapshot.entries) {
      if (name == "w") {
        ++found;
        EXPECT_TRUE(floats_of(bytes) == std::vector<float>(n, w)) << "commit " << id;
      } else if (name == "b") {
        ++found;
        EXPECT_TRUE(floats_of(bytes) == std::vector<float>(small, b)) << "commit " << id;
      } else if (name == "z") {
        ++found;
        EXPECT_TRUE(bytes.empty());
      }
    }
    EXPECT_EQ(found, 3) << "commit " << id;
  };
  auto set = [](float* d, size_t count, float value, cudaStream_t s) {
    std::vector<float> host(count, value);
    ASSERT_EQ(cudaMemcpyAsync(d, host.data(), count * sizeof(float), cudaMemcpyHostToDevice, s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  };
  run_world(1, [&](ThreadContext& ctx, KvStore&) {
    ctx.gpu().device();
    ctx.set_host_commit_stem(stem);
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    float* d = to_device(std::vector<float>(n, 0.0f));
    float* b = to_device(std::vector<float>(small, 0.0f));
    int32_t step = 0;
    {
      State state(ctx);
      State::DeviceBufferOptions o;
      o.stream = stream;
      o.async = async;
      state.register_device_buffer("w", d, n * sizeof(float), o);
      state.register_device_buffer("b", b, small * sizeof(float));
      state.register_device_buffer("z", d, 0);
      state.register_value("step", &step);
      state.sync();
      for (int k = 1; k <= 3; ++k) {
        set(d, n, static_cast<float>(k), stream);
        set(b, small, static_cast<float>(-k), nullptr);
        step = k;
        state.commit();
        // Later work on the stream waits for the copy; the landing follows.
        CUDA_OK(cudaStreamSynchronize(stream));
        state.restore();  // waits for the landing too
        expect_in_host_memory(static_cast<uint64_t>(k), static_cast<float>(k), static_cast<float>(-k));
      }
      CUDA_OK(cudaMemset(d, 0, n * sizeof(float)));
      CUDA_OK(cudaMemset(b, 0, small * sizeof(float)));
      CUDA_OK(cudaDeviceSynchronize());  // the memsets (legacy stream) before the restore's copy on `stream`
      state.restore();  // from the host file's bytes
      EXPECT_EQ(to_host<float>(d, n), std::vector<float>(n, 3.0f));
      EXPECT_EQ(to_host<float>(b, small), std::vector<float>(small, -3.0f));
    }
    cudaFree(d);
    cudaFree(b);
    cudaStreamDestroy(stream);
  });
  // Every worker of the host gone: the next one resumes at commit 3, and
  // its own next commit lands in the host's files as well.
  run_world(1, [&](ThreadContext& ctx, KvStore&) {
    ctx.gpu().device();
    ctx.set_host_commit_stem(stem);
    float* d = to_device(std::vector<float>(n, 0.0f));
    float* b = to_device(std::vector<float>(small, 0.0f));
    int32_t step = 0;
    State state(ctx);
    state.register_device_buffer("w", d, n * sizeof(float));
    state.register_device_buffer("b", b, small * sizeof(float));
    state.register_device_buffer("z", d, 0);
    state.register_value("step", &step);
    state.sync();
    EXPECT_EQ(state.commit_id(), 3u);
    EXPECT_EQ(step, 3);
    EXPECT_EQ(to_host<float>(d, n), std::vector<float>(n, 3.0f));
    EXPECT_EQ(to_host<float>(b, small), std::vector<float>(small, -3.0f));
    set(d, n, 4.0f, nullptr);
    state.commit();
    expect_in_host_memory(4, 4.0f, -3.0f);
    cudaFree(d);
    cudaFree(b);
  });
  std::filesystem::remove_all(root);
}

TEST(DeviceState, CommitLandsStraightInHostMemory) {
  REQUIRE_GPU();
  check_device_commits_in_host_memory(false);
}

TEST(DeviceState, AsynchronousCommitLandsStraightInHostMemory) {
  REQUIRE_GPU();
  check_device_commits_in_host_memory(true);
}

TEST(DeviceState, DurableCommitComesBackIntoTheDeviceBuffer) {
  REQUIRE_GPU();
  char tmpl[] = "/tmp/erun-gpu-state-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  run_world(1, [&](ThreadContext& ctx, KvStore&) {
    ctx.gpu().device();
    const size_t n = 4096;
    std::vector<int32_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<int32_t>(i * 7 + 1);
    int32_t* d = to_device(v);
    {
      State state(ctx);
      state.register_device_buffer("w", d, n * sizeof(int32_t));
      state.set_checkpoint_dir(dir);
      state.sync();
      state.commit();  // rank 0 writes it durably
    }
    CUDA_OK(cudaMemset(d, 0, n * sizeof(int32_t)));
    State fresh(ctx);
    fresh.register_device_buffer("w", d, n * sizeof(int32_t));
    fresh.set_checkpoint_dir(dir);  // loads the file into the device buffer
    EXPECT_EQ(fresh.commit_id(), 1u);
    EXPECT_EQ(to_host<int32_t>(d, n), v);
    CUDA_OK(cudaMemset(d, 0, n * sizeof(int32_t)));
    fresh.restore();  // and the loaded file is the commit
    EXPECT_EQ(to_host<int32_t>(d, n), v);
    cudaFree(d);
  });
  std::filesystem::remove_all(dir);
}

#endif

}  // namespace
}  // namespace erun
