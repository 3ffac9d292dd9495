// FileKvStore: a KvStore over a directory that every rank can read and write
// (a local temp dir for multi-process tests, a shared file system as a
// bootstrap fallback). One file per key, published by an atomic rename, so a
// reader sees a whole value or none. get() polls with backoff until the key
// appears or the timeout passes (CommError). Thread- and process-safe.
#pragma once

#include <string>
#include <vector>

#include "erun/errors.hpp"
#include "store/kv_store.h"

namespace erun {

class FileKvStore final : public KvStore {
 public:
  // `dir` must exist (or be creatable) and be writable; otherwise CommError.
  explicit FileKvStore(std::string dir);

  void set(const std::string& key, const std::vector<char>& value) override;
  std::vector<char> get(const std::string& key, Duration timeout) override;
  bool check(const std::vector<std::string>& keys) override;

  const std::string& dir() const { return dir_; }

 private:
  std::string path_of(const std::string& key) const;

  std::string dir_;
};

}  // namespace erun
