#include "store/prefix_store.h"

#include <fmt/format.h>

#include "erun/errors.hpp"

namespace erun {
namespace {

void check_prefix(const std::string& prefix) {
  bool ok = !prefix.empty() && prefix.front() != '/' && prefix.back() != '/' &&
            prefix.find("//") == std::string::npos;
  if (!ok) {
    throw Error(fmt::format("erun: key prefix '{}' must be one or more '/'-separated non-empty parts "
                            "(e.g. \"coll\" or \"coll/shm\")",
                            prefix));
  }
}

// A view of a view: one hop to the underlying store, one joined prefix.
KvStore& underlying(KvStore& base) {
  auto* view = dynamic_cast<PrefixStore*>(&base);
  return view ? view->base() : base;
}

std::string joined(KvStore& base, const std::string& prefix) {
  check_prefix(prefix);
  auto* view = dynamic_cast<PrefixStore*>(&base);
  return view ? view->scoped(prefix) : prefix;
}

}  // namespace

PrefixStore::PrefixStore(KvStore& base, const std::string& prefix)
    : base_(underlying(base)), prefix_(joined(base, prefix)) {}

void PrefixStore::set(const std::string& key, const std::vector<char>& value) { base_.set(scoped(key), value); }

std::vector<char> PrefixStore::get(const std::string& key, Duration timeout) {
  return base_.get(scoped(key), timeout);
}

bool PrefixStore::check(const std::vector<std::string>& keys) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const std::string& k : keys) full.push_back(scoped(k));
  return base_.check(full);
}

}  // namespace erun
