// Elementwise reduction kernels of the CPU communicators: plain loops over
// fixed 16-element blocks that the compiler vectorises at -O2. Integer kSum and
// kProduct wrap around (computed in the unsigned type); kMin/kMax use
// std::min/std::max with the accumulator first. Pure functions, any thread.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "erun/communicator.hpp"

namespace erun::kernels {

template <typename T>
struct Unsigned {
  using type = T;
};
template <>
struct Unsigned<int32_t> {
  using type = uint32_t;
};
template <>
struct Unsigned<int64_t> {
  using type = uint64_t;
};
template <>
struct Unsigned<uint8_t> {
  using type = uint32_t;
};

template <typename T, ReduceOp OP>
inline T apply(T a, T b) {
  using U = typename Unsigned<T>::type;
  if constexpr (OP == ReduceOp::kSum || OP == ReduceOp::kAverage) {
    if constexpr (std::is_integral_v<T>) return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
    else return a + b;
  } else if constexpr (OP == ReduceOp::kProduct) {
    if constexpr (std::is_integral_v<T>) return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
    else return a * b;
  } else if constexpr (OP == ReduceOp::kMin) {
    return std::min(a, b);
  } else {
    return std::max(a, b);
  }
}

// The hot loops start at a fixed place in a cache line, so that their speed
// does not move with where the linker puts them (a loop that came to
// straddle two 64-byte blocks after an unrelated change ran ~5 % slower).
#define ERUN_HOT_LOOP __attribute__((aligned(64)))

// out[i] = a[i] OP b[i]; out may be a or b (same index), nothing else may overlap.
template <typename T, ReduceOp OP>
ERUN_HOT_LOOP void combine(T* out, const T* a, const T* b, size_t n) {
  constexpr size_t kBlock = 16;
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    T* o = out + i;
    const T* x = a + i;
    const T* y = b + i;
#pragma GCC ivdep
    for (size_t j = 0; j < kBlock; ++j) o[j] = apply<T, OP>(x[j], y[j]);
  }
  for (; i < n; ++i) out[i] = apply<T, OP>(a[i], b[i]);
}

// out[i] = copy[i] = a[i] OP b[i]; out may be a, copy may be a or b (same
// index), nothing else may overlap.
template <typename T, ReduceOp OP>
ERUN_HOT_LOOP void combine2(T* out, T* copy, const T* a, const T* b, size_t n) {
  constexpr size_t kBlock = 16;
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    T* o = out + i;
    T* c = copy + i;
    const T* x = a + i;
    const T* y = b + i;
    T t[kBlock];
#pragma GCC ivdep
    for (size_t j = 0; j < kBlock; ++j) t[j] = apply<T, OP>(x[j], y[j]);
#pragma GCC ivdep
    for (size_t j = 0; j < kBlock; ++j) o[j] = t[j];
#pragma GCC ivdep
    for (size_t j = 0; j < kBlock; ++j) c[j] = t[j];
  }
  for (; i < n; ++i) out[i] = copy[i] = apply<T, OP>(a[i], b[i]);
}

// Integer division truncates toward zero, as the Gloo communicator does.
template <typename T>
void divide(T* data, size_t n, int by) {
  const T d = static_cast<T>(by);
  constexpr size_t kBlock = 16;
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    T* o = data + i;
#pragma GCC ivdep
    for (size_t j = 0; j < kBlock; ++j) o[j] = static_cast<T>(o[j] / d);
  }
  for (; i < n; ++i) data[i] = static_cast<T>(data[i] / d);
}

// out = in[0] OP in[1] OP ... OP in[k-1], left to right; k >= 1.
template <typename T, ReduceOp OP>
void reduce_all(T* out, const T* const* in, size_t k, size_t n) {
  if (k == 1) {
    if (out != in[0]) std::copy(in[0], in[0] + n, out);
  } else {
    combine<T, OP>(out, in[0], in[1], n);
    for (size_t r = 2; r < k; ++r) combine<T, OP>(out, out, in[r], n);
  }
}

// As reduce_all, writing the result to `out` and to `copy` in the same pass;
// k >= 2; `copy` may be one of the inputs (same index), `out` none of them.
template <typename T, ReduceOp OP>
void reduce_all2(T* out, T* copy, const T* const* in, size_t k, size_t n) {
  if (k == 2) return combine2<T, OP>(out, copy, in[0], in[1], n);
  combine<T, OP>(out, in[0], in[1], n);
  for (size_t r = 2; r + 1 < k; ++r) combine<T, OP>(out, out, in[r], n);
  combine2<T, OP>(out, copy, out, in[k - 1], n);
}

// Calls f(static_cast<T*>(nullptr)) with the C++ type of `type`, for the
// types the CPU communicators reduce; float16/bfloat16 throw
// std::invalid_argument (they are GPU-only, through NCCL).
template <typename F>
decltype(auto) visit_cpu_type(DataType type, F&& f) {
  switch (type) {
    case DataType::kFloat32: return f(static_cast<float*>(nullptr));
    case DataType::kFloat64: return f(static_cast<double*>(nullptr));
    case DataType::kInt32: return f(static_cast<int32_t*>(nullptr));
    case DataType::kInt64: return f(static_cast<int64_t*>(nullptr));
    case DataType::kUInt8: return f(static_cast<uint8_t*>(nullptr));
    case DataType::kFloat16:
    case DataType::kBFloat16: break;
  }
  throw std::invalid_argument(std::string("erun: CPU allreduce does not support ") + to_string(type) +
                              "; convert to float32 or use the NCCL communicator for GPU buffers");
}

// Average's last step for a buffer of `type`: the sum over `by` ranks,
// divided by their number.
inline void divide(void* data, size_t n, DataType type, int by) {
  visit_cpu_type(type, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    divide(static_cast<T*>(data), n, by);
  });
}

}  // namespace erun::kernels
