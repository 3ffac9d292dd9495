#include "erun/communicator.hpp"

#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>

#include "common/check.h"

namespace erun {

void Communicator::reduce_scatter(const void* in, void* out, const std::vector<size_t>& counts, DataType type,
                                  ReduceOp op) {
  if (counts.size() != static_cast<size_t>(size())) {
    throw std::invalid_argument("erun: reduce_scatter got " + std::to_string(counts.size()) +
                                " counts for a world of " + std::to_string(size()) + " ranks (one per rank)");
  }
  const size_t elem = data_type_size(type);
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  const size_t before = std::accumulate(counts.begin(), counts.begin() + rank(), size_t{0});
  std::vector<char> all(total * elem);
  if (total != 0) std::memcpy(all.data(), in, total * elem);
  allreduce(all.data(), total, type, op);
  const size_t mine = counts[static_cast<size_t>(rank())] * elem;
  if (mine != 0) std::memcpy(out, all.data() + before * elem, mine);
}

size_t data_type_size(DataType t) {
  switch (t) {
    case DataType::kFloat32: return 4;
    case DataType::kFloat64: return 8;
    case DataType::kInt32: return 4;
    case DataType::kInt64: return 8;
    case DataType::kUInt8: return 1;
    case DataType::kFloat16: return 2;
    case DataType::kBFloat16: return 2;
  }
  ERUN_CHECK(false);
  return 0;
}

const char* to_string(DataType t) {
  switch (t) {
    case DataType::kFloat32: return "float32";
    case DataType::kFloat64: return "float64";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
    case DataType::kUInt8: return "uint8";
    case DataType::kFloat16: return "float16";
    case DataType::kBFloat16: return "bfloat16";
  }
  return "?";
}

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAverage: return "average";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kProduct: return "product";
  }
  return "?";
}

}  // namespace erun
