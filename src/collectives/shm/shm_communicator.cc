#include "collectives/shm/shm_communicator.h"

#include "collectives/call_signature.h"
#include "collectives/shm/algorithms.h"
#include "common/check.h"

namespace erun {
namespace {

// The Communicator over shm::Segment: it owns the segment and the staging
// state, and runs an algorithm (algorithms.h) for every call.
class SegmentCommunicator final : public ShmCommunicator {
 public:
  SegmentCommunicator(KvStore& store, const ShmOptions& o) : segment_(store, o), w_{segment_} {}

  int rank() const override { return segment_.rank(); }
  int size() const override { return segment_.size(); }

  void allreduce(void* data, size_t count, DataType type, ReduceOp op) override {
    segment_.begin("allreduce", CallSignature::allreduce(count, type, op));
    shm::allreduce(w_, data, count, type, op);
  }

  void reduce_scatter(const void* in, void* out, const std::vector<size_t>& counts, DataType type,
                      ReduceOp op) override {
    if (counts.size() != static_cast<size_t>(size())) return Communicator::reduce_scatter(in, out, counts, type, op);
    size_t total = 0;
    for (size_t c : counts) total += c;
    segment_.begin("reduce_scatter", CallSignature::reduce_scatter(total, type, op));
    shm::reduce_scatter(w_, in, out, counts, type, op);
  }

  void broadcast(void* data, size_t bytes, int root) override {
    ERUN_CHECK(root >= 0 && root < size());
    segment_.begin("broadcast", CallSignature::broadcast(bytes, root));
    shm::broadcast(w_, static_cast<char*>(data), bytes, root);
  }

  void allgather(const void* in, void* out, size_t bytes) override {
    segment_.begin("allgather", CallSignature::allgather(bytes));
    shm::allgather(w_, "allgather", in, out, bytes);
  }

  std::vector<std::vector<char>> allgatherv(const void* in, size_t bytes) override {
    segment_.begin("allgatherv", CallSignature::allgatherv());
    return shm::allgatherv(w_, in, bytes);
  }

  void barrier() override {
    segment_.begin("barrier", CallSignature::barrier());
    if (size() > 1) segment_.sync("barrier");
  }

  void abort() override { segment_.abort(); }
  void set_outside(bool outside) override { segment_.set_outside(outside); }

 private:
  shm::Segment segment_;
  shm::Workspace w_;
};

}  // namespace

std::unique_ptr<ShmCommunicator> make_shm_communicator(KvStore& store, const ShmOptions& options) {
  return std::make_unique<SegmentCommunicator>(store, options);
}

}  // namespace erun
