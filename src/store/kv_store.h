// KvStore: the key-value store the collectives bootstrap through (Gloo pair
// addresses, the NCCL unique id). Keys are scoped to one generation by the
// implementation, so a straggler of an old generation never reads new keys.
// get() blocks until the key exists or the timeout passes (CommError).
// Thread-safe.
#pragma once

#include <string>
#include <vector>

#include "common/clock.h"

namespace erun {

class KvStore {
 public:
  virtual ~KvStore() = default;
  virtual void set(const std::string& key, const std::vector<char>& value) = 0;
  virtual std::vector<char> get(const std::string& key, Duration timeout) = 0;
  // True when every key exists now (no waiting).
  virtual bool check(const std::vector<std::string>& keys) = 0;
};

}  // namespace erun
