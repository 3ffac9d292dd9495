// Conformance: every collective of the Communicator interface, on every
// DataType and ReduceOp, against every backend (shm, tcp, gloo, hierarchical;
// staged over tcp when built with CUDA and a device is visible; tcp also with
// one rank), with ranks as
// threads (support/rank_threads.h) and the serial reference of
// support/collective_reference.h. Allreduce at 0, 1, an odd count, a medium
// count and one past the backends' direct/one-step thresholds; broadcast from
// every root; allgather; allgatherv with uneven and empty contributions;
// reduce_scatter over even, torch.chunk and one-rank splits; barrier. Integer sum/product wrap and integer average truncates toward zero
// (as every CPU backend defines them); float16/bfloat16 are std::invalid_argument
// on the CPU backends and leave the communicator usable.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <string>
#include <initializer_list>
#include <vector>

#include "support/collective_checks.h"
#include "support/rank_threads.h"

namespace erun {
namespace {

using namespace std::chrono_literals;
using testing::Backend;
using testing::input;
using testing::reference;
using testing::run_comms;
using testing::RunOptions;

// Empty, one element, an odd count, a direct/one-step count, and one past the
// direct thresholds (tcp: 128 KiB; shm: 32 KiB and step_bytes / 2; the
// hierarchical pipeline's 1 MiB for 4- and 8-byte types).
constexpr std::initializer_list<size_t> kCounts = {0, 1, 7, 1001, 300007};
// Bytes: empty, one, odd, and past the direct broadcast/gather thresholds.
constexpr std::initializer_list<size_t> kLengths = {0, 1, 1001, 300001};

struct Case {
  Backend backend;
  int size;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.backend.name << " world " << c.size; }

std::vector<Case> cases() {
  return {{testing::shm_backend(), 2},  {testing::shm_backend(), 3},    {testing::tcp_backend(), 1},
          {testing::tcp_backend(), 2},  {testing::tcp_backend(), 3},    {testing::gloo_backend(), 2},
          {testing::gloo_backend(), 3},
          {testing::hier_backend(), 3}, {testing::hier_backend(), 4},   {testing::staged_backend(), 2},
          {testing::staged_backend(), 3}};
}

class Conformance : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (GetParam().backend.unavailable) {
      if (std::string why = GetParam().backend.unavailable(); !why.empty()) GTEST_SKIP() << why;
    }
  }
  const Backend& backend() const { return GetParam().backend; }
  int size() const { return GetParam().size; }
  void run(const std::function<void(int, Communicator&)>& fn) {
    RunOptions o;
    o.deadline = 60s;
    run_comms(backend(), size(), fn, o);
  }

  template <typename T>
  void check_allreduce() {
    run([&](int rank, Communicator& comm) { testing::check_allreduce<T>(rank, comm, kCounts); });
  }
};

TEST_P(Conformance, AllreduceFloat32) { check_allreduce<float>(); }
TEST_P(Conformance, AllreduceFloat64) { check_allreduce<double>(); }
TEST_P(Conformance, AllreduceInt32) { check_allreduce<int32_t>(); }
TEST_P(Conformance, AllreduceInt64) { check_allreduce<int64_t>(); }
TEST_P(Conformance, AllreduceUInt8) { check_allreduce<uint8_t>(); }

#if ERUN_HAVE_CUDA
float decode16(DataType t, uint16_t v) { return t == DataType::kFloat16 ? half_to_float(v) : bf16_to_float(v); }
uint16_t encode16(DataType t, float f) { return t == DataType::kFloat16 ? float_to_half(f) : float_to_bf16(f); }
#endif

TEST_P(Conformance, AllreduceHalfPrecision) {
  run([&](int rank, Communicator& comm) {
    if (!backend().half_precision) {
      testing::check_half_precision_rejected(comm);
      return;
    }
#if ERUN_HAVE_CUDA
    for (DataType t : {DataType::kFloat16, DataType::kBFloat16}) {
      for (ReduceOp op : testing::kAllOps) {
        for (size_t n : kCounts) {
          std::vector<uint16_t> v(n);
          for (size_t i = 0; i < n; ++i) v[i] = encode16(t, input<float>(rank, i));
          comm.allreduce(v.data(), n, t, op);
          // Reduced in float32 and rounded once: within half an ulp of the exact result.
          const double tol = t == DataType::kFloat16 ? 2e-3 : 1e-2;
          size_t bad = 0, first_bad = 0;
          for (size_t i = 0; i < n; ++i) {
            double want = reference<double>(comm.size(), i, op);
            if (std::abs(decode16(t, v[i]) - want) > tol * std::max(1.0, std::abs(want)) && bad++ == 0) first_bad = i;
          }
          EXPECT_EQ(bad, 0u) << backend().name << " " << to_string(t) << " " << to_string(op) << " n=" << n
                             << " rank " << rank << ": first mismatch at " << first_bad;
        }
      }
    }
#endif
  });
}

// Inexact float inputs, 5 MiB (tcp's ring with the sender thread, the
// hierarchical pipeline, shm's multi-step path): every rank ends with the same
// bits, close to the exact sum.
TEST_P(Conformance, LargeFloatSumIsBitwiseEqualOnEveryRank) {
  if (!backend().bitwise_equal) GTEST_SKIP() << backend().name << " does not promise bitwise-equal results";
  const size_t n = (5u << 20) / sizeof(float) + 3;
  std::vector<std::vector<float>> results(size());
  run([&](int rank, Communicator& comm) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>((i % 1024) * (rank + 1)) * 0.1f;
    comm.allreduce(v, ReduceOp::kSum);
    results[rank] = std::move(v);
  });
  for (int r = 1; r < size(); ++r) {
    ASSERT_EQ(results[r].size(), n);
    EXPECT_EQ(std::memcmp(results[0].data(), results[r].data(), n * sizeof(float)), 0) << "rank " << r;
  }
  const int s = size();
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    bad += std::abs(results[0][i] - static_cast<float>(i % 1024) * 0.1f * s * (s + 1) / 2) > 1e-2f * (i % 1024 + 1);
  }
  EXPECT_EQ(bad, 0u);
}

// Every split (even, torch.chunk, all on one rank) at every op and type,
// past the shm step and the direct thresholds (tcp with 2 ranks: its ring);
// the input stays as it was.
TEST_P(Conformance, ReduceScatterGivesEachRankItsBlock) {
  run([&](int rank, Communicator& comm) {
    testing::check_reduce_scatter<float>(rank, comm, {0, 1, 7, 1001, 300007});
    testing::check_reduce_scatter<double>(rank, comm, {7, 300007});
    testing::check_reduce_scatter<int32_t>(rank, comm, {1001, 300007});
    testing::check_reduce_scatter<int64_t>(rank, comm, {5, 300007});
    testing::check_reduce_scatter<uint8_t>(rank, comm, {1001, 300007});
  });
}

TEST_P(Conformance, ReduceScatterWithWrongCountsIsRefusedByName) {
  run([&](int, Communicator& comm) {
    const size_t wrong = static_cast<size_t>(comm.size()) + 1;
    std::vector<float> in(wrong), out(wrong);
    try {
      comm.reduce_scatter(in.data(), out.data(), std::vector<size_t>(wrong, 1), DataType::kFloat32, ReduceOp::kSum);
      ADD_FAILURE() << wrong << " counts for a world of " << comm.size() << " were taken";
    } catch (const std::invalid_argument& e) {
      const std::string want = "reduce_scatter got " + std::to_string(wrong) + " counts";
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
    comm.barrier();  // still usable
  });
}

TEST_P(Conformance, BroadcastFromEveryRoot) {
  run([&](int rank, Communicator& comm) { testing::check_broadcast_from_every_root(rank, comm, kLengths); });
}

TEST_P(Conformance, AllgatherPlacesEachRankAtItsOffset) {
  run([&](int rank, Communicator& comm) { testing::check_allgather(rank, comm, kLengths); });
}

TEST_P(Conformance, AllgathervUnevenAndEmptyContributions) {
  // Round 0: uneven (rank 0 gives nothing); 1: only the last rank gives;
  // 2: nobody gives; 3: only rank 0 gives, past the direct thresholds.
  const int n = size();
  run([&](int rank, Communicator& comm) {
    testing::check_allgatherv(rank, comm, 4, [n](int r, int round) -> size_t {
      switch (round) {
        case 0: return r * 1000 + (r % 2) * 70000;
        case 1: return r == n - 1 ? 13 : 0;
        case 2: return 0;
        default: return r == 0 ? 300001 : 0;
      }
    });
  });
}

TEST_P(Conformance, BarrierWaitsForEveryRank) {
  std::atomic<int> arrived{0};
  run([&](int rank, Communicator& comm) { testing::check_barrier(rank, comm, arrived, 5); });
}

INSTANTIATE_TEST_SUITE_P(Backends, Conformance, ::testing::ValuesIn(cases()), [](const auto& info) {
  return info.param.backend.name + "_world" + std::to_string(info.param.size);
});

}  // namespace
}  // namespace erun
