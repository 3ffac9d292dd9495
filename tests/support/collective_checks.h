// Checks of one rank's side of a collective, run inside a rank's body
// (support/rank_threads.h): each makes the call with this rank's input and
// EXPECTs the result against the serial reference (collective_reference.h),
// naming the call, the size and the rank on failure. Header-only.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <thread>
#include <initializer_list>
#include <algorithm>
#include <vector>

#include "erun/communicator.hpp"
#include "support/collective_reference.h"

namespace erun::testing {

inline constexpr ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax,
                                       ReduceOp::kProduct};

// One allreduce of n elements of T against the reference.
template <typename T>
void check_allreduce_of(int rank, Communicator& comm, ReduceOp op, size_t n) {
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = input<T>(rank, i);
  comm.allreduce(v.data(), n, data_type_of<T>(), op);
  size_t bad = 0, first_bad = 0;
  for (size_t i = 0; i < n; ++i) {
    if (v[i] != reference<T>(comm.size(), i, op) && bad++ == 0) first_bad = i;
  }
  EXPECT_EQ(bad, 0u) << to_string(data_type_of<T>()) << " " << to_string(op) << " n=" << n << " size "
                     << comm.size() << " rank " << rank << ": first mismatch at " << first_bad << ": got "
                     << +(n ? v[first_bad] : T{}) << ", want " << +reference<T>(comm.size(), first_bad, op);
}

// Every op at every count whose buffer is at most max_bytes.
template <typename T>
void check_allreduce(int rank, Communicator& comm, std::initializer_list<size_t> counts,
                     size_t max_bytes = ~size_t{0}) {
  for (ReduceOp op : kAllOps) {
    for (size_t n : counts) {
      if (sizeof(T) * n <= max_bytes) check_allreduce_of<T>(rank, comm, op, n);
    }
  }
}

// float32, float64, int32, int64 and uint8.
inline void check_allreduce_every_cpu_type(int rank, Communicator& comm, std::initializer_list<size_t> counts,
                                           size_t max_bytes = ~size_t{0}) {
  check_allreduce<float>(rank, comm, counts, max_bytes);
  check_allreduce<double>(rank, comm, counts, max_bytes);
  check_allreduce<int32_t>(rank, comm, counts, max_bytes);
  check_allreduce<int64_t>(rank, comm, counts, max_bytes);
  check_allreduce<uint8_t>(rank, comm, counts, max_bytes);
}

// Reduce-scatter of `total` elements split over the ranks by `split`
// (even: total / size each, the first total % size one more; chunk: as
// torch.chunk, the last blocks short or empty; first: all on rank 0):
// rank r gets the reference of the elements of its block, every op.
template <typename T>
void check_reduce_scatter(int rank, Communicator& comm, std::initializer_list<size_t> totals) {
  const size_t n = static_cast<size_t>(comm.size());
  for (const char* split : {"even", "chunk", "first"}) {
    for (size_t total : totals) {
      std::vector<size_t> counts(n, 0);
      const size_t chunk = (total + n - 1) / n;
      for (size_t r = 0; r < n; ++r) {
        if (split[0] == 'e') counts[r] = total / n + (r < total % n ? 1 : 0);
        if (split[0] == 'c') counts[r] = std::min(chunk, total - std::min(total, r * chunk));
      }
      if (split[0] == 'f') counts[0] = total;
      size_t begin = 0;
      for (int r = 0; r < rank; ++r) begin += counts[static_cast<size_t>(r)];
      for (ReduceOp op : kAllOps) {
        std::vector<T> in(total), out(counts[static_cast<size_t>(rank)] + 1, T{7});
        for (size_t i = 0; i < total; ++i) in[i] = input<T>(rank, i);
        const std::vector<T> given = in;
        comm.reduce_scatter(in.data(), out.data(), counts, data_type_of<T>(), op);
        size_t bad = 0, first_bad = 0;
        for (size_t i = 0; i < counts[static_cast<size_t>(rank)]; ++i) {
          if (out[i] != reference<T>(comm.size(), begin + i, op) && bad++ == 0) first_bad = i;
        }
        EXPECT_EQ(bad, 0u) << "reduce_scatter " << to_string(data_type_of<T>()) << " " << to_string(op) << " "
                           << split << " total " << total << " rank " << rank << ": first mismatch at "
                           << begin + first_bad;
        EXPECT_EQ(out.back(), T{7}) << "reduce_scatter wrote past rank " << rank << "'s block";
        EXPECT_EQ(in, given) << "reduce_scatter changed its input on rank " << rank;
      }
    }
  }
}

// Broadcasts of each length from every root.
inline void check_broadcast_from_every_root(int rank, Communicator& comm, std::initializer_list<size_t> lengths) {
  for (int root = 0; root < comm.size(); ++root) {
    for (size_t n : lengths) {
      std::vector<char> buf(n);
      for (size_t i = 0; i < n; ++i) buf[i] = static_cast<char>(rank == root ? (i * 3 + root) : 0x55);
      comm.broadcast(buf.data(), n, root);
      size_t bad = 0;
      for (size_t i = 0; i < n; ++i) bad += buf[i] != static_cast<char>(i * 3 + root);
      EXPECT_EQ(bad, 0u) << "broadcast root " << root << " n " << n << " rank " << rank;
    }
  }
}

// Allgathers of each length: rank r's bytes at r * length.
inline void check_allgather(int rank, Communicator& comm, std::initializer_list<size_t> lengths) {
  for (size_t n : lengths) {
    std::vector<char> in(n), out(n * comm.size(), 0x7f);
    for (size_t i = 0; i < n; ++i) in[i] = static_cast<char>(rank * 31 + i);
    comm.allgather(in.data(), out.data(), n);
    size_t bad = 0;
    for (size_t i = 0; i < out.size(); ++i) bad += out[i] != static_cast<char>((i / n) * 31 + i % n);
    EXPECT_EQ(bad, 0u) << "allgather n " << n << " rank " << rank;
  }
}

// Rounds of allgatherv: rank r gives bytes_of(r, round) bytes (any of them
// may be zero); every rank gets each rank's bytes.
template <typename BytesOf>
void check_allgatherv(int rank, Communicator& comm, int rounds, BytesOf bytes_of) {
  for (int round = 0; round < rounds; ++round) {
    std::vector<char> in(bytes_of(rank, round));
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<char>(rank + 5 * i + round);
    auto all = comm.allgatherv(in.data(), in.size());
    ASSERT_EQ(all.size(), static_cast<size_t>(comm.size())) << "allgatherv round " << round << " rank " << rank;
    for (int r = 0; r < comm.size(); ++r) {
      ASSERT_EQ(all[r].size(), bytes_of(r, round)) << "allgatherv round " << round << " rank " << rank
                                                   << ": bytes from rank " << r;
      size_t bad = 0;
      for (size_t i = 0; i < all[r].size(); ++i) bad += all[r][i] != static_cast<char>(r + 5 * i + round);
      EXPECT_EQ(bad, 0u) << "allgatherv round " << round << " rank " << rank << ": bytes from rank " << r;
    }
  }
}

// Allgatherv contributions of rank r in rounds 0 to 3: uneven with rank 0
// giving nothing; nobody giving anything; every other rank giving nothing;
// all different and small.
inline size_t uneven_bytes(int r, int round) {
  switch (round) {
    case 0: return r * 3;
    case 1: return 0;
    case 2: return r % 2 ? 0 : 1000 + r;
    default: return (r + 1) * 7;
  }
}

// float16 and bfloat16 allreduces are std::invalid_argument on the CPU
// backends, for every op, and leave the communicator usable.
inline void check_half_precision_rejected(Communicator& comm) {
  for (DataType t : {DataType::kFloat16, DataType::kBFloat16}) {
    for (ReduceOp op : kAllOps) {
      uint16_t v[3] = {0, 0, 0};
      EXPECT_THROW(comm.allreduce(v, 3, t, op), std::invalid_argument) << to_string(t) << " " << to_string(op);
      comm.barrier();  // still usable
    }
  }
}

// Rounds of barrier, one rank late in each: nobody leaves a barrier before
// every rank has counted itself into `arrived` (shared by the ranks, from 0).
inline void check_barrier(int rank, Communicator& comm, std::atomic<int>& arrived, int rounds) {
  for (int round = 1; round <= rounds; ++round) {
    if (rank == round % comm.size()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    arrived++;
    comm.barrier();
    EXPECT_GE(arrived.load(), round * comm.size()) << "barrier round " << round << " rank " << rank;
    comm.barrier();  // nobody starts the next round before everyone checked
  }
}

}  // namespace erun::testing
