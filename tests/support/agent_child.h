// Test helpers for an agent run in a forked child on pipes, with the test
// as its driver (agent/protocol.h frames both ways): Channel (one end of a
// driver channel, reading and keeping every frame) and Child (a forked
// process running a body on two pipes). Header-only: a test that includes it
// links erun_agent (directly or through erun_runner).
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "agent/protocol.h"
#include "common/subprocess.h"

namespace erun::agent::testing {

using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;

inline bool alive(pid_t pid) { return pid > 0 && ::kill(pid, 0) == 0; }

inline bool wait_gone(pid_t pid, Duration limit) {
  auto deadline = SteadyClock::now() + limit;
  while (alive(pid)) {
    if (SteadyClock::now() > deadline) return false;
    std::this_thread::sleep_for(20ms);
  }
  return true;
}

// One end of a driver channel: frames written to `in`, read from `out`.
class Channel {
 public:
  Channel(int in, int out) : in_(in), out_(out) {}
  ~Channel() { close(); }
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  void close() {
    close_fd(in_);
    close_fd(out_);
  }
  bool write_all(std::string_view data) {
    while (!data.empty()) {
      ssize_t n = ::write(in_, data.data(), data.size());
      if (n <= 0) return false;
      data.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }
  bool send(const Message& m) { return write_all(encode(m)); }

  // Reads until a frame of type T (matching `pred`) arrives; nullopt at EOF
  // or after `limit`. Every frame read is kept.
  template <typename T, typename Pred>
  std::optional<T> wait_match(Pred pred, Duration limit = 10s) {
    auto deadline = SteadyClock::now() + limit;
    while (true) {
      for (; checked_ < seen_.size(); ++checked_) {
        if (auto* m = std::get_if<T>(&seen_[checked_]); m && pred(*m)) return *m;
      }
      if (eof_) return std::nullopt;
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now()).count();
      if (left <= 0) return std::nullopt;
      pollfd p{out_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
      char chunk[65536];
      ssize_t n = ::read(out_, chunk, sizeof chunk);
      if (n <= 0) {
        eof_ = true;
        continue;
      }
      reader_.feed(std::string_view(chunk, static_cast<size_t>(n)));
      while (true) {
        auto m = reader_.next();
        EXPECT_TRUE(m.is_ok()) << m.message();
        if (!m.is_ok() || !m->has_value()) break;
        seen_.push_back(std::move(**m));
      }
    }
  }
  template <typename T>
  std::optional<T> wait_for(Duration limit = 10s) {
    return wait_match<T>([](const T&) { return true; }, limit);
  }
  // True once the other side closed (within `limit`).
  bool wait_eof(Duration limit) {
    wait_match<Shutdown>([](const Shutdown&) { return false; }, limit);
    return eof_;
  }
  std::string output(uint64_t id) const {
    std::string all;
    for (auto& m : seen_) {
      if (auto* o = std::get_if<Output>(&m); o && o->id == id) all += o->data;
    }
    return all;
  }
  const std::vector<Message>& seen() const { return seen_; }

 private:
  int in_, out_;
  FrameReader reader_;
  std::vector<Message> seen_;
  size_t checked_ = 0;
  bool eof_ = false;
};

// A child process running `body(in_fd, out_fd)` on two pipes; the test holds
// the other ends as a Channel.
struct Child {
  pid_t pid = -1;
  std::unique_ptr<Channel> channel;

  Child() = default;
  Child(Child&& o) noexcept : pid(std::exchange(o.pid, -1)), channel(std::move(o.channel)) {}
  Child& operator=(Child&& o) noexcept {
    std::swap(pid, o.pid);
    std::swap(channel, o.channel);
    return *this;
  }

  template <typename Body>
  static Child fork_with_pipes(Body body) {
    int to[2], from[2];
    EXPECT_EQ(::pipe2(to, O_CLOEXEC), 0);
    EXPECT_EQ(::pipe2(from, O_CLOEXEC), 0);
    Child c;
    c.pid = ::fork();
    if (c.pid == 0) {
      ::close(to[1]);
      ::close(from[0]);
      ::_exit(body(to[0], from[1]));
    }
    ::close(to[0]);
    ::close(from[1]);
    c.channel = std::make_unique<Channel>(to[1], from[0]);
    return c;
  }
  // The exit code once it ended within `limit`, else -1.
  int wait(Duration limit) {
    auto deadline = SteadyClock::now() + limit;
    while (SteadyClock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        pid = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(20ms);
    }
    return -1;
  }
  ~Child() {
    if (channel) channel->close();
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
};

}  // namespace erun::agent::testing
