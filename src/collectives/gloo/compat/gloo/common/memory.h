// Stand-in for a header that Debian's libgloo-dev (git20220518) omits although
// gloo/transport/tcp/pair.h includes it. Only gloo_communicator.cc sees it, and
// only to name tcp::Pair's socket and lock for abort(); it never creates, copies
// or destroys these types, so their layout here does not matter. CMake adds this
// directory only when the installed Gloo lacks the real header.
#pragma once

#include <memory>

namespace gloo {

template <typename T>
class ShareableNonOwningPtr {
  std::shared_ptr<T> ptr_;
};

template <typename T>
class NonOwningPtr {
  std::shared_ptr<T> ptr_;
};

template <typename T>
class WeakNonOwningPtr {
  std::weak_ptr<T> ptr_;
};

}  // namespace gloo
