// TimedCommunicator: forwards every collective to the generation's
// communicator and adds the time spent inside it to a counter the worker's
// context reads at each commit (docs/design.md, "Stragglers"): a rank's
// commit interval splits into computing (outside) and waiting (inside). Two
// clock reads per collective; nothing else changes.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "erun/communicator.hpp"

namespace erun::worker {

class TimedCommunicator final : public Communicator {
 public:
  TimedCommunicator(std::unique_ptr<Communicator> inner, std::atomic<int64_t>* wait_ns)
      : inner_(std::move(inner)), wait_ns_(wait_ns) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  void allreduce(void* data, size_t count, DataType type, ReduceOp op) override {
    Timed t(wait_ns_);
    inner_->allreduce(data, count, type, op);
  }
  void reduce_scatter(const void* in, void* out, const std::vector<size_t>& counts, DataType type,
                      ReduceOp op) override {
    Timed t(wait_ns_);
    inner_->reduce_scatter(in, out, counts, type, op);
  }
  void broadcast(void* data, size_t bytes, int root) override {
    Timed t(wait_ns_);
    inner_->broadcast(data, bytes, root);
  }
  void allgather(const void* in, void* out, size_t bytes) override {
    Timed t(wait_ns_);
    inner_->allgather(in, out, bytes);
  }
  std::vector<std::vector<char>> allgatherv(const void* in, size_t bytes) override {
    Timed t(wait_ns_);
    return inner_->allgatherv(in, bytes);
  }
  void barrier() override {
    Timed t(wait_ns_);
    inner_->barrier();
  }
  void abort() override { inner_->abort(); }

 private:
  // Adds its lifetime to the counter, also when the collective throws.
  struct Timed {
    explicit Timed(std::atomic<int64_t>* sum) : sum_(sum), start_(std::chrono::steady_clock::now()) {}
    ~Timed() {
      sum_->fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start_)
                          .count(),
                      std::memory_order_relaxed);
    }
    std::atomic<int64_t>* sum_;
    std::chrono::steady_clock::time_point start_;
  };
  std::unique_ptr<Communicator> inner_;
  std::atomic<int64_t>* wait_ns_;
};

}  // namespace erun::worker
