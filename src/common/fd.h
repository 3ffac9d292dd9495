// Fd: the one owner of a file descriptor (RAII, move-only). The destructor,
// reset() and move-assignment close what it held; release() hands the
// descriptor back without closing it. Not thread-safe: one owner thread at a
// time, though get() may be read by another thread that only polls, shuts
// down or writes to it. close() errors are ignored (nothing can be retried).
#pragma once

#include <unistd.h>

#include <utility>

namespace erun {

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) noexcept : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  explicit operator bool() const { return valid(); }
  // Gives up ownership: the caller closes the descriptor.
  [[nodiscard]] int release() { return std::exchange(fd_, -1); }
  // Closes what it held and takes `fd` (-1: nothing).
  void reset(int fd = -1) {
    const int old = std::exchange(fd_, fd);
    if (old >= 0 && old != fd) ::close(old);
  }

 private:
  int fd_ = -1;
};

}  // namespace erun
