#include "runner/launch/agent_connection.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include <fmt/format.h>

#include "common/log.h"
#include "common/strings.h"

namespace erun {

namespace launcher_internal {

SigpipeBlocked::SigpipeBlocked() {
  sigemptyset(&pipe_);
  sigaddset(&pipe_, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  sigset_t pending;
  sigpending(&pending);
  was_pending_ = sigismember(&pending, SIGPIPE) == 1;
}

SigpipeBlocked::~SigpipeBlocked() {
  if (!was_pending_) {
    timespec zero{0, 0};
    while (sigtimedwait(&pipe_, nullptr, &zero) == SIGPIPE) {
    }
  }
  pthread_sigmask(SIG_SETMASK, &old_, nullptr);
}

bool write_within(int fd, std::string_view data, Duration limit) {
  SigpipeBlocked quiet;
  auto deadline = SteadyClock::now() + limit;
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now()).count();
      if (left <= 0) return false;
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, static_cast<int>(std::min<long>(left, 100)));
      continue;
    }
    return false;
  }
  return true;
}

}  // namespace launcher_internal

AgentConnection::AgentConnection(std::string host, Subprocess process, AgentLaunchOptions options, std::string via,
                                 StderrHint stderr_hint, std::shared_ptr<std::atomic<uint64_t>> paths_version)
    : paths_version_(std::move(paths_version)),
      host_(std::move(host)),
      process_(std::move(process)),
      process_oom_(process_.pid() > 0 ? OomWatch::of(process_.pid()) : OomWatch()),
      options_(std::move(options)),
      via_(std::move(via)),
      stderr_hint_(std::move(stderr_hint)) {
  last_heard_ = SteadyClock::now();
  last_sent_ = last_heard_;
  ::fcntl(process_.stdin_fd(), F_SETFL, ::fcntl(process_.stdin_fd(), F_GETFL) | O_NONBLOCK);
  ::fcntl(process_.stdout_fd(), F_SETFL, ::fcntl(process_.stdout_fd(), F_GETFL) | O_NONBLOCK);
  if (int err = process_.release_stderr(); err >= 0) {
    stderr_done_ = false;
    stderr_thread_ = std::thread([this, err] { forward_stderr(err); });
  }
}

AgentConnection::~AgentConnection() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  if (stderr_thread_.joinable()) stderr_thread_.join();
  std::lock_guard lock(mu_);
  for (auto& [id, w] : workers_) close_writers(w);
}

void AgentConnection::send_secret(const std::string& secret) {
  std::lock_guard wlock(write_mu_);
  if (!write_within(process_.stdin_fd(), secret + "\n", std::chrono::seconds(5))) close_stdin_locked();
}

void AgentConnection::start_reader() {
  if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
}

void AgentConnection::on_lost(OnLost f) { on_lost_ = std::move(f); }

bool AgentConnection::unreachable() {
  std::lock_guard lock(mu_);
  return lost_ && unreachable_;
}

bool AgentConnection::lost() {
  std::lock_guard lock(mu_);
  return lost_.has_value();
}

bool AgentConnection::hello_seen() {
  std::lock_guard lock(mu_);
  return hello_;
}

std::string AgentConnection::attach_path() {
  std::lock_guard lock(mu_);
  return attach_path_;
}

uint64_t AgentConnection::superseded() {
  std::lock_guard lock(mu_);
  return superseded_;
}

std::optional<std::string> AgentConnection::take_draining() {
  std::lock_guard lock(mu_);
  if (!draining_ || draining_told_) return std::nullopt;
  draining_told_ = true;
  return draining_;
}

bool AgentConnection::draining() {
  std::lock_guard lock(mu_);
  return draining_.has_value();
}

void AgentConnection::confirm_recorded(const std::string& path) {
  {
    std::lock_guard lock(mu_);
    if (path.empty() || path != attach_path_ || recorded_path_ == path) return;
    recorded_path_ = path;
  }
  send(agent::Recorded{});
}

Result<std::vector<AgentConnection::Adopted>> AgentConnection::wait_state(Duration limit) {
  using R = Result<std::vector<Adopted>>;
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, limit, [&] { return state_seen_ || lost_ || superseded_ > 0; });
  if (superseded_ > 0) return R::error(fmt::format("it obeys driver term {} already", superseded_));
  if (lost_) return R::error(*lost_);
  if (!state_seen_) return R::error(fmt::format("no STATE within {} s", to_ms(limit) / 1000.0));
  return R(std::exchange(adopted_, {}));
}

void AgentConnection::abandon() {
  {
    std::lock_guard wlock(write_mu_);
    closing_ = true;
    outbox_.clear();
    close_stdin_locked();
  }
  std::lock_guard lock(mu_);
  abandoned_ = true;
  for (auto& [id, s] : workers_) {
    if (!s.exit) set_exit(s, ExitStatus{255, 0});
    close_writers(s);
  }
  (void)process_.release();
  cv_.notify_all();
}

void AgentConnection::keep(const std::string& commit_dir) { send(agent::Keep{commit_dir}); }

void AgentConnection::unkeep(bool forget) {
  {
    std::lock_guard lock(mu_);
    keeper_port_.reset();
  }
  send(agent::Unkeep{forget});
}

std::optional<int> AgentConnection::keeper_port() {
  std::lock_guard lock(mu_);
  return keeper_port_;
}

void AgentConnection::start_worker(const agent::Start& start, int out_w, int err_w) {
  {
    std::lock_guard lock(mu_);
    had_worker_ = true;
    Slot& s = workers_[start.id];
    s.rank = start.rank;
    s.generation = start.generation;
    s.out_w = out_w;
    s.err_w = err_w;
    if (lost_) {
      fail_with_host_locked(s);
      return;
    }
  }
  send(start);
}

void AgentConnection::send(const agent::Message& m) {
  bool ok;
  {
    std::lock_guard wlock(write_mu_);
    if (!stdin_open_ || closing_) return;
    outbox_ += agent::encode(m);
    ok = flush_locked();
  }
  if (!ok) mark_lost(fmt::format("cannot send {} to it", agent::message_name(m)));
}

std::optional<ExitStatus> AgentConnection::exit_of(uint64_t id) {
  return of_worker<std::optional<ExitStatus>>(id, std::nullopt, [](const Slot& s) { return s.exit; });
}

TimePoint AgentConnection::exited_at_of(uint64_t id) {
  return of_worker(id, TimePoint::max(), [](const Slot& s) { return s.exit ? s.exited_at : TimePoint::max(); });
}

std::optional<std::vector<std::string>> AgentConnection::exit_stderr_of(uint64_t id) {
  return of_worker<std::optional<std::vector<std::string>>>(id, std::nullopt,
                                                            [](const Slot& s) { return s.exit_stderr; });
}

long AgentConnection::pid_of(uint64_t id) {
  return of_worker(id, 0L, [](const Slot& s) { return s.pid; });
}

void AgentConnection::forget(uint64_t id) {
  std::lock_guard lock(mu_);
  auto it = workers_.find(id);
  if (it == workers_.end()) return;
  close_writers(it->second);
  workers_.erase(it);
}

bool AgentConnection::wait_exit(uint64_t id, Duration limit) {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, limit, [&] {
    auto it = workers_.find(id);
    return it == workers_.end() || it->second.exit.has_value();
  });
}

void AgentConnection::begin_shutdown() {
  if (!lost()) send(agent::Shutdown{});
  std::lock_guard wlock(write_mu_);
  closing_ = true;
  if (outbox_.empty()) close_stdin_locked();
}

void AgentConnection::finish_shutdown(Duration limit) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, limit, [&] { return reader_done_; });
  lock.unlock();
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

void AgentConnection::set_exit(Slot& s, ExitStatus e) {
  if (!s.exit) s.exited_at = SteadyClock::now();
  s.exit = e;
}

void AgentConnection::fail_with_host_locked(Slot& s) {
  set_exit(s, ExitStatus{255, 0});
  if (transport_failure_) s.exit_stderr = std::vector<std::string>{transport_failure_->line, transport_failure_->hint};
  close_writers(s);
}

std::optional<AgentConnection::TransportFailure> AgentConnection::transport_failure(Duration limit) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, limit, [&] { return stderr_done_; });
  return transport_failure_;
}

void AgentConnection::recognise_stderr_line(std::string_view line) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (!stderr_hint_) return;
  auto hint = stderr_hint_(host_, line);
  if (!hint) return;
  std::lock_guard lock(mu_);
  if (!transport_failure_) transport_failure_ = TransportFailure{escape_for_log(line), std::move(*hint)};
}

void AgentConnection::forward_stderr(int fd) {
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  std::string line;
  char buf[4096];
  size_t after_stop = 0;
  while (after_stop < 64 * 1024) {
    pollfd p{fd, POLLIN, 0};
    bool stopping = stop_.load();
    if (::poll(&p, 1, stopping ? 0 : 100) <= 0) {
      if (stopping) break;
      continue;
    }
    ssize_t got = ::read(fd, buf, sizeof buf);
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (got <= 0) break;
    if (stopping) after_stop += static_cast<size_t>(got);
    std::string_view data(buf, static_cast<size_t>(got));
    (void)write_within(STDERR_FILENO, data, std::chrono::seconds(10));
    line.append(data);
    for (size_t nl; (nl = line.find('\n')) != std::string::npos; line.erase(0, nl + 1)) {
      recognise_stderr_line(std::string_view(line).substr(0, nl));
    }
    if (line.size() > 64 * 1024) line.clear();
  }
  if (!line.empty()) recognise_stderr_line(line);
  ::close(fd);
  std::lock_guard lock(mu_);
  stderr_done_ = true;
  cv_.notify_all();
}

bool AgentConnection::flush_locked() {
  SigpipeBlocked quiet;
  while (!outbox_.empty() && stdin_open_) {
    ssize_t n = ::write(process_.stdin_fd(), outbox_.data(), outbox_.size());
    if (n > 0) {
      outbox_.erase(0, static_cast<size_t>(n));
      last_sent_ = SteadyClock::now();
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      break;
    } else {
      outbox_.clear();
      return false;
    }
  }
  if (closing_ && outbox_.empty()) close_stdin_locked();
  return true;
}

void AgentConnection::close_stdin_locked() {
  if (!stdin_open_) return;
  stdin_open_ = false;
  process_.close_stdin();
}

void AgentConnection::close_writers(Slot& s) {
  close_fd(s.out_w);
  close_fd(s.err_w);
}

void AgentConnection::mark_lost(const std::string& why) {
  std::string retire_path;
  {
    std::lock_guard lock(mu_);
    if (!mark_lost_locked(why)) return;
    retire_path = attach_path_;
  }
  // An agent that may keep its workers for a new driver (it has an attach
  // socket) is told that the job went on without them (AgentRetirer).
  if (on_lost_ && !retire_path.empty()) on_lost_(host_, retire_path, why);
}

std::string AgentConnection::lost_hint(const char* if_repeats) const {
  if (agent_oom_killed_) {
    return "the memory of the host (or of the cgroup erun runs in there) ran out: lower the job's memory use "
           "or raise the limit";
  }
  if (transport_failure_) return transport_failure_->hint;
  return fmt::format("check the host and its connection (ssh, network){}", if_repeats);
}

bool AgentConnection::mark_lost_locked(const std::string& why) {
  if (lost_ || stop_.load() || abandoned_ || superseded_ > 0) return false;
  lost_ = why;
  int failed = 0;
  for (auto& [id, s] : workers_) {
    if (s.exit) continue;
    fail_with_host_locked(s);
    ++failed;
  }
  if (draining_ && failed == 0) {
    // It drained: its workers left the job, and it ended as it was told.
    ERUN_LOG_DEBUG("agent on {}: ended after draining ({})", host_, why);
  } else if (!closing_ && !had_worker_) {
    // A spare host's agent (commit replicas): no worker, no failure of the host.
    ERUN_LOG_WARN("agent on {} lost: {}; it ran no worker: {}", host_, why, lost_hint(""));
  } else if (!closing_) {
    ERUN_LOG_ERROR("agent on {} lost: {}; {} worker(s) there failed (exit code 255) and the host counts as failed: {}",
                   host_, why, failed, lost_hint(" if this repeats"));
  }
  // A silent agent (stopped, partitioned) is ended from here; its watchdog
  // (or, remotely, the agent itself once it runs again, or the retirer)
  // stops the workers.
  if (process_.pid() > 0) ::kill(-process_.pid(), SIGKILL);
  cv_.notify_all();
  return !(draining_ && failed == 0) && !closing_;
}

void AgentConnection::handle(agent::Message m) {
  if (auto* o = std::get_if<agent::Output>(&m)) {
    deliver_output(*o);
    return;
  }
  std::lock_guard lock(mu_);
  if (auto* h = std::get_if<agent::Hello>(&m)) {
    hello_ = true;
    attach_path_ = h->attach_path;
    if (paths_version_ && !attach_path_.empty()) ++*paths_version_;
    ERUN_LOG_DEBUG("agent on {}: up as {} pid {} (protocol {})", host_, h->host, h->pid, h->version);
    if (h->version != agent::kProtocolVersion) {
      mu_.unlock();
      mark_lost(fmt::format("it speaks agent protocol {} and this erun speaks {} (different erun versions): "
                            "install the same erun on every host or pass --agent-path",
                            h->version, agent::kProtocolVersion));
      mu_.lock();
    }
  } else if (auto* s = std::get_if<agent::Started>(&m)) {
    if (auto it = workers_.find(s->id); it != workers_.end()) it->second.pid = s->pid;
  } else if (auto* f = std::get_if<agent::StartFailed>(&m)) {
    if (auto it = workers_.find(f->id); it != workers_.end()) {
      ERUN_LOG_ERROR("{}: the agent could not start the worker: {}",
                     who(it->second.generation, host_, it->second.rank), f->why);
      set_exit(it->second, ExitStatus{127, 0});
      close_writers(it->second);
    }
  } else if (auto* e = std::get_if<agent::Exited>(&m)) {
    if (auto it = workers_.find(e->id); it != workers_.end()) {
      set_exit(it->second, ExitStatus{e->code, e->signal, e->oom_killed != 0});
      it->second.exit_stderr = std::move(e->stderr_tail);
      close_writers(it->second);
    }
  } else if (auto* en = std::get_if<agent::Ended>(&m)) {
    ended_ = *en;
  } else if (std::holds_alternative<agent::Heartbeat>(m)) {
    // last_heard_ is set for every frame
  } else if (auto* st = std::get_if<agent::State>(&m)) {
    adopt_state_locked(*st);
  } else if (auto* sup = std::get_if<agent::Superseded>(&m)) {
    superseded_ = std::max<uint64_t>(superseded_, sup->term);
  } else if (auto* d = std::get_if<agent::Draining>(&m)) {
    if (!draining_) draining_ = d->reason.empty() ? std::string("a notice") : escape_for_log(d->reason, 200);
  } else if (auto* k = std::get_if<agent::Keeping>(&m)) {
    if (k->port == 0) ERUN_LOG_WARN("agent on {}: cannot keep commit replicas: {}", host_, escape_for_log(k->why));
    keeper_port_ = k->port > 65535 ? 0 : static_cast<int>(k->port);
  } else {
    mu_.unlock();
    mark_lost(fmt::format("agent protocol: it sent {}, a message only the driver sends", agent::message_name(m)));
    mu_.lock();
  }
  cv_.notify_all();
}

void AgentConnection::deliver_output(const agent::Output& o) {
  int fd = -1;
  {
    std::lock_guard lock(mu_);
    auto it = workers_.find(o.id);
    if (it != workers_.end()) {
      int w = o.stream == 2 ? it->second.err_w : it->second.out_w;
      if (w >= 0) fd = ::dup(w);
    }
  }
  if (fd >= 0) {
    // Back-pressure up to a bound: a worker's output is dropped only when
    // nothing has read it for 10 s (it was taken and closed, or erun's
    // stdout is stuck).
    if (!write_within(fd, o.data, std::chrono::seconds(10))) {
      ERUN_LOG_WARN("agent on {}: a worker's output was dropped: nothing read it for 10 s (is erun's own stdout or "
                    "stderr blocked, e.g. a stopped pager or a full pipe?)",
                    host_);
    }
    ::close(fd);
  }
}

void AgentConnection::adopt_state_locked(const agent::State& st) {
  // The agent this connection took over: its workers, each with output
  // pipes of its own; their held output and exits follow.
  for (auto& r : st.workers) {
    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) != 0) continue;
    if (::pipe2(err, O_CLOEXEC) != 0) {
      ::close(out[0]);
      ::close(out[1]);
      continue;
    }
    ::fcntl(out[1], F_SETFL, O_NONBLOCK);
    ::fcntl(err[1], F_SETFL, O_NONBLOCK);
    Slot& s = workers_[r.id];
    s.rank = r.rank;
    s.generation = r.generation;
    s.pid = r.pid;
    s.out_w = out[1];
    s.err_w = err[1];
    had_worker_ = true;
    adopted_.push_back(Adopted{r, out[0], err[0]});
  }
  if (st.dropped_output > 0) {
    ERUN_LOG_WARN("agent on {}: {} output chunk(s) of its workers were dropped while no driver read them", host_,
                  st.dropped_output);
  }
  state_seen_ = true;
}

void AgentConnection::run() {
  agent::FrameReader reader;
  std::vector<char> chunk(64 * 1024);
  bool eof = false;
  while (!stop_.load() && !eof) {
    pollfd p[2] = {{process_.stdout_fd(), POLLIN, 0}, {-1, POLLOUT, 0}};
    {
      std::lock_guard wlock(write_mu_);
      if (!outbox_.empty() && stdin_open_) p[1].fd = process_.stdin_fd();
    }
    int n = ::poll(p, 2, 100);
    if (n > 0 && p[1].revents) {
      bool ok;
      {
        std::lock_guard wlock(write_mu_);
        ok = flush_locked();
      }
      if (!ok) mark_lost("cannot write to it");
    }
    if (n > 0 && p[0].revents) eof = !read_frames(reader, chunk);
    check_heartbeats();
  }
  if (eof) {
    // A frame the dying agent left half written tears the stream; its
    // watchdog's ENDED is still its last bytes.
    std::lock_guard lock(mu_);
    if (!ended_) ended_ = reader.trailing_ended();
  }
  channel_ended(eof);
  std::lock_guard lock(mu_);
  reader_done_ = true;
  cv_.notify_all();
}

bool AgentConnection::read_frames(agent::FrameReader& reader, std::vector<char>& chunk) {
  ssize_t got = ::read(process_.stdout_fd(), chunk.data(), chunk.size());
  if (got <= 0) return got < 0 && (errno == EINTR || errno == EAGAIN);
  last_heard_ = SteadyClock::now();
  reader.feed(std::string_view(chunk.data(), static_cast<size_t>(got)));
  while (true) {
    auto m = reader.next();
    if (!m) {
      mark_lost(m.message());
      return false;
    }
    if (!m->has_value()) break;
    handle(std::move(**m));
  }
  // Time spent handing output on (a slow reader of erun's stdout) is not
  // the agent's silence.
  last_heard_ = SteadyClock::now();
  return true;
}

void AgentConnection::check_heartbeats() {
  auto now = SteadyClock::now();
  bool closing;
  bool hello;
  {
    std::lock_guard lock(mu_);
    hello = hello_;
    closing = lost_.has_value();
  }
  {
    std::lock_guard wlock(write_mu_);
    closing = closing || closing_;
  }
  if (closing) return;
  Duration limit = hello ? options_.heartbeat_timeout : options_.start_timeout;
  if (now - last_heard_ > limit) {
    if (!hello) {
      std::lock_guard lock(mu_);
      unreachable_ = true;
    }
    mark_lost(hello ? fmt::format("silent for {} ms (--heartbeat-timeout {} s)", to_ms(now - last_heard_),
                                  to_ms(options_.heartbeat_timeout) / 1000.0)
                    : fmt::format("no HELLO within {} s of starting it ({})", to_ms(options_.start_timeout) / 1000,
                                  via_));
  } else if (now - last_sent_.load() >= options_.heartbeat_interval) {
    send(agent::Heartbeat{});
  }
}

// How the agent's process ended (nullopt: there was none, or it would not
// end), waited for briefly and SIGKILLed past that; an OOM kill noted.
std::optional<ExitStatus> AgentConnection::reap_process(bool eof) {
  // A channel without a process (an agent reached through its attach
  // socket) has no exit to wait for.
  std::optional<ExitStatus> status;
  if (process_.pid() > 0) status = process_.wait_for(eof ? std::chrono::seconds(3) : std::chrono::seconds(0));
  if (!status && process_.pid() > 0) {
    ::kill(-process_.pid(), SIGKILL);
    status = process_.wait_for(std::chrono::seconds(2));
  }
  std::lock_guard lock(mu_);
  if (status && status->signal == SIGKILL && process_oom_.fired()) {
    status->oom_killed = true;
    agent_oom_killed_ = true;
  }
  if (ended_ && ended_->oom_killed) agent_oom_killed_ = true;
  return status;
}

std::string AgentConnection::end_reason(const std::optional<ExitStatus>& status) {
  std::string why = status ? fmt::format("its {} process ended with {}", via_, status->describe())
                           : std::string("its channel closed");
  std::optional<agent::Ended> ended;
  {
    std::lock_guard lock(mu_);
    ended = ended_;
  }
  // Over ssh or srun that process is not the agent (nor is there one for an
  // agent reached through its attach socket): its watchdog said what became
  // of the agent on the host.
  if (ended && (via_ != "local" || !status)) {
    why = fmt::format("the agent {} on the host ({})",
                      ended->oom_killed ? "was killed by the OOM killer" : "ended without a word (killed, or it crashed)",
                      why);
  }
  // A shell's "command not found": the agent binary is not there.
  if (status && status->code == 127 && !hello_seen()) {
    why += fmt::format(" before it started: {} is not there (install the same erun on that host, or pass "
                       "--agent-path with the path it has there)",
                       options_.agent_path);
  }
  return why;
}

void AgentConnection::channel_ended(bool eof) {
  {
    std::lock_guard lock(mu_);
    // Left to another driver: the agent goes on, nothing here is lost.
    if (abandoned_ || superseded_ > 0) return;
  }
  const std::optional<ExitStatus> status = reap_process(eof);
  bool closing;
  {
    std::lock_guard wlock(write_mu_);
    closing = closing_;
  }
  if (!eof || stop_.load()) return;
  const std::string why = end_reason(status);
  if (status && status->code == 255 && !hello_seen()) {
    std::lock_guard lock(mu_);
    unreachable_ = true;  // ssh's "could not reach or log in to the host"
  }
  if (!closing) (void)transport_failure(std::chrono::seconds(1));  // its last words, for mark_lost()
  if (closing) {
    std::lock_guard lock(mu_);
    for (auto& [id, s] : workers_) {
      if (!s.exit) set_exit(s, ExitStatus{255, 0});
      close_writers(s);
    }
  } else {
    // Lost already (a write to it failed first): how it ended is still the
    // root cause to say.
    std::string said_then;
    {
      std::lock_guard lock(mu_);
      if (lost_ && *lost_ != why && status) said_then = *lost_ + "; " + why + ": " + lost_hint("");
    }
    if (!said_then.empty()) ERUN_LOG_ERROR("agent on {} lost: {}", host_, said_then);
    mark_lost(why);
  }
}

}  // namespace erun
