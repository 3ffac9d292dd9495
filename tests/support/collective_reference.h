// Inputs and serial references for collective tests: rank r's element i is a
// small value, so sums and products are exact in every type and the result
// does not depend on the reduction order. Header-only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <type_traits>

#include "erun/communicator.hpp"

namespace erun::testing {

template <typename T>
T input(int rank, size_t i) {
  if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(0.5 * static_cast<double>((rank * 7 + i) % 5 + 1)) * ((i + rank) % 3 == 0 ? -1 : 1);
  } else if constexpr (std::is_signed_v<T>) {
    return static_cast<T>(static_cast<int>((rank * 7 + i) % 11) - 5);
  } else {
    return static_cast<T>((rank * 37 + i * 13) % 251);
  }
}

template <typename T>
T combine(T a, T b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage: return static_cast<T>(a + b);
    case ReduceOp::kProduct: return static_cast<T>(a * b);
    case ReduceOp::kMin: return std::min(a, b);
    case ReduceOp::kMax: return std::max(a, b);
  }
  return a;
}

// Element i of the allreduce of every rank's input over `size` ranks.
template <typename T>
T reference(int size, size_t i, ReduceOp op) {
  T acc = input<T>(0, i);
  for (int r = 1; r < size; ++r) acc = combine(acc, input<T>(r, i), op);
  if (op == ReduceOp::kAverage) acc = static_cast<T>(acc / static_cast<T>(size));
  return acc;
}

}  // namespace erun::testing
