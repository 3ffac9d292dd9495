// Test-only world for the State tests: N ranks run as threads of one process.
// FakeHub plays both the driver (generations, re-join) and the network
// (collectives through shared memory, each with a 30 s deadline). Failure
// injection: fail_at(slot, op) makes that slot's op-th collective of the
// generation throw CommError and breaks the generation, so every rank's
// pending and later ops throw too; kill(slot) breaks it and drops the slot from
// the next generation; set_host_update(slot[, drain]) raises one slot's pending
// flag (a host that drains, with drain).
// All methods are thread-safe. Header-only.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "erun/erun.hpp"

namespace erun::testing {

inline constexpr std::chrono::seconds kFakeDeadline{30};

class FakeHub {
 public:
  explicit FakeHub(int slots) {
    for (int s = 0; s < slots; ++s) add_slot_locked(/*member=*/true);
  }

  // A new slot that joins at the next generation (its thread calls rejoin(0) first).
  int add_slot() {
    std::lock_guard<std::mutex> lk(mu_);
    return add_slot_locked(/*member=*/false);
  }

  int rank_of(int slot) const {
    std::lock_guard<std::mutex> lk(mu_);
    return rank_of_locked(slot);
  }
  int size() const {
    std::lock_guard<std::mutex> lk(mu_);
    return static_cast<int>(members_.size());
  }
  long generation() const {
    std::lock_guard<std::mutex> lk(mu_);
    return gen_;
  }
  uint64_t last_commit(int slot) const {
    std::lock_guard<std::mutex> lk(mu_);
    return last_commit_[static_cast<size_t>(slot)];
  }
  int rejoins(int slot) const {
    std::lock_guard<std::mutex> lk(mu_);
    return rejoins_[static_cast<size_t>(slot)];
  }

  void fail_at(int slot, int op) {
    std::lock_guard<std::mutex> lk(mu_);
    fail_at_[slot] = op;
  }
  void kill(int slot) {
    std::lock_guard<std::mutex> lk(mu_);
    alive_[static_cast<size_t>(slot)] = false;
    broken_ = true;
    cv_.notify_all();
    // The others may be waiting for it to re-join.
    if (!joining_.empty()) form_if_all_joined_locked();
  }
  void break_generation() {
    std::lock_guard<std::mutex> lk(mu_);
    broken_ = true;
    cv_.notify_all();
  }
  void set_host_update(int slot, bool drain = false) {
    std::lock_guard<std::mutex> lk(mu_);
    host_update_[static_cast<size_t>(slot)] = true;
    if (drain) drain_[static_cast<size_t>(slot)] = true;
  }
  bool drain(int slot) const {
    std::lock_guard<std::mutex> lk(mu_);
    return drain_[static_cast<size_t>(slot)];
  }
  bool host_update(int slot) const {
    std::lock_guard<std::mutex> lk(mu_);
    return host_update_[static_cast<size_t>(slot)];
  }
  // Collective ops completed by `slot` in the current generation.
  int ops(int slot) const {
    std::lock_guard<std::mutex> lk(mu_);
    return ops_[static_cast<size_t>(slot)];
  }

  // Every member contributes `bytes`; returns all contributions by rank.
  std::vector<std::vector<char>> exchange(int slot, const void* data, size_t bytes) {
    std::unique_lock<std::mutex> lk(mu_);
    const long gen = gen_;
    const int rank = rank_of_locked(slot);
    if (rank < 0) throw CommError("fake: slot " + std::to_string(slot) + " is not a member");
    if (broken_) throw CommError("fake: generation " + std::to_string(gen) + " is broken");
    const int op = ops_[static_cast<size_t>(slot)]++;
    auto f = fail_at_.find(slot);
    if (f != fail_at_.end() && f->second == op) {
      fail_at_.erase(f);
      broken_ = true;
      cv_.notify_all();
      throw CommError("fake: injected failure at op " + std::to_string(op) + " of slot " +
                      std::to_string(slot));
    }
    const int n = static_cast<int>(members_.size());
    Round& r = rounds_[op];
    if (r.data.empty()) r.data.resize(static_cast<size_t>(n));
    const char* p = static_cast<const char*>(data);
    r.data[static_cast<size_t>(rank)].assign(p, p + bytes);
    ++r.arrived;
    cv_.notify_all();
    bool done = cv_.wait_for(lk, kFakeDeadline,
                             [&] { return broken_ || gen_ != gen || r.arrived == n; });
    if (!done) {
      broken_ = true;
      cv_.notify_all();
      throw CommError("fake: collective timed out");
    }
    if (gen_ != gen || r.arrived != n) throw CommError("fake: peer failed during a collective");
    std::vector<std::vector<char>> out = r.data;
    if (++r.left == n) rounds_.erase(op);
    return out;
  }

  // Blocks until every live slot has called rejoin; then the next generation
  // holds the live slots in slot order.
  void rejoin(int slot, uint64_t commit_id) {
    std::unique_lock<std::mutex> lk(mu_);
    last_commit_[static_cast<size_t>(slot)] = commit_id;
    ++rejoins_[static_cast<size_t>(slot)];
    joining_.insert(slot);
    const long gen = gen_;
    if (form_if_all_joined_locked()) return;
    if (!cv_.wait_for(lk, kFakeDeadline, [&] { return gen_ != gen; })) {
      throw Error("fake: re-join timed out");
    }
  }

 private:
  // The next generation, once every live slot called rejoin.
  bool form_if_all_joined_locked() {
    std::set<int> live;
    for (size_t s = 0; s < alive_.size(); ++s) {
      if (alive_[s]) live.insert(static_cast<int>(s));
    }
    if (joining_ != live) return false;
    members_.assign(live.begin(), live.end());
    ++gen_;
    broken_ = false;
    std::fill(ops_.begin(), ops_.end(), 0);
    rounds_.clear();
    joining_.clear();
    std::fill(host_update_.begin(), host_update_.end(), false);
    std::fill(drain_.begin(), drain_.end(), false);
    cv_.notify_all();
    return true;
  }
  struct Round {
    std::vector<std::vector<char>> data;
    int arrived = 0;
    int left = 0;
  };
  int add_slot_locked(bool member) {
    int s = static_cast<int>(alive_.size());
    alive_.push_back(true);
    ops_.push_back(0);
    last_commit_.push_back(0);
    rejoins_.push_back(0);
    host_update_.push_back(false);
    drain_.push_back(false);
    if (member) members_.push_back(s);
    return s;
  }
  int rank_of_locked(int slot) const {
    for (size_t r = 0; r < members_.size(); ++r) {
      if (members_[r] == slot) return static_cast<int>(r);
    }
    return -1;
  }

  mutable std::mutex mu_;
  std::condition_variable cv_;
  long gen_ = 1;
  bool broken_ = false;
  std::vector<int> members_;
  std::vector<bool> alive_;
  std::vector<int> ops_;
  std::vector<uint64_t> last_commit_;
  std::vector<int> rejoins_;
  std::vector<bool> host_update_;
  std::vector<bool> drain_;  // the pending update is a host that drains
  std::map<int, int> fail_at_;
  std::map<int, Round> rounds_;
  std::set<int> joining_;
};

class FakeComm : public Communicator {
 public:
  FakeComm(FakeHub* hub, int slot) : hub_(hub), slot_(slot) {}
  void attach(FakeHub* hub, int slot) {
    hub_ = hub;
    slot_ = slot;
  }
  int rank() const override { return hub_->rank_of(slot_); }
  int size() const override { return hub_->size(); }

  void allreduce(void* data, size_t count, DataType type, ReduceOp op) override {
    const size_t bytes = count * data_type_size(type);
    auto all = hub_->exchange(slot_, data, bytes);
    switch (type) {
      case DataType::kFloat32: reduce<float>(all, data, count, op); break;
      case DataType::kFloat64: reduce<double>(all, data, count, op); break;
      case DataType::kInt32: reduce<int32_t>(all, data, count, op); break;
      case DataType::kInt64: reduce<int64_t>(all, data, count, op); break;
      case DataType::kUInt8: reduce<uint8_t>(all, data, count, op); break;
      default: throw Error("fake: unsupported data type");
    }
  }
  void broadcast(void* data, size_t bytes, int root) override {
    const bool me = rank() == root;
    auto all = hub_->exchange(slot_, me ? data : nullptr, me ? bytes : 0);
    const auto& src = all[static_cast<size_t>(root)];
    if (src.size() != bytes) throw Error("fake: broadcast size mismatch");
    if (!me && bytes != 0) std::memcpy(data, src.data(), bytes);
  }
  void allgather(const void* in, void* out, size_t bytes) override {
    auto all = hub_->exchange(slot_, in, bytes);
    for (size_t r = 0; r < all.size(); ++r) {
      if (all[r].size() != bytes) throw Error("fake: allgather size mismatch");
      if (bytes != 0) std::memcpy(static_cast<char*>(out) + r * bytes, all[r].data(), bytes);
    }
  }
  std::vector<std::vector<char>> allgatherv(const void* in, size_t bytes) override {
    return hub_->exchange(slot_, in, bytes);
  }
  void barrier() override { hub_->exchange(slot_, nullptr, 0); }
  void abort() override { hub_->break_generation(); }

 private:
  template <typename T>
  static void reduce(const std::vector<std::vector<char>>& all, void* data, size_t count,
                     ReduceOp op) {
    std::vector<T> acc(count), v(count);
    std::memcpy(acc.data(), all[0].data(), count * sizeof(T));
    for (size_t r = 1; r < all.size(); ++r) {
      std::memcpy(v.data(), all[r].data(), count * sizeof(T));
      for (size_t i = 0; i < count; ++i) {
        switch (op) {
          case ReduceOp::kSum:
          case ReduceOp::kAverage: acc[i] = acc[i] + v[i]; break;
          case ReduceOp::kMin: acc[i] = std::min(acc[i], v[i]); break;
          case ReduceOp::kMax: acc[i] = std::max(acc[i], v[i]); break;
          case ReduceOp::kProduct: acc[i] = acc[i] * v[i]; break;
        }
      }
    }
    if (op == ReduceOp::kAverage) {
      for (auto& x : acc) x = static_cast<T>(x / static_cast<T>(all.size()));
    }
    std::memcpy(data, acc.data(), count * sizeof(T));
  }
  FakeHub* hub_;
  int slot_;
};

class FakeContext : public Context {
 public:
  FakeContext(FakeHub& hub, int slot) : hub_(&hub), slot_(slot), comm_(&hub, slot) { refresh(); }
  // Moves this worker to another hub (e.g. from a world of one to a shared one).
  void attach(FakeHub& hub, int slot) {
    hub_ = &hub;
    slot_ = slot;
    comm_.attach(&hub, slot);
    refresh();
  }
  const WorkerInfo& info() const override { return info_; }
  Communicator& comm() override { return comm_; }
  bool host_update_pending() const override { return hub_->host_update(slot_); }
  bool drain_pending() const override { return hub_->drain(slot_); }
  void rejoin(uint64_t last_commit_id) override {
    hub_->rejoin(slot_, last_commit_id);
    refresh();
  }
  bool elastic() const override { return true; }
  std::string host_commit_stem() const override { return host_commit_stem_; }
  // Host-memory commits at STEM.a / STEM.b (empty: none, the default).
  void set_host_commit_stem(std::string stem) { host_commit_stem_ = std::move(stem); }
  // The host this worker is on ("fake" unless set), and where its States
  // serve sharded pieces to other hosts (127.0.0.1, under `secret`).
  void set_host(std::string host) {
    host_ = std::move(host);
    refresh();
  }
  PeerLink peer_link() const override { return {"127.0.0.1", "fake-job", "fake-secret"}; }
  int slot() const { return slot_; }

 private:
  void refresh() {
    info_.rank = hub_->rank_of(slot_);
    info_.size = hub_->size();
    info_.generation = hub_->generation();
    info_.host = host_;
  }
  FakeHub* hub_;
  int slot_;
  FakeComm comm_;
  WorkerInfo info_;
  std::string host_commit_stem_;
  std::string host_ = "fake";
};

// Runs fn(i) on n threads and rethrows the first exception any of them threw.
inline void run_threads(int n, const std::function<void(int)>& fn) {
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      try {
        fn(i);
      } catch (...) {
        errors[static_cast<size_t>(i)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace erun::testing
