#include "collectives/mpi/mpi_communicator.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

#include "common/check.h"

namespace erun {
namespace {

// MPI counts are int: big buffers go in pieces of at most this many elements.
constexpr size_t kMaxChunk = size_t{1} << 30;

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return fmt::format("MPI error {}", code);
  return std::string(text, static_cast<size_t>(len));
}

MPI_Datatype mpi_type(DataType t) {
  switch (t) {
    case DataType::kFloat32: return MPI_FLOAT;
    case DataType::kFloat64: return MPI_DOUBLE;
    case DataType::kInt32: return MPI_INT32_T;
    case DataType::kInt64: return MPI_INT64_T;
    case DataType::kUInt8: return MPI_UINT8_T;
    case DataType::kFloat16:
    case DataType::kBFloat16:
      throw std::invalid_argument(std::string("erun: CPU allreduce does not support ") + to_string(t) +
                                  "; convert to float32 or use the NCCL communicator for GPU buffers");
  }
  ERUN_CHECK(false);
  return MPI_DATATYPE_NULL;
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage: return MPI_SUM;
    case ReduceOp::kMin: return MPI_MIN;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kProduct: return MPI_PROD;
  }
  ERUN_CHECK(false);
  return MPI_OP_NULL;
}

// Open MPI 4.1's vectorised MPI_SUM on MPI_UINT8_T saturates at 255; uint8
// sums here wrap around (modulo 256) like the Gloo communicator's.
void wrapping_uint8_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const uint8_t*>(in);
  auto* b = static_cast<uint8_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = static_cast<uint8_t>(a[i] + b[i]);
}

template <typename T>
void divide(void* data, size_t count, int by) {
  auto* p = static_cast<T*>(data);
  for (size_t i = 0; i < count; ++i) p[i] = static_cast<T>(p[i] / static_cast<T>(by));
}

void divide(DataType t, void* data, size_t count, int by) {
  switch (t) {
    case DataType::kFloat32: return divide<float>(data, count, by);
    case DataType::kFloat64: return divide<double>(data, count, by);
    case DataType::kInt32: return divide<int32_t>(data, count, by);
    case DataType::kInt64: return divide<int64_t>(data, count, by);
    case DataType::kUInt8: return divide<uint8_t>(data, count, by);
    default: ERUN_CHECK(false);
  }
}

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm parent) {
    int rc = MPI_Comm_dup(parent, &comm_);
    if (rc != MPI_SUCCESS) throw CommError("erun: MPI_Comm_dup failed: " + mpi_error_text(rc));
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Op_create(&wrapping_uint8_sum, /*commute=*/1, &uint8_sum_);
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (uint8_sum_ != MPI_OP_NULL) MPI_Op_free(&uint8_sum_);
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void allreduce(void* data, size_t count, DataType type, ReduceOp op) override {
    MPI_Datatype t = mpi_type(type);
    usable("allreduce");
    MPI_Op o = mpi_op(op);
    if (type == DataType::kUInt8 && o == MPI_SUM) o = uint8_sum_;
    const size_t elem = data_type_size(type);
    auto* p = static_cast<char*>(data);
    for (size_t off = 0; off < count; off += kMaxChunk) {
      int n = static_cast<int>(std::min(kMaxChunk, count - off));
      check("allreduce", MPI_Allreduce(MPI_IN_PLACE, p + off * elem, n, t, o, comm_));
    }
    if (op == ReduceOp::kAverage) divide(type, data, count, size_);
  }

  // MPI_Reduce_scatter where the counts fit its ints, else the allreduce of a copy.
  void reduce_scatter(const void* in, void* out, const std::vector<size_t>& counts, DataType type,
                      ReduceOp op) override {
    size_t total = 0;
    for (size_t c : counts) total += c;
    if (counts.size() != static_cast<size_t>(size_) || total > kMaxChunk) {
      return Communicator::reduce_scatter(in, out, counts, type, op);
    }
    MPI_Datatype t = mpi_type(type);
    usable("reduce_scatter");
    MPI_Op o = mpi_op(op);
    if (type == DataType::kUInt8 && o == MPI_SUM) o = uint8_sum_;
    std::vector<int> n(counts.begin(), counts.end());
    // MPI reads the whole input and writes counts[rank] elements; an empty
    // world-wide call still synchronises, as the other backends do.
    check("reduce_scatter", MPI_Reduce_scatter(total ? in : nullptr, out, n.data(), t, o, comm_));
    if (op == ReduceOp::kAverage) divide(type, out, counts[static_cast<size_t>(rank_)], size_);
  }

  void broadcast(void* data, size_t bytes, int root) override {
    ERUN_CHECK(root >= 0 && root < size_);
    usable("broadcast");
    auto* p = static_cast<char*>(data);
    for (size_t off = 0; off < bytes; off += kMaxChunk) {
      int n = static_cast<int>(std::min(kMaxChunk, bytes - off));
      check("broadcast", MPI_Bcast(p + off, n, MPI_BYTE, root, comm_));
    }
  }

  void allgather(const void* in, void* out, size_t bytes) override {
    usable("allgather");
    if (bytes * static_cast<size_t>(size_) <= kMaxChunk) {
      check("allgather", MPI_Allgather(in, static_cast<int>(bytes), MPI_BYTE, out, static_cast<int>(bytes),
                                       MPI_BYTE, comm_));
      return;
    }
    auto* o = static_cast<char*>(out);
    std::memcpy(o + static_cast<size_t>(rank_) * bytes, in, bytes);
    for (int r = 0; r < size_; ++r) broadcast(o + static_cast<size_t>(r) * bytes, bytes, r);
  }

  std::vector<std::vector<char>> allgatherv(const void* in, size_t bytes) override {
    usable("allgatherv");
    std::vector<uint64_t> sizes(static_cast<size_t>(size_));
    uint64_t mine = bytes;
    check("allgatherv", MPI_Allgather(&mine, 1, MPI_UINT64_T, sizes.data(), 1, MPI_UINT64_T, comm_));
    std::vector<std::vector<char>> out(static_cast<size_t>(size_));
    uint64_t total = 0;
    for (int r = 0; r < size_; ++r) {
      out[static_cast<size_t>(r)].resize(sizes[static_cast<size_t>(r)]);
      total += sizes[static_cast<size_t>(r)];
    }
    if (total <= kMaxChunk) {
      std::vector<int> counts(static_cast<size_t>(size_)), displs(static_cast<size_t>(size_));
      int at = 0;
      for (size_t r = 0; r < counts.size(); ++r) {
        counts[r] = static_cast<int>(sizes[r]);
        displs[r] = at;
        at += counts[r];
      }
      std::vector<char> all(static_cast<size_t>(total));
      check("allgatherv", MPI_Allgatherv(in, static_cast<int>(bytes), MPI_BYTE, all.data(), counts.data(),
                                         displs.data(), MPI_BYTE, comm_));
      for (size_t r = 0; r < out.size(); ++r) {
        std::copy(all.begin() + displs[r], all.begin() + displs[r] + counts[r], out[r].begin());
      }
      return out;
    }
    std::memcpy(out[static_cast<size_t>(rank_)].data(), in, bytes);
    for (int r = 0; r < size_; ++r) broadcast(out[static_cast<size_t>(r)].data(), out[static_cast<size_t>(r)].size(), r);
    return out;
  }

  void barrier() override {
    usable("barrier");
    check("barrier", MPI_Barrier(comm_));
  }

  void abort() override { aborted_ = true; }

 private:
  void usable(const char* what) {
    if (aborted_) fail(what, "the communicator was aborted");
    if (broken_) fail(what, "an earlier operation failed");
  }
  void check(const char* what, int rc) {
    if (rc == MPI_SUCCESS) return;
    broken_ = true;
    fail(what, mpi_error_text(rc));
  }
  [[noreturn]] void fail(const char* what, const std::string& cause) {
    throw CommError(fmt::format("erun: MPI {} failed on rank {} of {}: {}; MPI jobs are not elastic, so the job "
                                "ends (restart it, or run it under erun for fault tolerance)",
                                what, rank_, size_, cause));
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Op uint8_sum_ = MPI_OP_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::atomic<bool> aborted_{false};
  bool broken_ = false;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm) {
  return std::make_unique<MpiCommunicator>(comm);
}

MpiBroadcastStore::MpiBroadcastStore(MPI_Comm comm, int root) : root_(root) {
  int rc = MPI_Comm_dup(comm, &comm_);
  if (rc != MPI_SUCCESS) throw CommError("erun: MPI_Comm_dup failed: " + mpi_error_text(rc));
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
}

MpiBroadcastStore::~MpiBroadcastStore() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void MpiBroadcastStore::set(const std::string& key, const std::vector<char>& value) {
  ERUN_CHECK(rank_ == root_);  // a bug: only the root publishes
  exchange(key, &value);
}

std::vector<char> MpiBroadcastStore::get(const std::string& key, Duration) {
  if (auto it = seen_.find(key); it != seen_.end() && rank_ == root_) return it->second;
  return exchange(key, nullptr);
}

bool MpiBroadcastStore::check(const std::vector<std::string>& keys) {
  return std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return seen_.count(k) > 0; });
}

// One broadcast of [key size, value size] and then key + value from the root;
// a receiver that asked for another key has called out of order (CommError).
std::vector<char> MpiBroadcastStore::exchange(const std::string& key, const std::vector<char>* value) {
  uint64_t header[2] = {key.size(), value ? value->size() : 0};
  auto fail = [&](const std::string& cause) -> CommError {
    return CommError(fmt::format("erun: MPI store key '{}': {}", key, cause));
  };
  if (int rc = MPI_Bcast(header, 2, MPI_UINT64_T, root_, comm_); rc != MPI_SUCCESS) throw fail(mpi_error_text(rc));
  if (header[0] + header[1] > kMaxChunk) throw fail("the value is too large for one broadcast");
  std::vector<char> buf(header[0] + header[1]);
  if (value) {
    std::copy(key.begin(), key.end(), buf.begin());
    std::copy(value->begin(), value->end(), buf.begin() + static_cast<long>(key.size()));
  }
  if (int rc = MPI_Bcast(buf.data(), static_cast<int>(buf.size()), MPI_BYTE, root_, comm_); rc != MPI_SUCCESS) {
    throw fail(mpi_error_text(rc));
  }
  std::string got(buf.begin(), buf.begin() + static_cast<long>(header[0]));
  if (got != key) throw fail(fmt::format("rank {} published '{}' instead: ranks asked for keys in different orders", root_, got));
  std::vector<char> out(buf.begin() + static_cast<long>(header[0]), buf.end());
  seen_[key] = out;
  return out;
}

}  // namespace erun
