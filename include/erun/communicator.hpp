// Communicator: CPU collectives among the ranks of one generation. Every
// operation is collective (all ranks call it, in the same order), in place
// unless stated, bounded by the collective timeout, and throws erun::CommError
// when a peer dies or the deadline passes; after a CommError the communicator
// is unusable and a new generation brings a new one. abort() may be called
// from any thread and makes blocked and later operations throw CommError.
// Ranks that make different calls at the same point (another operation, type,
// count, root or reduce op) get erun::CollectiveMismatch on every rank, naming
// the ranks and their calls, where the backend checks it (shared memory, and
// the shared-memory part of the hierarchical communicator); elsewhere the
// result is undefined. A mismatch leaves the communicator unusable too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "erun/errors.hpp"
#include "erun/export.hpp"

namespace erun {

enum class DataType { kFloat32, kFloat64, kInt32, kInt64, kUInt8, kFloat16, kBFloat16 };
enum class ReduceOp { kSum, kAverage, kMin, kMax, kProduct };

ERUN_API size_t data_type_size(DataType t);
ERUN_API const char* to_string(DataType t);
ERUN_API const char* to_string(ReduceOp op);

template <typename T> constexpr DataType data_type_of();
template <> constexpr DataType data_type_of<float>() { return DataType::kFloat32; }
template <> constexpr DataType data_type_of<double>() { return DataType::kFloat64; }
template <> constexpr DataType data_type_of<int32_t>() { return DataType::kInt32; }
template <> constexpr DataType data_type_of<int64_t>() { return DataType::kInt64; }
template <> constexpr DataType data_type_of<uint8_t>() { return DataType::kUInt8; }

class ERUN_API Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Elementwise reduction of `count` elements across ranks, result on every rank.
  virtual void allreduce(void* data, size_t count, DataType type, ReduceOp op) = 0;
  // `bytes` bytes from `root` to every rank.
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  // Every rank gives `bytes`; `out` receives size()*bytes, rank r's at r*bytes.
  virtual void allgather(const void* in, void* out, size_t bytes) = 0;
  // Every rank gives any number of bytes; returns all ranks' contributions by rank.
  virtual std::vector<std::vector<char>> allgatherv(const void* in, size_t bytes) = 0;
  // Elementwise reduction of `in` (counts[0] + ... + counts[size()-1]
  // elements; the same counts on every rank) across ranks, scattered: rank r
  // receives in `out` the counts[r] elements that start at counts[0] + ... +
  // counts[r-1] (ZeRO's and FSDP's gradient step: each rank gets the sum of
  // its own rows only). Integer average truncates, as allreduce's. This
  // implementation is an allreduce of a copy, for a backend with nothing
  // better; shared memory, TCP, MPI, Gloo and the hierarchical communicator
  // reduce only each rank's (or each host's) part.
  virtual void reduce_scatter(const void* in, void* out, const std::vector<size_t>& counts, DataType type,
                              ReduceOp op);
  virtual void barrier() = 0;
  virtual void abort() = 0;

  template <typename T>
  void allreduce(std::vector<T>& v, ReduceOp op) {
    allreduce(v.data(), v.size(), data_type_of<T>(), op);
  }
  template <typename T>
  T allreduce_value(T value, ReduceOp op) {
    allreduce(&value, 1, data_type_of<T>(), op);
    return value;
  }
};

}  // namespace erun
