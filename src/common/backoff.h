// Backoff: the pause between polls of something that usually finishes in
// microseconds (a GPU stream, an NCCL communicator) but may take seconds:
// `spins` yields first, then sleeps that double from `first_sleep` up to 1 ms,
// so a long wait costs little CPU. Header-only; one per wait.
#pragma once

#include <algorithm>
#include <chrono>
#include <thread>

namespace erun {

class Backoff {
 public:
  explicit Backoff(int spins = 1000, std::chrono::microseconds first_sleep = std::chrono::microseconds(20))
      : spins_left_(spins), sleep_(first_sleep) {}
  void pause() {
    if (spins_left_ > 0) {
      --spins_left_;
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(sleep_);
    sleep_ = std::min(sleep_ * 2, std::chrono::microseconds(1000));
  }

 private:
  int spins_left_;
  std::chrono::microseconds sleep_;
};

}  // namespace erun
