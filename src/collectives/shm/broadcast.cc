#include <algorithm>
#include <cstring>

#include "collectives/shm/algorithms.h"
#include "common/check.h"

namespace erun::shm {

void broadcast(Workspace& w, char* data, size_t bytes, int root) {
  Segment& s = w.segment;
  const char* what = "broadcast";
  if (s.size() == 1 || bytes == 0) return;
  const bool is_root = s.rank() == root;
  if (bytes <= s.small_bytes()) {
    char* buf = s.small(root, w.next_parity());
    if (is_root) std::memcpy(buf, data, bytes);
    s.sync(what);
    if (!is_root) std::memcpy(data, buf, bytes);
    return;
  }
  // Two halves of the staging area (the slots and the result area after
  // them), alternately: the root fills one while the others drain the other;
  // one synchronisation per piece.
  w.fence(what);
  char* staging = s.slot(0);
  const size_t half = static_cast<size_t>(s.result() + s.step_bytes() - staging) / 2 / kLine * kLine;
  ERUN_CHECK(half > 0 && staging + half <= s.result());  // the first half never overlaps the result area
  size_t steps = (bytes + half - 1) / half;
  for (size_t i = 0; i <= steps; ++i) {
    if (is_root && i < steps) {
      size_t off = i * half;
      std::memcpy(staging + (i % 2) * half, data + off, std::min(half, bytes - off));
    }
    if (!is_root && i > 0) {
      size_t off = (i - 1) * half;
      std::memcpy(data + off, staging + ((i - 1) % 2) * half, std::min(half, bytes - off));
    }
    s.sync(what);
  }
}

}  // namespace erun::shm
