#include "agent/agent_internal.h"

namespace erun::agent {

namespace internal {

Worker* Agent::find(uint64_t id) {
  auto it = workers_.find(id);
  return it == workers_.end() ? nullptr : &it->second;
}

Worker* Agent::live(uint64_t id) {
  Worker* w = find(id);
  return w && !w->reaped ? w : nullptr;
}

void Agent::handle(Message m) {
  if (auto* s = std::get_if<Start>(&m)) {
    start(*s);
  } else if (auto* sig = std::get_if<Signal>(&m)) {
    if (Worker* w = live(sig->id); w && sig->sig > 0 && sig->sig < NSIG) {
      if (sig->sig == SIGTERM) {
        terminate(*w);  // erun forwards a SIGTERM it got: a stop, not a notice
      } else {
        env_.kill(-w->pid, sig->sig);
      }
    }
  } else if (auto* t = std::get_if<Terminate>(&m)) {
    if (Worker* w = live(t->id); w && !w->kill_at) {
      terminate(*w);
      w->kill_at = env_.now() + w->grace;
    }
  } else if (auto* k = std::get_if<Kill>(&m)) {
    if (Worker* w = live(k->id)) env_.kill(-w->pid, SIGKILL);
  } else if (std::holds_alternative<Shutdown>(m)) {
    stop_all("the driver said SHUTDOWN", false);
  } else if (auto* k = std::get_if<Keep>(&m)) {
    keep(*k);
  } else if (auto* r = std::get_if<Replicate>(&m)) {
    replicate(*r);
  } else if (auto* u = std::get_if<Unkeep>(&m)) {
    unkeep(*u);
  } else if (std::holds_alternative<Heartbeat>(m)) {
    // last_heard_ is set for every frame
  } else if (std::holds_alternative<Recorded>(m)) {
    recorded_ = true;
  } else if (std::holds_alternative<Attach>(m) || std::holds_alternative<Retire>(m)) {
    // Only an attach connection starts with ATTACH or RETIRE; on a channel they change nothing.
  } else {
    lose_driver(fmt::format("agent protocol: the driver sent {}, a message only agents send", message_name(m)));
  }
}

void Agent::start(const Start& s) {
  if (stopping_ || draining_ || s.argv.empty() || find(s.id)) {
    send(StartFailed{s.id, stopping_   ? "the agent is stopping"
                           : draining_ ? "the host is draining (it got a notice to leave)"
                           : s.argv.empty() ? "empty command"
                                            : "duplicate id"});
    return;
  }
  // The worker's control socket: its library takes a SIGTERM as a notice to
  // leave (and says 'D'), unless this agent said 'S' first.
  int ctl = -1, child_ctl = -1;
  if (o_.drain_timeout > Duration::zero()) {
    int pair[2];
    if (env_.socketpair(pair)) {
      ctl = pair[0];
      child_ctl = pair[1];
    } else {
      ERUN_LOG_WARN("{}: socketpair: {}: this worker cannot drain on SIGTERM", me_, std::strerror(errno));
    }
  }
  auto spawned = env_.spawn(spawn_options(s, child_ctl));
  close_fd(child_ctl);  // the worker's own
  if (!spawned) {
    close_fd(ctl);
    send(StartFailed{s.id, spawned.message()});
    return;
  }
  add_worker(s, spawned.value());
  if (Worker* w = find(s.id)) {
    w->ctl = ctl;
  } else {
    close_fd(ctl);
  }
}

void Agent::terminate(Worker& w) {
  if (w.ctl >= 0) (void)env_.send(w.ctl, "S", MSG_DONTWAIT | MSG_NOSIGNAL);
  env_.kill(-w.pid, SIGTERM);
}

void Agent::on_worker_ctl(Worker& w) {
  char buf[16];
  ssize_t n = env_.recv(w.ctl, buf, sizeof buf, MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  if (n <= 0) {  // the worker (and whatever inherited the socket) closed it
    close_fd(w.ctl);
    return;
  }
  if (std::memchr(buf, 'D', static_cast<size_t>(n))) {
    begin_drain(fmt::format("SIGTERM to {} (pid {})", who(w.generation, o_.host, w.rank), w.pid));
  }
}

void Agent::begin_drain(const std::string& why) {
  if (draining_ || stopping_) return;
  draining_ = true;
  drain_deadline_ = env_.now() + o_.drain_timeout + 10s;
  ERUN_LOG_INFO("{}: {}: the host drains: its workers leave the job at their next commit (--drain-timeout {:g} s)",
                me_, why, std::chrono::duration<double>(o_.drain_timeout).count());
  send(Draining{why});
}

void Agent::tend_drain(SteadyClock::time_point now) {
  if (!draining_ || stopping_) return;
  if (workers_.empty()) {
    stop_all("drained: its workers left the job", false);
  } else if (now >= drain_deadline_) {
    stop_all(fmt::format("draining: {} worker(s) still here {:.0f} s after the notice", workers_.size(),
                         std::chrono::duration<double>(o_.drain_timeout + 10s).count()),
             true);
  }
}

// The agent's own environment (the login environment on a remote host, erun's
// locally), with the driver's variables, the relay's address and the secret
// set over it.
std::vector<std::string> Agent::worker_env(const Start& s) {
  std::map<std::string, std::string> merged;
  for (char** e = environ; e && *e; ++e) {
    std::string_view word(*e);
    size_t eq = word.find('=');
    if (eq != std::string_view::npos) merged[std::string(word.substr(0, eq))] = std::string(word.substr(eq + 1));
  }
  for (auto& [k, v] : s.env) merged[k] = v;
  if (o_.relay) relay_env(merged);
  if (auto addr = merged.find("ERUN_RDZV_ADDR");
      addr != merged.end() && !attach_dir_.empty() && addr->second.rfind("unix:", 0) != 0) {
    // It reaches the driver itself: should a new driver take the job over
    // elsewhere, this file says where (tell_direct_workers()).
    if (direct_rdzv_host_.empty()) direct_rdzv_host_ = addr->second;
    merged["ERUN_DRIVER_FILE"] = attach_dir_ + "/" + kDriverFile;
  }
  hold_commit_dir(merged);
  // A worker from now on: a replica goes only once the workers' own
  // commits are as new (UNKEEP's forget no longer holds). This also finds
  // replicas that an earlier agent of this host kept and was never told
  // UNKEEP for.
  if (keeper_.channel < 0) arm_sweep(false);
  start_persister(merged, s.cwd);
  merged["ERUN_SECRET"] = secret_;
  std::vector<std::string> words;
  for (auto& [k, v] : merged) words.push_back(k + "=" + v);
  return words;
}

// The worker leads its own session, is registered with the watchdog before
// anything can go wrong (even if the agent dies that instant, the watchdog
// learns of it), and says on its stderr why it could not start.
SpawnOptions Agent::spawn_options(const Start& s, int ctl) {
  SpawnOptions o;
  o.argv = s.argv;
  o.env = worker_env(s);
  if (ctl >= 0) {
    o.pass_fd = ctl;
    o.env->push_back(fmt::format("ERUN_AGENT_FD={}", ctl));
  }
  o.path_from_env = true;
  o.cwd = s.cwd;
  o.new_session = true;
  o.close_other_fds = true;
  if (watchdog_fd_ >= 0) o.announce = SpawnOptions::Announce{watchdog_fd_, "A ", fmt::format(" {}\n", s.term_grace_ms)};
  o.errors_on_stderr = SpawnOptions::ErrorsOnStderr{
      fmt::format("erun: cannot enter the working directory {} on {}: create it or pass another working directory\n",
                  s.cwd, o_.host),
      fmt::format("erun: cannot run {} on {}: ", s.argv[0], o_.host)};
  return o;
}

// Spawned: the worker leads its session, so a signal to its group reaches it.
void Agent::add_worker(const Start& s, const Spawned& p) {
  Worker w;
  w.id = s.id;
  w.generation = s.generation;
  w.rank = s.rank;
  w.slot = s.slot;
  w.out.fd = p.out_fd;
  w.err.fd = p.err_fd;
  const pid_t pid = p.pid;  // reaped in on_sigchld()
  w.pid = pid;
  w.oom = env_.oom_watch(pid);
  env_.set_nonblocking(w.out.fd);
  env_.set_nonblocking(w.err.fd);
  w.grace = std::chrono::milliseconds(s.term_grace_ms);
  if (!s.output_dir.empty()) open_output_files(w, s);
  workers_.emplace(s.id, std::move(w));
  ERUN_LOG_DEBUG("{}: {}: started pid {}", me_, who(s.generation, o_.host, s.rank), pid);
  send(Started{s.id, pid});
}

// DIR/rank.N/stdout and stderr of the worker, appended across generations,
// private and never through a link (common/private_files.h). A file that
// cannot be opened is logged and skipped: the output still reaches erun.
void Agent::open_output_files(Worker& w, const Start& s) {
  // The driver made it absolute from its own directory (WorkerSpecs::make()).
  std::filesystem::path dir = std::filesystem::path(s.output_dir) / fmt::format("rank.{}", s.rank);
  auto who_s = who(s.generation, o_.host, s.rank);
  Status made = env_.ensure_private_dir(dir.string(), "--output-filename directory",
                                        DirPolicy{.refuse_shared_write = false, .refuse_link = true});
  if (!made) {
    ERUN_LOG_WARN("{}: {}: {}; its output goes to erun only", me_, who_s, made.message());
    return;
  }
  for (auto [stream, name] : {std::pair{&w.out, "stdout"}, std::pair{&w.err, "stderr"}}) {
    Result<int> fd = env_.open_private_append((dir / name).string(), "--output-filename file");
    if (fd) {
      stream->file_fd = fd.value();
    } else {
      ERUN_LOG_WARN("{}: {}: {}; its {} goes to erun only", me_, who_s, fd.message(), name);
    }
  }
}

// Forwards what `s` holds: whole lines, a piece of an over-long line, and
// with `final` the rest (the pipe ended or the worker was reaped).
void Agent::pump(Worker& w, Stream& s, uint8_t stream, bool final) {
  char chunk[kReadChunk];
  int reads = 0;
  while (s.fd >= 0) {
    ssize_t n = env_.read(s.fd, chunk, sizeof chunk);
    if (n > 0) {
      if (s.file_fd >= 0 && !write_fully(s.file_fd, std::string_view(chunk, static_cast<size_t>(n)))) {
        ERUN_LOG_WARN("{}: {}: cannot write its {} file under --output-filename: {}; it goes to erun only from "
                      "now on: free space or fix the directory",
                      me_, who(w.generation, o_.host, w.rank), stream == 1 ? "stdout" : "stderr",
                      std::strerror(errno));
        close_fd(s.file_fd);
      }
      s.partial.append(chunk, static_cast<size_t>(n));
      if (!final) break;  // one read per poll round: other workers get their turn
      // A process that escaped the session may keep writing: drain a bound.
      if (++reads >= 64) close_fd(s.fd);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && !final) break;
    close_fd(s.fd);  // EOF, an error, or drained at the end
  }
  size_t cut = s.partial.rfind('\n');
  size_t take = cut == std::string::npos ? 0 : cut + 1;
  if (s.partial.size() - take >= kMaxLine || s.fd < 0) take = s.partial.size();
  if (take > 0) {
    if (stream == 2) w.err_tail.feed(std::string_view(s.partial).substr(0, take));
    send(Output{w.id, stream, s.partial.substr(0, take)});
    s.partial.erase(0, take);
  }
  if (stream == 2 && s.fd < 0) w.err_tail.finish();
}

void Agent::on_sigchld() {
  while (const int signo = env_.next_signal(sig_fd_)) {
    if (signo == SIGHUP && o_.driver_grace > Duration::zero()) {
      // The terminal that ran erun is gone: erun's loss, not a stop order.
      ERUN_LOG_DEBUG("{}: SIGHUP ignored (--driver-grace)", me_);
    } else if (signo == SIGTERM && !std::exchange(sigterm_seen_, true) && o_.drain_timeout > Duration::zero() &&
               attached_ && !stopping_ && !workers_.empty()) {
      // A notice (Slurm's preemption, a pod's eviction, an operator): the
      // host leaves at its workers' next commit; a second SIGTERM stops now.
      begin_drain("SIGTERM to the agent");
    } else if (signo == SIGTERM || signo == SIGHUP || signo == SIGINT) {
      stop_all(fmt::format("signal {} ({})", signo, strsignal(signo)), true);
    }
  }
  while (const auto ended = env_.reap()) {
    const auto [pid, status] = *ended;
    for (auto& [id, w] : workers_) {
      if (w.pid != pid || w.reaped) continue;
      w.reaped = ExitStatus::from_wait_status(status);
      w.reaped->oom_killed = w.reaped->signal == SIGKILL && w.oom.fired();
      // Strays of the worker's session go with it, so that none keeps the
      // pipes open; EXITED follows their EOF (report_exits).
      env_.kill(-w.pid, SIGKILL);
      if (watchdog_fd_ >= 0) (void)write_fully(watchdog_fd_, fmt::format("R {}\n", w.pid));
      w.output_deadline = env_.now() + kExitOutputWait;
      break;
    }
  }
  report_exits(env_.now());
}

void Agent::report_exits(SteadyClock::time_point now) {
  for (auto it = workers_.begin(); it != workers_.end();) {
    Worker& w = it->second;
    bool ended = w.out.fd < 0 && w.err.fd < 0;
    if (!w.reaped || (!ended && now < w.output_deadline)) {
      ++it;
      continue;
    }
    // What is left in the pipes (bounded), then the partial lines.
    pump(w, w.out, 1, true);
    pump(w, w.err, 2, true);
    ERUN_LOG_DEBUG("{}: {}: pid {} ended with {}{}", me_, who(w.generation, o_.host, w.rank), w.pid,
                   w.reaped->describe(), ended ? "" : " (its output pipes were still open: closed)");
    send(Exited{w.id, w.reaped->code, w.reaped->signal, w.err_tail.lines(), w.reaped->oom_killed ? uint8_t{1} : uint8_t{0}});
    if (!outbound_.empty()) departed_[w.id] = WorkerReport{w.id, w.generation, w.rank, w.slot, w.pid, true};
    close_fd(w.out.file_fd);
    close_fd(w.err.file_fd);
    close_fd(w.ctl);
    it = workers_.erase(it);
  }
}

void Agent::stop_all(const std::string& why, bool lost) {
  if (stopping_) return;
  stopping_ = true;
  lost_ = lost;
  if (lost) {
    ERUN_LOG_WARN("{}: {}: stopping {} worker(s)", me_, why, workers_.size());
  } else {
    ERUN_LOG_DEBUG("{}: {}: stopping {} worker(s)", me_, why, workers_.size());
  }
  Duration longest = 0s;
  for (auto& [id, w] : workers_) {
    if (w.reaped) continue;
    terminate(w);
    if (!w.kill_at) w.kill_at = env_.now() + w.grace;
    longest = std::max(longest, w.grace);
  }
  stop_deadline_ = env_.now() + longest + 2s;
}

// Points the worker's rendezvous address at this agent's relay, which is made
// (with the driver's address from this env) for the first worker that has
// one. A worker of another rendezvous than the relay's connects directly.
void Agent::relay_env(std::map<std::string, std::string>& env) {
  auto addr = env.find("ERUN_RDZV_ADDR");
  auto port_it = env.find("ERUN_RDZV_PORT");
  auto job = env.find("ERUN_JOB_ID");
  long port = 0;
  if (addr == env.end() || port_it == env.end() || job == env.end() || addr->second.rfind("unix:", 0) == 0 ||
      !parse_int(port_it->second, port) || port <= 0 || port > 65535) {
    return;
  }
  if (!relay_) {
    if (relay_failed_) return;
    RelayOptions ro;
    ro.job_id = job->second;
    ro.secret = secret_;
    ro.upstream_host = addr->second;
    ro.upstream_port = static_cast<int>(port);
    ro.log_prefix = me_;
    ro.parent_dir = o_.relay_dir;
    ro.pause_on_loss = o_.driver_grace > Duration::zero();
    auto made = Relay::create(ro);
    if (!made) {
      relay_failed_ = true;
      ERUN_LOG_WARN("{}: cannot relay the workers' rendezvous connections ({}); they connect to the driver "
                    "themselves",
                    me_, made.message());
      return;
    }
    relay_ = std::move(made).value();
    if (watchdog_fd_ >= 0) (void)write_fully(watchdog_fd_, fmt::format("D {}\n", relay_->directory()));
    ERUN_LOG_DEBUG("{}: relaying the workers' rendezvous connections from {} to {}:{}", me_, relay_->address(),
                   ro.upstream_host, ro.upstream_port);
  }
  const RelayOptions& ro = relay_->options();
  if (ro.upstream_host != addr->second || ro.upstream_port != port || ro.job_id != job->second) return;
  addr->second = relay_->address();
}

void Agent::ensure_watchdog() {
  if (watchdog_fd_ >= 0) {
    pollfd p{watchdog_fd_, 0, 0};
    if (env_.poll(&p, 1, 0) == 0) return;
    ERUN_LOG_WARN("{}: the watchdog ended: starting another", me_);
    close_fd(watchdog_fd_);
  }
  // What it must know, in its channel before it starts: an agent killed
  // between the start and a later write would leave its workers running
  // and its directories behind.
  std::string lines;
  for (auto& [id, w] : workers_) {
    if (w.reaped) continue;
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(w.grace).count();
    lines += fmt::format("A {} {}\n", w.pid, ms);
  }
  if (relay_) lines += fmt::format("D {}\n", relay_->directory());
  if (!attach_dir_.empty()) lines += fmt::format("T {}\n", attach_dir_);
  if (!commit_dir_.empty()) lines += fmt::format("C {}\n", commit_dir_);
  lines += grace_line();
  watchdog_fd_ = env_.spawn_watchdog(
      std::chrono::duration_cast<std::chrono::milliseconds>(o_.heartbeat_timeout + kWatchdogSlack).count(), lines);
  last_watchdog_word_ = env_.now();
  if (watchdog_fd_ < 0) {
    ERUN_LOG_ERROR("{}: cannot start the watchdog: {}", me_, std::strerror(errno));
    return;
  }
  tell_watchdog_channel();
}

void Agent::tell_watchdog_channel() {
  // The channel this agent writes its frames to: should it die without a
  // word, the watchdog writes ENDED there (agent/watchdog.h).
  (void)send_channel_to_watchdog(watchdog_fd_, out_open_ ? out_fd_ : -1);
}

std::string Agent::grace_line() {
  long ms = 0;
  if (holding() || silent_) {
    ms = std::max<long>(
        1, std::chrono::duration_cast<std::chrono::milliseconds>(grace_until_ - env_.now()).count());
  }
  return fmt::format("G {}\n", ms);
}

void Agent::tell_watchdog_grace() {
  if (watchdog_fd_ >= 0) (void)write_fully(watchdog_fd_, grace_line());
}

int Agent::run() {
  if (!begin()) return 1;
  while (step()) {
  }
  finish();
  return exit_code();
}

bool Agent::step() {
  auto now = env_.now();
  if (relay_) {
    relay_->tick(now);
    // The upstream dropped while the driver's channel stayed up: the same
    // driver again, once its channel has had a moment to show it is gone.
    if (relay_->paused() && attached_ && now - relay_->paused_since() > 1s) relay_->resume("", 0);
  }
  keep_in_touch(now);
  sweep_replicas(now);
  report_exits(now);
  kill_overdue(now);
  tend_drain(now);
  if (stopping_ && stopped(now)) return false;
  ensure_watchdog();
  poll_once(now);
  return true;
}

// Signals, the job secret, the watchdog, HELLO, and the frames that came
// with the secret.
bool Agent::begin() {
  log_prefix_init();
  // Signals the agent handles arrive through a descriptor (a signalfd);
  // SIGPIPE is an error return from write, not a death.
  env_.ignore_sigpipe();
  sig_fd_ = env_.take_signals();
  if (sig_fd_ < 0) {
    ERUN_LOG_ERROR("{}: signalfd: {}", me_, std::strerror(errno));
    return false;
  }
  open_helper_stderr();
  in_fd_ = o_.in_fd;
  out_fd_ = o_.out_fd;
  if (!read_secret()) return false;
  env_.set_nonblocking(in_fd_);
  env_.set_nonblocking(out_fd_);
  if (o_.driver_grace > Duration::zero()) listen_for_attach();
  ensure_watchdog();
  last_heard_ = env_.now();
  send(Hello{kProtocolVersion, o_.host, env_.pid(), attach_path_});
  if (!inbound_.empty()) {
    handle_frames(inbound_);
    inbound_.clear();
  }
  return true;
}

// The driver's heartbeat timeout, and the heartbeats to the driver and to
// the watchdog.
void Agent::keep_in_touch(SteadyClock::time_point now) {
  const auto silent_ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - last_heard_).count();
  if (!stopping_ && attached_ && now - last_heard_ > o_.heartbeat_timeout) {
    if (o_.driver_grace > Duration::zero() && recorded_) {
      // A silent driver (stopped with Ctrl-Z, a hung connection) keeps its
      // channel through the grace: should it speak again, nothing changed;
      // a new driver may take the job over meanwhile.
      if (!silent_) {
        silent_ = true;
        grace_until_ = now + o_.driver_grace;
        tell_watchdog_grace();
        ERUN_LOG_WARN("{}: no word from the driver for {} ms: its workers go on for up to {:.0f} s (--driver-grace) "
                      "while it stays silent",
                      me_, silent_ms, std::chrono::duration<double>(o_.driver_grace).count());
      } else if (now >= grace_until_) {
        stop_all(fmt::format("no word from the driver for {} ms, past --driver-grace", silent_ms), true);
      }
    } else {
      lose_driver(fmt::format("no word from the driver for {} ms (heartbeat timeout)", silent_ms));
    }
  }
  if (holding() && now >= grace_until_) {
    stop_all(fmt::format("no driver took the job over within --driver-grace ({:.0f} s)",
                         std::chrono::duration<double>(o_.driver_grace).count()),
             true);
  }
  for (size_t i = attachers_.size(); i-- > 0;) {
    if (now >= attachers_[i].deadline) drop_attacher(i);
  }
  if (out_open_ && now - last_sent_ >= o_.heartbeat_interval) send(Heartbeat{});
  if (watchdog_fd_ >= 0 && now - last_watchdog_word_ >= o_.heartbeat_interval) {
    (void)write_fully(watchdog_fd_, "H\n");
    last_watchdog_word_ = now;
  }
}

// SIGKILL for the sessions of workers whose grace after TERMINATE is over.
void Agent::kill_overdue(SteadyClock::time_point now) {
  for (auto& [id, w] : workers_) {
    if (w.kill_at && !w.reaped && now >= *w.kill_at) {
      env_.kill(-w.pid, SIGKILL);
      w.kill_at = now + 1s;  // again later if something is left
    }
  }
}

// Stopping: whether the agent is done (every worker reported and the
// output sent, or the stop deadline passed and what is left killed).
bool Agent::stopped(SteadyClock::time_point now) {
  if (workers_.empty() && (outbound_.empty() || !out_open_)) return true;
  if (now < stop_deadline_) return false;
  for (auto& [id, w] : workers_) {
    if (!w.reaped) env_.kill(-w.pid, SIGKILL);
  }
  return workers_.empty() || now >= stop_deadline_ + 2s;
}

// One poll round over the signalfd, the driver's channel, the workers'
// pipes and the relay, and what each ready descriptor asks for.
void Agent::poll_once(SteadyClock::time_point now) {
  std::vector<pollfd> fds;
  std::vector<std::pair<uint64_t, int>> streams;  // worker id, 1/2 (output) or 3 (control); from fds[3] on
  fds.push_back({sig_fd_, POLLIN, 0});
  fds.push_back({driver_open_ ? in_fd_ : -1, POLLIN, 0});
  fds.push_back({out_open_ && outbound_.size() > head_sent_ ? out_fd_ : -1, POLLOUT, 0});
  for (auto& [id, w] : workers_) {
    if (w.out.fd >= 0) {
      fds.push_back({w.out.fd, POLLIN, 0});
      streams.push_back({id, 1});
    }
    if (w.err.fd >= 0) {
      fds.push_back({w.err.fd, POLLIN, 0});
      streams.push_back({id, 2});
    }
    if (w.ctl >= 0) {
      fds.push_back({w.ctl, POLLIN, 0});
      streams.push_back({id, 3});
    }
  }
  Relay* relay = relay_.get();  // the one whose descriptors are listed (a START may make one)
  size_t relay_first = relay ? relay->add_fds(fds) : fds.size();
  const size_t helper_err = fds.size();
  fds.push_back({helper_err_read_, POLLIN, 0});
  const size_t attach_first = fds.size();
  fds.push_back({attach_listen_, POLLIN, 0});
  for (auto& a : attachers_) fds.push_back({a.fd, POLLIN, 0});
  const size_t attachers_listed = attachers_.size();
  int n = env_.poll(fds.data(), fds.size(), poll_timeout_ms(now));
  if (n < 0 && errno != EINTR) {
    ERUN_LOG_ERROR("{}: poll: {}", me_, std::strerror(errno));
    stop_all("poll failed", true);
  }
  if (n <= 0) return;
  if (fds[2].revents) flush_outbound();
  for (size_t i = 0; i < streams.size(); ++i) {
    if (!fds[3 + i].revents) continue;
    Worker* w = find(streams[i].first);
    if (!w) continue;
    if (streams[i].second == 1) {
      pump(*w, w->out, 1, false);
    } else if (streams[i].second == 3) {
      on_worker_ctl(*w);
    } else {
      pump(*w, w->err, 2, false);
    }
  }
  if (relay) relay->on_events(fds, relay_first);
  if (fds[1].revents && driver_open_) on_driver_bytes();
  if (fds[0].revents) on_sigchld();
  // Attachers from the last one listed down: on_attacher() may remove the one it reads.
  for (size_t i = attachers_listed; i-- > 0;) {
    if (i < attachers_.size() && fds[attach_first + 1 + i].revents) on_attacher(i);
  }
  if (fds[attach_first].revents) accept_attachers();
  if (fds[helper_err].revents) pump_helper_stderr(false);
}

void Agent::open_helper_stderr() {
  int ends[2];
  if (!env_.route_helper_stderr(ends)) return;  // the helpers keep the agent's stderr
  helper_err_read_ = ends[0];
  helper_err_write_ = ends[1];  // non-blocking too: a helper drops a line rather than wait for the agent
}

// What the helpers wrote: whole lines to the agent's stderr (`all`: the
// rest too), or everything once 64 KiB are waiting without an end of line.
void Agent::pump_helper_stderr(bool all) {
  if (helper_err_read_ < 0) return;
  char buf[4096];
  while (true) {
    const ssize_t n = env_.read(helper_err_read_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    helper_err_.append(buf, static_cast<size_t>(n));
  }
  const size_t end = helper_err_.rfind('\n');
  size_t len = end == std::string::npos ? 0 : end + 1;
  if (all || helper_err_.size() >= (64u << 10)) len = helper_err_.size();
  if (len == 0) return;
  env_.write_stderr(std::string_view(helper_err_.data(), len));
  helper_err_.erase(0, len);
}

// 100 ms, or less up to the first reaped worker's output deadline.
int Agent::poll_timeout_ms(SteadyClock::time_point now) const {
  int wait_ms = 100;
  for (auto& [id, w] : workers_) {
    if (!w.reaped) continue;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(w.output_deadline - now).count() + 1;
    wait_ms = static_cast<int>(std::clamp<long>(left, 0, wait_ms));
  }
  return wait_ms;
}

void Agent::finish() {
  flush_outbound();
  if (dropped_output_ > 0) {
    ERUN_LOG_WARN("{}: dropped {} output chunk(s): the driver did not read them in time", me_, dropped_output_);
  }
  relay_.reset();           // its socket and directory go
  // The job is over on this host (SHUTDOWN, or the driver is gone): its
  // commits go too, unless another agent of the job still runs here.
  // The persister writes the newest commit first: up to a minute when the
  // job ended, a few seconds when the driver is gone.
  env_.stop_helper(std::exchange(persister_fd_, -1), lost_ ? std::chrono::seconds(5) : std::chrono::seconds(60));
  stop_pushers();
  env_.stop_helper(std::exchange(keeper_.channel, -1), kReplicaStopWait);  // it ends before the directory goes
  pump_helper_stderr(true);  // their last lines (the persister may still write: it gives up in 5 s)
  if (!commit_dir_.empty()) env_.release_commit_dir(commit_dir_, std::exchange(commit_lease_fd_, -1));
  while (!attachers_.empty()) drop_attacher(attachers_.size() - 1);
  close_fd(attach_listen_);
  if (!attach_path_.empty()) env_.unlink(attach_path_);
  if (!attach_dir_.empty()) {
    env_.unlink(attach_dir_ + "/" + kDriverFile);
    env_.unlink(attach_dir_ + "/" + kDriverFileTemp);
    env_.rmdir(attach_dir_);
  }
  // "E": this end is on purpose (no ENDED for the driver); the watchdog finds
  // no group left and exits.
  if (watchdog_fd_ >= 0) (void)write_fully(watchdog_fd_, "E\n");
  close_fd(watchdog_fd_);
  close_fd(helper_err_read_);
  close_fd(helper_err_write_);
  close_fd(sig_fd_);
}


}  // namespace internal


int run_agent(const AgentOptions& options) { return internal::Agent(options, Env::real()).run(); }

}  // namespace erun::agent
