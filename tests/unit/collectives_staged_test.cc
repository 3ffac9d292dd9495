// The host-staged GPU communicator: the float16/bfloat16 conversions it
// reduces through (no device needed), and float16/bfloat16 allreduce plus
// abort among threads sharing one GPU (skipped without a device).
#include <gtest/gtest.h>

#if ERUN_HAVE_CUDA
#include <cmath>
#include <cstring>

#include "collectives/cuda/staged_communicator.h"
#include "collectives/gloo/gloo_communicator.h"
#include "store/memory_store.h"
#include "support/rank_threads.h"

namespace erun {
namespace {

using namespace std::chrono_literals;

float bits_to_float(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

TEST(HalfConversion, ExactValuesRoundTrip) {
  for (float f : {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f /* smallest normal */,
                  5.960464477539063e-08f /* smallest subnormal */, 3.0517578125e-05f /* a subnormal */}) {
    EXPECT_EQ(half_to_float(float_to_half(f)), f) << f;
    EXPECT_EQ(bf16_to_float(float_to_bf16(f == 65504.0f ? 65536.0f : f)), f == 65504.0f ? 65536.0f : f) << f;
  }
  EXPECT_EQ(float_to_half(1.0f), 0x3c00);
  EXPECT_EQ(float_to_half(-2.0f), 0xc000);
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
}

TEST(HalfConversion, RoundsToNearestEvenAndSaturatesToInfinity) {
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties go to the even 1.
  EXPECT_EQ(float_to_half(1.0f + 0x1.0p-11f), 0x3c00);
  // 1 + 3 * 2^-11 is halfway between 1 + 2^-10 (odd) and 1 + 2^-9: up.
  EXPECT_EQ(float_to_half(1.0f + 3 * 0x1.0p-11f), 0x3c02);
  EXPECT_EQ(float_to_half(1.0f + 0x1.0p-11f + 0x1.0p-20f), 0x3c01);  // above halfway: up
  EXPECT_EQ(float_to_half(70000.0f), 0x7c00);
  EXPECT_EQ(float_to_half(-1e30f), 0xfc00);
  EXPECT_EQ(float_to_half(65519.0f), 0x7bff);  // below the rounding boundary of 65504
  EXPECT_EQ(float_to_half(65520.0f), 0x7c00);  // rounds up to infinity
  EXPECT_TRUE(std::isnan(half_to_float(float_to_half(std::nanf("")))));
  EXPECT_TRUE(std::isinf(half_to_float(0x7c00)));
  // bfloat16: 1 + 2^-8 is halfway between 1 and 1 + 2^-7: even.
  EXPECT_EQ(float_to_bf16(1.0f + 0x1.0p-8f), 0x3f80);
  EXPECT_EQ(float_to_bf16(1.0f + 3 * 0x1.0p-8f), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(bits_to_float(0x7f800001u)))));
  // Every half converts to a float and back unchanged (NaNs stay NaN).
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = half_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_half(f), h) << std::hex << h;
  }
}

using testing::cuda_device_count;

// Ranks as threads sharing one GPU, each staging through its own Gloo
// communicator.
void run_ranks(int size, const std::function<void(StagedGpuCommunicator&)>& fn) {
  auto gloo = testing::backend("gloo", [](KvStore& store, int rank, int n) {
    GlooOptions g = testing::gloo_options(rank, n);
    g.timeout = 10s;
    return make_gloo_communicator(store, g);
  });
  testing::run_comms(gloo, size, [&](int, Communicator& cpu) {
    StagedOptions o;
    o.timeout = 10s;
    o.chunk_bytes = 4096;  // many chunks: the pipeline's buffer reuse is exercised
    StagedGpuCommunicator comm(cpu, o);
    fn(comm);
  });
}

TEST(StagedGpu, HalfPrecisionAllreduceThroughFloat) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible (no GPU or no driver)";
  run_ranks(3, [](StagedGpuCommunicator& comm) {
    for (DataType t : {DataType::kFloat16, DataType::kBFloat16}) {
      const size_t n = 10000;  // 20 KB: five chunks of 4 KiB
      std::vector<uint16_t> h(n);
      auto enc = [&](float f) { return t == DataType::kFloat16 ? float_to_half(f) : float_to_bf16(f); };
      auto dec = [&](uint16_t v) { return t == DataType::kFloat16 ? half_to_float(v) : bf16_to_float(v); };
      for (size_t i = 0; i < n; ++i) h[i] = enc(static_cast<float>((comm.rank() + i) % 7) * 0.5f);
      void* d = nullptr;
      ASSERT_EQ(cudaMalloc(&d, n * 2), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(d, h.data(), n * 2, cudaMemcpyHostToDevice), cudaSuccess);
      comm.allreduce(d, n, t, ReduceOp::kSum, nullptr);
      ASSERT_EQ(cudaMemcpy(h.data(), d, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
      for (size_t i = 0; i < n; ++i) {
        float want = 0;
        for (int r = 0; r < comm.size(); ++r) want += static_cast<float>((r + i) % 7) * 0.5f;
        ASSERT_EQ(dec(h[i]), want) << to_string(t) << " element " << i;
      }
      cudaFree(d);
    }
  });
}

TEST(StagedGpu, AbortMakesLaterOperationsThrow) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible (no GPU or no driver)";
  run_ranks(1, [](StagedGpuCommunicator& comm) {
    void* d = nullptr;
    ASSERT_EQ(cudaMalloc(&d, 64), cudaSuccess);
    comm.abort();
    EXPECT_THROW(comm.allreduce(d, 16, DataType::kFloat32, ReduceOp::kSum, nullptr), CommError);
    EXPECT_THROW(comm.broadcast(d, 64, 0, nullptr), CommError);
    cudaFree(d);
  });
}

}  // namespace
}  // namespace erun

#else

TEST(StagedGpu, NotBuilt) { GTEST_SKIP() << "erun was built without CUDA"; }

#endif
