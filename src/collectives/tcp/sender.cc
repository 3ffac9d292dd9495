#include "collectives/tcp/sender.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace erun::tcp {
namespace {

using namespace std::chrono_literals;

// An idle sender thread outwaits its caller by this much past the operation's
// deadline: the caller, blocked on a receive, is the one that names a peer.
constexpr Duration kIdleSenderGrace = 2s;

void drain(int fd) {
  uint64_t v;
  while (::read(fd, &v, sizeof(v)) > 0) {}
}

}  // namespace

Sender::Sender(Transport& t) : t_(t) {
  wake_fd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  done_fd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_fd_ || !done_fd_) throw CommError(fmt::format("erun tcp: eventfd: {}", std::strerror(errno)));
}

Sender::~Sender() {
  if (thread_.joinable()) {
    {
      std::lock_guard lock(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
}

void Sender::start_job(const Call& c, std::vector<SendOp>& frames, size_t ready) {
  drain(done_fd_.get());
  std::unique_lock lock(mu_);
  if (!thread_.joinable()) thread_ = std::thread([this] { main(); });
  job_call_ = &c;
  job_frames_ = &frames;
  job_ready_.store(ready, std::memory_order_relaxed);
  job_sent_.store(0, std::memory_order_relaxed);
  job_stop_ = false;
  job_error_ = nullptr;
  job_running_ = true;
  lock.unlock();
  cv_.notify_all();
}

void Sender::wake() {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_.get(), &one, sizeof(one));
}

// The caller failed: the sender gives up at its next wake-up.
void Sender::stop_job() {
  job_stop_ = true;
  wake();
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return !job_running_; });
}

// Throws the sender's error if it ended with one.
void Sender::check_job() {
  drain(done_fd_.get());
  std::lock_guard lock(mu_);
  if (!job_running_ && job_error_) std::rethrow_exception(job_error_);
}

// After the last receive: the sends still queued go out, bounded by the
// operation's deadline (the sender's own) and abort() (which wakes it).
void Sender::wait_job() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return !job_running_; });
  if (job_error_) std::rethrow_exception(job_error_);
}

void Sender::receive(const Call& c, RecvOp& r) {
  while (!r.complete()) {
    if (t_.step_recv(c, r)) continue;
    pollfd pfds[3] = {{t_.abort_fd(), POLLIN, 0}, {t_.fd(r.peer), POLLIN, 0}, {done_fd_.get(), POLLIN, 0}};
    int timeout = net::poll_ms(t_.deadline(), 1h);
    if (timeout == 0) t_.time_out(c, r.peer, fmt::format("receiving from rank {}", r.peer));
    t_.poll(c, pfds, 3, timeout);
    if (pfds[2].revents & POLLIN) check_job();
  }
}

void Sender::main() {
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return quit_ || (job_running_ && job_frames_); });
    if (quit_) return;
    const Call& c = *job_call_;
    std::vector<SendOp>& frames = *job_frames_;
    job_frames_ = nullptr;
    lock.unlock();
    std::exception_ptr error;
    try {
      send_frames(c, frames);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    job_error_ = std::move(error);
    job_running_ = false;
    job_sent_.store(kEnded, std::memory_order_release);
    job_sent_.notify_all();
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(done_fd_.get(), &one, sizeof(one));
    cv_.notify_all();
  }
}

// Writes the released frames in order; bounded by the operation's deadline
// and woken by abort(), by release() and by stop_job().
void Sender::send_frames(const Call& c, std::vector<SendOp>& frames) {
  size_t i = 0;
  while (i < frames.size()) {
    if (job_stop_) return;
    const size_t ready = job_ready_.load(std::memory_order_acquire);
    bool progressed = false;
    while (i < ready) {
      const bool moved = t_.step_send(c, frames[i]);
      progressed |= moved;
      if (!frames[i].complete()) {
        if (!moved) break;
        continue;
      }
      ++i;
      job_sent_.store(i, std::memory_order_release);
      job_sent_.notify_all();
    }
    if (i == frames.size()) break;
    if (progressed) continue;
    pollfd pfds[3] = {{t_.abort_fd(), POLLIN, 0}, {wake_fd_.get(), POLLIN, 0}, {-1, 0, 0}};
    if (i < ready) pfds[2] = {t_.fd(frames[i].peer), POLLOUT, 0};
    // Blocked sending: the peer is not reading, so it is the one named at
    // the deadline. Idle (every released frame sent): the caller is the one
    // waiting, on its own receive with the same deadline; it names the rank
    // it waits for and stops this job. The sender gives it a grace period,
    // so that an idle sender never blames its healthy right neighbour.
    const bool idle = i >= ready;
    const TimePoint deadline = t_.deadline();
    const TimePoint limit = idle && deadline != TimePoint::max() ? deadline + kIdleSenderGrace : deadline;
    int timeout = net::poll_ms(limit, 1h);
    if (timeout == 0) {
      if (idle) t_.fail(c, "the sender thread waited past the operation's deadline for its caller");
      t_.time_out(c, frames[i].peer, fmt::format("sending to rank {}", frames[i].peer));
    }
    t_.poll(c, pfds, 3, timeout);
    if (pfds[1].revents & POLLIN) {
      uint64_t v;
      [[maybe_unused]] ssize_t r = ::read(wake_fd_.get(), &v, sizeof(v));
    }
  }
}

}  // namespace erun::tcp
