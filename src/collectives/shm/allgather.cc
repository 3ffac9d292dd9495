#include <algorithm>
#include <cstdint>
#include <cstring>

#include "collectives/shm/algorithms.h"

namespace erun::shm {

void allgather(Workspace& w, const char* what, const void* in, void* out, size_t bytes) {
  Segment& s = w.segment;
  if (bytes == 0) return;
  auto* o = static_cast<char*>(out);
  const auto* i = static_cast<const char*>(in);
  if (s.size() == 1) {
    if (o != i) std::memmove(o, i, bytes);
    return;
  }
  if (bytes <= s.small_bytes()) {
    int b = w.next_parity();
    std::memcpy(s.small(s.rank(), b), i, bytes);
    s.sync(what);
    for (int r = 0; r < s.size(); ++r) {
      if (r != s.rank()) std::memcpy(o + r * bytes, s.small(r, b), bytes);
    }
    if (o + s.rank() * bytes != i) std::memcpy(o + s.rank() * bytes, s.small(s.rank(), b), bytes);
    return;
  }
  w.fence(what);
  const size_t step = s.step_bytes();
  for (size_t off = 0; off < bytes; off += step) {
    size_t n = std::min(step, bytes - off);
    std::memcpy(s.slot(s.rank()), i + off, n);
    s.sync(what);
    for (int r = 0; r < s.size(); ++r) std::memcpy(o + r * bytes + off, s.slot(r), n);
    s.sync(what);
  }
}

std::vector<std::vector<char>> allgatherv(Workspace& w, const void* in, size_t bytes) {
  Segment& s = w.segment;
  const char* what = "allgatherv";
  std::vector<uint64_t> sizes(s.size());
  uint64_t mine = bytes;
  allgather(w, what, &mine, sizes.data(), sizeof(mine));
  std::vector<std::vector<char>> result(s.size());
  size_t longest = 0;
  for (int r = 0; r < s.size(); ++r) {
    result[r].resize(sizes[r]);
    longest = std::max<size_t>(longest, sizes[r]);
  }
  const auto* i = static_cast<const char*>(in);
  if (s.size() == 1) {
    if (bytes) std::memcpy(result[0].data(), i, bytes);
    return result;
  }
  if (longest == 0) return result;
  if (longest <= s.small_bytes()) {
    int b = w.next_parity();
    if (bytes) std::memcpy(s.small(s.rank(), b), i, bytes);
    s.sync(what);
    for (int r = 0; r < s.size(); ++r) {
      if (sizes[r]) std::memcpy(result[r].data(), s.small(r, b), sizes[r]);
    }
    return result;
  }
  w.fence(what);
  const size_t step = s.step_bytes();
  for (size_t off = 0; off < longest; off += step) {
    if (off < bytes) std::memcpy(s.slot(s.rank()), i + off, std::min(step, bytes - off));
    s.sync(what);
    for (int r = 0; r < s.size(); ++r) {
      if (off < sizes[r]) std::memcpy(result[r].data() + off, s.slot(r), std::min<size_t>(step, sizes[r] - off));
    }
    s.sync(what);
  }
  return result;
}

}  // namespace erun::shm
