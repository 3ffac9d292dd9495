#include "runner/launch/output.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>

#include <fmt/format.h>

#include "common/check.h"
#include "common/subprocess.h"
#include "common/log.h"
#include "common/status_line.h"

namespace erun {

namespace {

// A line longer than this without a newline is forwarded in pieces.
constexpr size_t kMaxLine = 64 * 1024;
constexpr size_t kReadSize = 64 * 1024;
constexpr size_t kTailLineMax = 4096;

}  // namespace

struct OutputForwarder::Impl {
  // fd and partial belong to the forwarding thread once add() has
  // published the worker; tail and done are guarded by mu.
  struct Stream {
    int fd = -1;
    bool is_err = false;
    std::string partial;
  };
  struct Worker {
    int rank = 0;
    Stream out, err;
    std::deque<std::string> tail;
    bool out_open = false, err_open = false;
    bool done() const { return !out_open && !err_open; }
  };
  struct Entry {
    std::shared_ptr<Worker> worker;
    Stream* stream;
  };

  OutputOptions options;
  mutable std::mutex mu;
  std::condition_variable cv;
  std::map<long, std::shared_ptr<Worker>> workers;
  std::vector<std::shared_ptr<Worker>> retired;
  bool stopping = false;
  int wake_fd = -1;
  std::thread thread;

  void wake() {
    uint64_t one = 1;
    (void)!::write(wake_fd, &one, sizeof one);
  }

  void run();
  // Reads once; false at EOF or on a read error.
  bool read_some(Entry& e);
  void consume(Worker& w, Stream& s, const char* data, size_t size, bool at_eof);
  void emit_line(Worker& w, Stream& s, std::string_view line, std::string& sink_batch,
                 std::vector<std::string>& tail_batch);
  void close_stream(const std::shared_ptr<Worker>& w, Stream& s);
  void close_retired();
};

void OutputForwarder::Impl::emit_line(Worker& w, Stream& s, std::string_view line,
                                      std::string& sink_batch, std::vector<std::string>& tail_batch) {
  if (options.sink_fd >= 0) {
    if (options.tag) sink_batch += fmt::format("[{}]<{}>:", w.rank, s.is_err ? "stderr" : "stdout");
    sink_batch.append(line);
    sink_batch += '\n';
  }
  if (s.is_err && options.tail_lines > 0) {
    tail_batch.emplace_back(line.substr(0, kTailLineMax));
  }
}

void OutputForwarder::Impl::consume(Worker& w, Stream& s, const char* data, size_t size,
                                    bool at_eof) {
  std::string sink_batch;
  std::vector<std::string> tail_batch;
  s.partial.append(data, size);
  size_t start = 0;
  while (true) {
    size_t nl = s.partial.find('\n', start);
    if (nl == std::string::npos) break;
    emit_line(w, s, std::string_view(s.partial).substr(start, nl - start), sink_batch, tail_batch);
    start = nl + 1;
  }
  while (s.partial.size() - start >= kMaxLine) {
    emit_line(w, s, std::string_view(s.partial).substr(start, kMaxLine), sink_batch, tail_batch);
    start += kMaxLine;
  }
  if (at_eof && start < s.partial.size()) {
    emit_line(w, s, std::string_view(s.partial).substr(start), sink_batch, tail_batch);
    start = s.partial.size();
  }
  s.partial.erase(0, start);
  // Through the status line (a plain write when it is off): it stays the bottom line.
  if (!sink_batch.empty()) (void)StatusLine::get().write_above(options.sink_fd, sink_batch);
  if (!tail_batch.empty()) {
    std::lock_guard lock(mu);
    for (auto& line : tail_batch) {
      w.tail.push_back(std::move(line));
      while (w.tail.size() > options.tail_lines) w.tail.pop_front();
    }
  }
}

bool OutputForwarder::Impl::read_some(Entry& e) {
  char buf[kReadSize];
  while (true) {
    ssize_t n = ::read(e.stream->fd, buf, sizeof buf);
    if (n > 0) {
      consume(*e.worker, *e.stream, buf, static_cast<size_t>(n), false);
      return true;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    return false;
  }
}

void OutputForwarder::Impl::close_stream(const std::shared_ptr<Worker>& w, Stream& s) {
  if (s.fd < 0) return;
  consume(*w, s, nullptr, 0, /*at_eof=*/true);
  close_fd(s.fd);
  std::lock_guard lock(mu);
  (s.is_err ? w->err_open : w->out_open) = false;
  cv.notify_all();
}

void OutputForwarder::Impl::close_retired() {
  std::vector<std::shared_ptr<Worker>> gone;
  {
    std::lock_guard lock(mu);
    gone.swap(retired);
  }
  for (auto& w : gone) {
    close_stream(w, w->out);
    close_stream(w, w->err);
  }
}

void OutputForwarder::Impl::run() {
  // A closed sink must not kill erun: this thread takes EPIPE instead.
  sigset_t pipe_set;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_set, nullptr);

  std::vector<Entry> entries;
  std::vector<pollfd> fds;
  while (true) {
    close_retired();
    bool stop;
    entries.clear();
    {
      std::lock_guard lock(mu);
      stop = stopping;
      for (auto& [key, w] : workers) {
        if (w->out.fd >= 0) entries.push_back({w, &w->out});
        if (w->err.fd >= 0) entries.push_back({w, &w->err});
      }
    }
    if (stop) {
      // Forward what is already in the pipes (bounded), then close them all.
      auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
      for (auto& e : entries) {
        char buf[kReadSize];
        while (std::chrono::steady_clock::now() < deadline) {
          ssize_t n = ::read(e.stream->fd, buf, sizeof buf);
          if (n > 0) consume(*e.worker, *e.stream, buf, static_cast<size_t>(n), false);
          else if (n < 0 && errno == EINTR) continue;
          else break;
        }
        close_stream(e.worker, *e.stream);
      }
      return;
    }

    fds.assign(1, pollfd{wake_fd, POLLIN, 0});
    for (auto& e : entries) fds.push_back(pollfd{e.stream->fd, POLLIN, 0});
    int n = ::poll(fds.data(), fds.size(), 1000);
    if (n < 0 && errno != EINTR) {
      ERUN_LOG_ERROR("output forwarding: poll failed: {}", strerror(errno));
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    if (n <= 0) continue;
    if (fds[0].revents) {
      uint64_t count;
      (void)!::read(wake_fd, &count, sizeof count);
    }
    for (size_t i = 0; i < entries.size(); ++i) {
      if (!fds[i + 1].revents) continue;
      if (!read_some(entries[i])) close_stream(entries[i].worker, *entries[i].stream);
    }
  }
}

OutputForwarder::OutputForwarder(OutputOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
  impl_->wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  ERUN_CHECK(impl_->wake_fd >= 0);
  impl_->thread = std::thread([this] { impl_->run(); });
}

OutputForwarder::~OutputForwarder() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->wake();
  impl_->thread.join();
  impl_->close_retired();
  close_fd(impl_->wake_fd);
}

void OutputForwarder::add(long key, int rank, int stdout_fd, int stderr_fd) {
  auto w = std::make_shared<Impl::Worker>();
  w->rank = rank;
  w->out.fd = stdout_fd;
  w->err.fd = stderr_fd;
  w->err.is_err = true;
  w->out_open = stdout_fd >= 0;
  w->err_open = stderr_fd >= 0;
  for (int fd : {stdout_fd, stderr_fd}) {
    if (fd < 0) continue;
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    ::fcntl(fd, F_SETFD, ::fcntl(fd, F_GETFD) | FD_CLOEXEC);
  }
  {
    std::lock_guard lock(impl_->mu);
    ERUN_CHECK(!impl_->stopping);
    if (auto it = impl_->workers.find(key); it != impl_->workers.end()) {
      impl_->retired.push_back(it->second);
    }
    impl_->workers[key] = std::move(w);
  }
  impl_->wake();
}

void OutputForwarder::drain(long key, int timeout_ms) {
  std::unique_lock lock(impl_->mu);
  impl_->cv.wait_for(lock, std::chrono::milliseconds(std::max(0, timeout_ms)), [&] {
    auto it = impl_->workers.find(key);
    return it == impl_->workers.end() || it->second->done();
  });
}

std::vector<std::string> OutputForwarder::tail(long key) const {
  std::lock_guard lock(impl_->mu);
  auto it = impl_->workers.find(key);
  if (it == impl_->workers.end()) return {};
  return {it->second->tail.begin(), it->second->tail.end()};
}

void OutputForwarder::forget(long key) {
  {
    std::lock_guard lock(impl_->mu);
    auto it = impl_->workers.find(key);
    if (it == impl_->workers.end()) return;
    impl_->retired.push_back(it->second);
    impl_->workers.erase(it);
  }
  impl_->wake();
}

}  // namespace erun
