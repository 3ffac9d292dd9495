// MemoryKvStore: a KvStore in one process's memory, for ranks run as threads
// in tests and for a world of one. Thread-safe.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>

#include "erun/errors.hpp"
#include "store/kv_store.h"

namespace erun {

class MemoryKvStore final : public KvStore {
 public:
  void set(const std::string& key, const std::vector<char>& value) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      data_[key] = value;
    }
    cv_.notify_all();
  }
  std::vector<char> get(const std::string& key, Duration timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return data_.count(key) > 0; })) {
      throw CommError("store: timed out waiting for key '" + key + "'");
    }
    return data_[key];
  }
  bool check(const std::vector<std::string>& keys) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& k : keys) {
      if (!data_.count(k)) return false;
    }
    return true;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::vector<char>> data_;
};

}  // namespace erun
