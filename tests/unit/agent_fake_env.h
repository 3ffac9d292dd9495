// FakeAgentEnv: the agent's Env (agent/env.h) in memory, for unit tests that
// drive the real agent (agent_internal.h's Agent) without a process, a signal
// or a file. Descriptors are numbers from 1,000,000 up, never one of the test
// process's own: a pipe or a socket pair is a byte queue per direction, which
// reads as EOF once every writer closed. A worker is a record whose exit the
// test scripts (its pipes close, SIGCHLD is pending, reap() returns it);
// signals are a queue behind the signal descriptor; time moves only when the
// agent's poll finds nothing ready (by its timeout) or the test advances it.
// It records what the agent asked: the processes spawned, the signals sent,
// the commit directories held and released, the files removed.
#pragma once

#include <signal.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "agent/env.h"

namespace erun::agent::testing {

using namespace std::chrono_literals;

class FakeAgentEnv final : public Env {
 public:
  // A worker the agent spawned, with the test's ends of its pipes.
  struct Process {
    pid_t pid = -1;
    SpawnOptions options;
    int out_w = -1, err_w = -1;  // what the worker writes to
    int ctl = -1;                // its end of the control socket (ERUN_AGENT_FD), or -1
    bool exited = false;
  };
  struct SentSignal {
    pid_t pid;  // below 0: a process group
    int sig;
  };

  // ---- the test's side
  // A pipe: {read end, write end}.
  std::pair<int, int> make_pipe() {
    auto q = std::make_shared<Queue>();
    return {add(End{q, nullptr}), add(End{nullptr, q})};
  }
  // Everything readable on `fd` now.
  std::string take(int fd) {
    std::string out;
    End& e = fds_.at(fd);
    if (e.in) out.swap(e.in->bytes);
    return out;
  }
  // The worker ends with wait status `status` (as waitpid() gives it): its
  // pipes and control socket close, SIGCHLD is pending, and reap() returns it.
  void exit(pid_t pid, int status) {
    Process& p = process(pid);
    p.exited = true;
    for (int* fd : {&p.out_w, &p.err_w, &p.ctl}) close_fd(*fd);
    reaped_.push_back({pid, status});
    raise(SIGCHLD);
  }
  void raise(int sig) { signals_.push_back(sig); }
  void advance(Duration d) { now_ += d; }
  Process& process(pid_t pid) {
    for (Process& p : processes) {
      if (p.pid == pid) return p;
    }
    throw std::out_of_range("no such worker");
  }
  // The signals sent to `pid` (a group: -pid) so far.
  std::vector<int> signals_to(pid_t pid) const {
    std::vector<int> out;
    for (const SentSignal& s : sent) {
      if (s.pid == pid) out.push_back(s.sig);
    }
    return out;
  }
  // The lines the agent wrote to its watchdog so far (and not taken before).
  std::string watchdog_lines() { return watchdog_peer_ < 0 ? "" : take(watchdog_peer_); }
  // The watchdog ends (its end of the channel closes).
  void end_watchdog() { close_fd(watchdog_peer_); }

  // ---- what the agent asked
  std::vector<Process> processes;
  std::vector<SentSignal> sent;
  std::vector<std::string> held_dirs, released_dirs, removed, helpers;
  std::vector<std::string> watchdog_starts;  // what each watchdog had in its channel as it started
  bool stderr_detached = false;
  std::string stderr_text;

  // ---- Env
  TimePoint now() override { return now_; }
  pid_t pid() override { return 4242; }

  void ignore_sigpipe() override {}
  int take_signals() override { return add(End{nullptr, nullptr, /*signals=*/true}); }
  int next_signal(int) override {
    if (signals_.empty()) return 0;
    const int sig = signals_.front();
    signals_.pop_front();
    return sig;
  }

  Result<Spawned> spawn(const SpawnOptions& o) override {
    Process p;
    p.pid = next_pid_++;
    p.options = o;
    auto [out_r, out_w] = make_pipe();
    auto [err_r, err_w] = make_pipe();
    p.out_w = out_w;
    p.err_w = err_w;
    if (o.pass_fd >= 0) p.ctl = dup(o.pass_fd);  // the worker's copy
    processes.push_back(p);
    return Spawned{p.pid, out_r, err_r};
  }
  int kill(pid_t pid, int sig) override {
    sent.push_back({pid, sig});
    return 0;
  }
  std::optional<std::pair<pid_t, int>> reap() override {
    if (reaped_.empty()) return std::nullopt;
    auto r = reaped_.front();
    reaped_.pop_front();
    return r;
  }
  OomWatch oom_watch(pid_t) override { return OomWatch(); }

  ssize_t read(int fd, char* buf, size_t n) override {
    End* e = find(fd);
    if (e == nullptr || !e->in) return fail(EBADF);
    Queue& q = *e->in;
    if (q.bytes.empty()) return q.writers == 0 ? 0 : fail(EAGAIN);
    const size_t k = std::min(n, q.bytes.size());
    std::memcpy(buf, q.bytes.data(), k);
    q.bytes.erase(0, k);
    return static_cast<ssize_t>(k);
  }
  ssize_t write(int fd, std::string_view data) override {
    End* e = find(fd);
    if (e == nullptr || !e->out) return fail(EBADF);
    if (e->out->readers == 0) return fail(EPIPE);
    e->out->bytes.append(data);
    return static_cast<ssize_t>(data.size());
  }
  ssize_t recv(int fd, char* buf, size_t n, int) override { return read(fd, buf, n); }
  ssize_t send(int fd, std::string_view data, int) override { return write(fd, data); }

  // Ready descriptors as poll(2) reports them; when none is, the clock moves
  // on by the timeout (the time the agent would have waited).
  int poll(pollfd* fds, size_t n, int timeout_ms) override {
    int ready = 0;
    for (size_t i = 0; i < n; ++i) {
      fds[i].revents = fds[i].fd < 0 ? 0 : revents(fds[i]);
      ready += fds[i].revents ? 1 : 0;
    }
    if (ready == 0 && timeout_ms > 0) now_ += std::chrono::milliseconds(timeout_ms);
    return ready;
  }
  void close(int fd) override {
    auto it = fds_.find(fd);
    if (it == fds_.end()) return;
    if (it->second.in) --it->second.in->readers;
    if (it->second.out) --it->second.out->writers;
    fds_.erase(it);
  }
  void shutdown_write(int fd) override {
    End* e = find(fd);
    if (e != nullptr && e->out) --std::exchange(e->out, nullptr)->writers;
  }
  void set_nonblocking(int) override {}
  bool socketpair(int ends[2]) override {
    auto a = std::make_shared<Queue>(), b = std::make_shared<Queue>();
    ends[0] = add(End{a, b});
    ends[1] = add(End{b, a});
    return true;
  }
  int listen_unix(const std::string&) override { return add(End{}); }  // nobody attaches
  int accept(int) override { return fail(EAGAIN); }
  int connect_unix(const net::Address&, TimePoint, std::string* error) override {
    *error = "no socket in the fake";
    return -1;
  }

  bool make_temp_dir(std::string& templ) override {
    templ.replace(templ.size() - 6, 6, "000001");
    return true;
  }
  Status ensure_private_dir(const std::string&, const std::string&, DirPolicy) override { return Status::ok(); }
  Result<int> open_private_append(const std::string&, const std::string&) override { return make_pipe().second; }
  bool replace_file(const std::string& dir, const char* name, const char*, std::string_view text) override {
    files[dir + "/" + name] = std::string(text);
    return true;
  }
  void unlink(const std::string& path) override { removed.push_back(path); }
  void rmdir(const std::string& path) override { removed.push_back(path); }
  void detach_stderr() override { stderr_detached = true; }
  void write_stderr(std::string_view text) override { stderr_text += text; }

  int hold_commit_dir(const std::string& dir, std::string*) override {
    held_dirs.push_back(dir);
    return make_pipe().first;  // the lease
  }
  bool release_commit_dir(const std::string& dir, int lease_fd) override {
    if (lease_fd >= 0) close(lease_fd);
    released_dirs.push_back(dir);
    return true;
  }
  state_internal::RemovedReplicas remove_replicas(const std::string&, bool) override { return {}; }

  int spawn_watchdog(long, const std::string& first_lines) override {
    helpers.push_back("watchdog");
    watchdog_starts.push_back(first_lines);
    const int fd = helper(&watchdog_peer_);
    if (!first_lines.empty()) write(fd, first_lines);
    return fd;
  }
  KeeperProcess spawn_keeper(const std::string&, const std::string&, const std::string&, std::string*) override {
    helpers.push_back("keeper");
    return KeeperProcess{helper(nullptr), 7000};
  }
  int spawn_pusher(const std::string&, const std::string&, const std::string&, int, const std::string&,
                   const std::string&) override {
    helpers.push_back("pusher");
    return helper(nullptr);
  }
  int spawn_persister(const PersisterOptions&) override {
    helpers.push_back("persister");
    return helper(nullptr);
  }
  void stop_helper(int fd, std::chrono::milliseconds) override {
    if (fd >= 0) close(fd);
  }
  bool route_helper_stderr(int ends[2]) override {
    std::tie(ends[0], ends[1]) = make_pipe();
    return true;
  }

  std::map<std::string, std::string> files;  // replace_file()'s, by path

 private:
  struct Queue {
    std::string bytes;
    int readers = 0, writers = 0;
  };
  struct End {
    std::shared_ptr<Queue> in;   // what reading this descriptor gets
    std::shared_ptr<Queue> out;  // where writing to it goes
    bool signals = false;        // take_signals()'s descriptor
  };

  int add(End e) {
    if (e.in) ++e.in->readers;
    if (e.out) ++e.out->writers;
    fds_[next_fd_] = std::move(e);
    return next_fd_++;
  }
  int dup(int fd) { return add(fds_.at(fd)); }
  End* find(int fd) {
    auto it = fds_.find(fd);
    return it == fds_.end() ? nullptr : &it->second;
  }
  static int fail(int err) {
    errno = err;
    return -1;
  }
  // A helper process's channel: the agent's end; the helper's end stays open
  // (kept in *peer when given) while the helper "runs".
  int helper(int* peer) {
    int ends[2];
    socketpair(ends);
    if (peer != nullptr) *peer = ends[1];
    return ends[0];
  }
  short revents(const pollfd& p) {
    const End* e = find(p.fd);
    if (e == nullptr) return POLLNVAL;
    if (e->signals) return (p.events & POLLIN) && !signals_.empty() ? POLLIN : 0;
    short r = 0;
    if (e->in && (p.events & POLLIN) && !e->in->bytes.empty()) r |= POLLIN;
    if (e->in && e->in->writers == 0) r |= POLLHUP | ((p.events & POLLIN) ? POLLIN : 0);
    if (e->out && (p.events & POLLOUT)) r |= e->out->readers == 0 ? POLLERR : POLLOUT;
    return r;
  }

  std::map<int, End> fds_;
  int next_fd_ = 1'000'000;
  pid_t next_pid_ = 5001;
  TimePoint now_ = TimePoint{} + 1000h;
  std::deque<int> signals_;
  std::deque<std::pair<pid_t, int>> reaped_;
  int watchdog_peer_ = -1;
};

}  // namespace erun::agent::testing
