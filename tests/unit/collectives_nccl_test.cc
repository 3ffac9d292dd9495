// NcclCommunicator on real GPUs (skipped without one): every type and
// reduction against a serial reference, one thread per rank and one GPU per
// rank (world size 1 on a single-GPU machine), plus the timeout and abort
// paths and shrink (ncclCommShrink; 2 or more GPUs, NCCL 2.27+).
#include <gtest/gtest.h>

#if ERUN_HAVE_NCCL
#include <cmath>
#include <cstring>
#include <functional>

#include "collectives/nccl/nccl_communicator.h"
#include "store/memory_store.h"
#include "support/rank_threads.h"

namespace erun {
namespace {

using namespace std::chrono_literals;

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

// Host conversions for the exactly representable values this test uses.
uint16_t to_half(float f) {
  if (f == 0) return 0;
  uint32_t b;
  std::memcpy(&b, &f, 4);
  uint32_t sign = (b >> 16) & 0x8000, exp = (b >> 23) & 0xff, man = b & 0x7fffff;
  return static_cast<uint16_t>(sign | ((exp - 127 + 15) << 10) | (man >> 13));
}
float from_half(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  if (exp == 0 && man == 0) {
    float z;
    std::memcpy(&z, &sign, 4);
    return z;
  }
  uint32_t b = sign | ((exp - 15 + 127) << 23) | (man << 13);
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
uint16_t to_bf16(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return static_cast<uint16_t>(b >> 16);
}
float from_bf16(uint16_t h) {
  uint32_t b = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// Input values 1..3 (and their sums/products) are exact in every type.
double input(int rank, size_t i) { return static_cast<double>((rank * 5 + i) % 3 + 1); }

double reference(int size, size_t i, ReduceOp op) {
  double acc = input(0, i);
  for (int r = 1; r < size; ++r) {
    double x = input(r, i);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAverage: acc += x; break;
      case ReduceOp::kProduct: acc *= x; break;
      case ReduceOp::kMin: acc = std::min(acc, x); break;
      case ReduceOp::kMax: acc = std::max(acc, x); break;
    }
  }
  return op == ReduceOp::kAverage ? acc / size : acc;
}

void encode(DataType t, double v, void* out) {
  switch (t) {
    case DataType::kFloat32: *static_cast<float*>(out) = static_cast<float>(v); break;
    case DataType::kFloat64: *static_cast<double*>(out) = v; break;
    case DataType::kInt32: *static_cast<int32_t*>(out) = static_cast<int32_t>(v); break;
    case DataType::kInt64: *static_cast<int64_t*>(out) = static_cast<int64_t>(v); break;
    case DataType::kUInt8: *static_cast<uint8_t*>(out) = static_cast<uint8_t>(v); break;
    case DataType::kFloat16: *static_cast<uint16_t*>(out) = to_half(static_cast<float>(v)); break;
    case DataType::kBFloat16: *static_cast<uint16_t*>(out) = to_bf16(static_cast<float>(v)); break;
  }
}

double decode(DataType t, const void* in) {
  switch (t) {
    case DataType::kFloat32: return *static_cast<const float*>(in);
    case DataType::kFloat64: return *static_cast<const double*>(in);
    case DataType::kInt32: return *static_cast<const int32_t*>(in);
    case DataType::kInt64: return static_cast<double>(*static_cast<const int64_t*>(in));
    case DataType::kUInt8: return *static_cast<const uint8_t*>(in);
    case DataType::kFloat16: return from_half(*static_cast<const uint16_t*>(in));
    case DataType::kBFloat16: return from_bf16(*static_cast<const uint16_t*>(in));
  }
  return 0;
}

bool is_integer(DataType t) {
  return t == DataType::kInt32 || t == DataType::kInt64 || t == DataType::kUInt8;
}

double tolerance(DataType t) {
  switch (t) {
    case DataType::kFloat16: return 2e-3;
    case DataType::kBFloat16: return 1e-2;
    case DataType::kFloat32: return 1e-6;
    default: return 1e-12;
  }
}

void run_ranks(int size, const std::function<void(NcclCommunicator&, cudaStream_t)>& fn) {
  MemoryKvStore store;
  testing::RunOptions slow;
  slow.deadline = 300s;  // NCCL's first communicator on a cold GPU
  testing::run_ranks(size, [&](int r) {
    NcclOptions o;
    o.rank = r;
    o.size = size;
    o.device = r;
    o.timeout = 120s;
    NcclCommunicator comm(store, o);
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
    fn(comm, stream);
    cudaStreamDestroy(stream);
  }, slow);
}

class NcclTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!nccl_available()) GTEST_SKIP() << "no CUDA device";
  }
};

void check_all_types(NcclCommunicator& comm, cudaStream_t stream) {
  const DataType types[] = {DataType::kFloat32, DataType::kFloat64, DataType::kInt32,   DataType::kInt64,
                            DataType::kUInt8,   DataType::kFloat16, DataType::kBFloat16};
  const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct};
  for (DataType t : types) {
    for (ReduceOp op : ops) {
      for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}, size_t{1} << 20}) {
        const size_t es = data_type_size(t);
        std::vector<char> host(n * es);
        for (size_t i = 0; i < n; ++i) encode(t, input(comm.rank(), i), host.data() + i * es);
        void* dev = nullptr;
        CUDA_OK(cudaMalloc(&dev, std::max<size_t>(host.size(), 1)));
        CUDA_OK(cudaMemcpy(dev, host.data(), host.size(), cudaMemcpyHostToDevice));
        comm.allreduce(dev, n, t, op, stream);
        CUDA_OK(cudaMemcpy(host.data(), dev, host.size(), cudaMemcpyDeviceToHost));
        cudaFree(dev);
        size_t bad = 0;
        for (size_t i = 0; i < n; ++i) {
          double want = reference(comm.size(), i, op);
          if (is_integer(t) && op == ReduceOp::kAverage) want = std::trunc(want);
          double got = decode(t, host.data() + i * es);
          if (std::abs(got - want) > tolerance(t) * std::max(1.0, std::abs(want))) {
            if (bad++ == 0) {
              ADD_FAILURE() << to_string(t) << " " << to_string(op) << " n=" << n << " rank " << comm.rank()
                            << " i=" << i << ": got " << got << ", want " << want;
            }
          }
        }
      }
    }
  }
}

TEST_F(NcclTest, AllreduceEveryTypeAndOpWorldOfOne) {
  run_ranks(1, check_all_types);
}

TEST_F(NcclTest, AllreduceEveryTypeAndOpOneGpuPerRank) {
  int n = std::min(cuda_device_count(), 4);
  if (n < 2) GTEST_SKIP() << "needs 2 or more GPUs";
  run_ranks(n, check_all_types);
}

TEST_F(NcclTest, BroadcastAndAllgather) {
  int n = std::max(1, std::min(cuda_device_count(), 4));
  run_ranks(n, [](NcclCommunicator& comm, cudaStream_t stream) {
    const size_t bytes = 4099;
    std::vector<char> host(bytes);
    for (size_t i = 0; i < bytes; ++i) host[i] = static_cast<char>(comm.rank() == 0 ? i * 7 : 0);
    char* dev = nullptr;
    char* out = nullptr;
    CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&dev), bytes));
    CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&out), bytes * comm.size()));
    CUDA_OK(cudaMemcpy(dev, host.data(), bytes, cudaMemcpyHostToDevice));
    comm.broadcast(dev, bytes, 0, stream);
    CUDA_OK(cudaMemcpy(host.data(), dev, bytes, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < bytes; ++i) ASSERT_EQ(host[i], static_cast<char>(i * 7));
    CUDA_OK(cudaMemset(dev, comm.rank() + 1, bytes));
    comm.allgather(dev, out, bytes, stream);
    std::vector<char> all(bytes * comm.size());
    CUDA_OK(cudaMemcpy(all.data(), out, all.size(), cudaMemcpyDeviceToHost));
    for (int r = 0; r < comm.size(); ++r) ASSERT_EQ(all[r * bytes + bytes - 1], static_cast<char>(r + 1));
    cudaFree(dev);
    cudaFree(out);
  });
}

TEST_F(NcclTest, InitTimesOutWhenAPeerNeverComes) {
  MemoryKvStore store;
  NcclOptions o;
  o.rank = 0;
  o.size = 2;  // rank 1 never starts
  o.timeout = 3s;
  auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(NcclCommunicator(store, o), CommError);
  auto took = std::chrono::steady_clock::now() - start;
  std::printf("nccl init timeout detected after %.2f s (timeout 3 s)\n", seconds(took));
  EXPECT_LT(took, 30s);
}

TEST_F(NcclTest, AbortMakesLaterOperationsThrow) {
  MemoryKvStore store;
  NcclCommunicator comm(store, NcclOptions{});
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  float* dev = nullptr;
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&dev), 4 * sizeof(float)));
  comm.allreduce(dev, 4, DataType::kFloat32, ReduceOp::kSum, stream);
  comm.abort();
  EXPECT_THROW(comm.allreduce(dev, 4, DataType::kFloat32, ReduceOp::kSum, stream), CommError);
  EXPECT_THROW(comm.broadcast(dev, 16, 0, stream), CommError);
  cudaFree(dev);
  cudaStreamDestroy(stream);
}

TEST_F(NcclTest, ShrinkKeepsTheSurvivorsInOrder) {
  const int n = std::min(cuda_device_count(), 4);
  if (n < 2) GTEST_SKIP() << "needs 2 or more GPUs";
  if (!NcclCommunicator::shrink_supported()) GTEST_SKIP() << "this NCCL has no ncclCommShrink (2.27+)";
  // Rank 0 of the old communicator leaves: rank r becomes rank r-1.
  run_ranks(n, [n](NcclCommunicator& comm, cudaStream_t stream) {
    ASSERT_TRUE(comm.healthy());
    if (comm.rank() == 0) return comm.abort();  // it leaves
    NcclOptions o;
    o.rank = comm.rank() - 1;
    o.size = n - 1;
    o.timeout = 120s;
    std::unique_ptr<NcclCommunicator> small = comm.shrink({0}, o);
    EXPECT_EQ(small->rank(), comm.rank() - 1);
    EXPECT_EQ(small->device(), comm.device());
    comm.abort();
    float* dev = nullptr;
    CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&dev), sizeof(float)));
    const float mine = static_cast<float>(small->rank() + 1);
    CUDA_OK(cudaMemcpy(dev, &mine, sizeof(float), cudaMemcpyHostToDevice));
    small->allreduce(dev, 1, DataType::kFloat32, ReduceOp::kSum, stream);
    float sum = 0;
    CUDA_OK(cudaMemcpy(&sum, dev, sizeof(float), cudaMemcpyDeviceToHost));
    EXPECT_EQ(sum, static_cast<float>((n - 1) * n / 2));
    cudaFree(dev);
  });
}

TEST_F(NcclTest, ShrinkToAWrongRankIsACommError) {
  const int n = std::min(cuda_device_count(), 4);
  if (n < 2) GTEST_SKIP() << "needs 2 or more GPUs";
  if (!NcclCommunicator::shrink_supported()) GTEST_SKIP() << "this NCCL has no ncclCommShrink (2.27+)";
  run_ranks(2, [](NcclCommunicator& comm, cudaStream_t) {
    if (comm.rank() == 0) return comm.abort();
    NcclOptions o;
    o.rank = 1;  // NCCL makes it rank 0 of 1
    o.size = 1;
    o.timeout = 60s;
    try {
      comm.shrink({0}, o);
      FAIL() << "a shrink to the wrong rank must fail";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("not rank 1 of 1"), std::string::npos) << e.what();
    }
  });
}

TEST_F(NcclTest, AbortedCommunicatorIsNotHealthy) {
  MemoryKvStore store;
  NcclCommunicator comm(store, NcclOptions{});
  EXPECT_TRUE(comm.healthy());
  comm.abort();
  EXPECT_FALSE(comm.healthy());
}

}  // namespace
}  // namespace erun

#else

TEST(NcclCollectives, NotBuilt) { GTEST_SKIP() << "erun was built without NCCL"; }

#endif
