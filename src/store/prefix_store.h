// PrefixStore: a view of a KvStore whose keys live under a prefix: set("k")
// on a view with prefix "coll/shm" writes "coll/shm/k" in the underlying
// store. Components that share one store (the barrier, the communicators of a
// generation, their sub-communicators) each get a view instead of building
// key prefixes by hand. A view of a view joins the prefixes and talks to the
// underlying store directly. Errors (a get() that times out) come from the
// underlying store and name the full key. The underlying store must outlive
// the view; thread-safe when it is.
#pragma once

#include <string>
#include <vector>

#include "store/kv_store.h"

namespace erun {

class PrefixStore final : public KvStore {
 public:
  // `prefix`: one or more '/'-separated parts, none empty (no leading,
  // trailing or doubled '/'); otherwise erun::Error naming it.
  PrefixStore(KvStore& base, const std::string& prefix);

  void set(const std::string& key, const std::vector<char>& value) override;
  std::vector<char> get(const std::string& key, Duration timeout) override;
  bool check(const std::vector<std::string>& keys) override;

  // The full prefix, as the underlying store sees it (without the trailing '/').
  const std::string& prefix() const { return prefix_; }
  // The key `key` of this view in the underlying store.
  std::string scoped(const std::string& key) const { return prefix_ + "/" + key; }
  // The store the keys end up in (never a PrefixStore).
  KvStore& base() const { return base_; }

 private:
  KvStore& base_;
  std::string prefix_;
};

}  // namespace erun
