// The sender thread of a large ring allreduce: it writes the frames the
// caller releases while the caller receives and reduces. docs/design.md.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "collectives/tcp/transport.h"
#include "common/fd.h"

namespace erun::tcp {

class Sender {
 public:
  // Makes its eventfds; the thread starts with the first job.
  explicit Sender(Transport& t);
  ~Sender();
  Sender(const Sender&) = delete;
  Sender& operator=(const Sender&) = delete;

 private:
  friend class SenderJob;
  static constexpr size_t kEnded = ~size_t{0};

  void start_job(const Call& c, std::vector<SendOp>& frames, size_t ready);
  void wake();
  void stop_job();
  void check_job();
  void wait_job();
  void receive(const Call& c, RecvOp& r);
  void main();
  void send_frames(const Call& c, std::vector<SendOp>& frames);

  Transport& t_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool quit_ = false;                      // guarded by mu_
  bool job_running_ = false;               // guarded by mu_
  const Call* job_call_ = nullptr;         // guarded by mu_
  std::vector<SendOp>* job_frames_ = nullptr;  // guarded by mu_
  std::exception_ptr job_error_;           // guarded by mu_; rethrown by the caller
  std::atomic<size_t> job_ready_{0};       // frames the sender may write
  std::atomic<size_t> job_sent_{0};        // frames written, or kEnded
  std::atomic<bool> job_stop_{false};
  Fd wake_fd_;  // caller -> sender: a frame was released, or stop
  Fd done_fd_;  // sender -> caller: the job ended
};

// One operation's sends on the sender thread: frames [0, ready) may go out,
// release() adds one more; finish() waits until all have gone (or the sender
// failed: its error is rethrown here). Destroyed without finish() (the
// caller's side failed), it stops the sender and waits until it has let go of
// the frames: no send outlives the operation.
class SenderJob {
 public:
  SenderJob(Sender& s, const Call& c, std::vector<SendOp>& frames, size_t ready) : s_(s), c_(c) {
    s_.start_job(c, frames, ready);
  }
  ~SenderJob() {
    if (!finished_) s_.stop_job();
  }
  SenderJob(const SenderJob&) = delete;
  SenderJob& operator=(const SenderJob&) = delete;

  void release() {
    s_.job_ready_.fetch_add(1, std::memory_order_release);
    s_.wake();
  }
  // Blocks until sends[0, n) are complete: only ever for the instructions
  // between the kernel taking the last byte and the count moving on, since
  // the data a receive waits for cannot arrive before those bytes left (the
  // ring carries them around first). Returns at once when the sender ended,
  // and throws its error.
  void wait_sent(size_t n) {
    size_t now = s_.job_sent_.load(std::memory_order_acquire);
    while (now < n) {
      s_.job_sent_.wait(now, std::memory_order_acquire);
      now = s_.job_sent_.load(std::memory_order_acquire);
    }
    if (now == Sender::kEnded) s_.check_job();
  }
  // Reads one frame to its end, woken by abort() or by the sender's failure.
  void receive(RecvOp& r) { s_.receive(c_, r); }
  void finish() {
    s_.wait_job();
    finished_ = true;
  }

 private:
  Sender& s_;
  const Call& c_;
  bool finished_ = false;
};

}  // namespace erun::tcp
