// The agent's channel to its driver (agent_internal.h).
#include "agent/agent_internal.h"
#include "common/handshake.h"

namespace erun::agent::internal {

void Agent::send(const Message& m) {
  if (!out_open_ && !holding()) return;
  bool is_output = std::holds_alternative<Output>(m);
  if (is_output && outbound_.size() > kMaxOutbound) {
    ++dropped_output_;
    return;
  }
  outbound_ += encode(m);
  if (out_open_) {
    last_sent_ = env_.now();
    flush_outbound();
  }
}

// The length of the frame that starts at `p` (its header included).
size_t frame_size(const char* p) {
  uint32_t length = 0;
  for (int i = 0; i < 4; ++i) length |= static_cast<uint32_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return 4 + static_cast<size_t>(length);
}

void Agent::flush_outbound() {
  while (out_open_ && outbound_.size() > head_sent_) {
    ssize_t n = env_.write(out_fd_, std::string_view(outbound_).substr(head_sent_));
    if (n > 0) {
      head_sent_ += static_cast<size_t>(n);
      // Whole frames written leave the queue; a part-written one stays, so
      // that a new driver gets it whole should this channel break now.
      size_t done = 0;
      while (done < head_sent_ && outbound_.size() - done >= 4 && frame_size(outbound_.data() + done) <= head_sent_ - done) {
        done += frame_size(outbound_.data() + done);
      }
      outbound_.erase(0, done);
      head_sent_ -= done;
      if (outbound_.empty()) departed_.clear();
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return;
    } else {
      lose_driver(fmt::format("cannot write to the driver ({})", n < 0 ? std::strerror(errno) : "closed"));
    }
  }
}

void Agent::close_channel() {
  silent_ = false;
  if (in_fd_ >= 0 && in_fd_ != out_fd_) env_.close(in_fd_);
  if (out_fd_ >= 0) env_.close(out_fd_);
  in_fd_ = out_fd_ = -1;
  driver_open_ = out_open_ = attached_ = false;
  head_sent_ = 0;  // the next driver gets the first frame whole
  reader_ = FrameReader();
  tell_watchdog_channel();  // it lets go of its copy: the driver sees the end
}

void Agent::lose_driver(const std::string& why) {
  if (o_.driver_grace > Duration::zero() && !recorded_ && !stopping_) {
    // No job record names this agent yet: no new driver could find it.
    ERUN_LOG_WARN("{}: its driver is gone before recording this agent for a takeover: its workers stop", me_);
  }
  if (o_.driver_grace <= Duration::zero() || !recorded_ || stopping_) {
    driver_open_ = false;
    out_open_ = false;
    outbound_.clear();
    head_sent_ = 0;
    stop_all(why, true);
    return;
  }
  if (!attached_) return;
  close_channel();
  grace_until_ = env_.now() + o_.driver_grace;
  tell_watchdog_grace();
  // The relay waits for the next driver's address instead of retrying this one.
  if (relay_) relay_->pause();
  size_t running = std::count_if(workers_.begin(), workers_.end(), [](auto& w) { return !w.second.reaped; });
  ERUN_LOG_WARN("{}: {}: keeping {} worker(s) running for {:.0f} s (--driver-grace) while a new erun takes the "
                "job over (the same erun command again, or erun --attach)",
                me_, why, running, std::chrono::duration<double>(o_.driver_grace).count());
  // The agent's stderr was erun's (a local agent) or its ssh session's: let
  // it go, so that nothing waiting for erun's output to end (a pipe, a
  // terminal) waits for this agent. Its later lines are lost.
  env_.detach_stderr();
}

bool Agent::listen_for_attach() {
  std::string templ = o_.relay_dir + "/erun-agent-XXXXXX";
  if (!env_.make_temp_dir(templ)) {  // mode 0700
    ERUN_LOG_ERROR("{}: cannot create a private directory for the attach socket ({}): {}", me_, templ,
                   std::strerror(errno));
    return false;
  }
  attach_dir_ = templ;
  attach_path_ = attach_dir_ + "/attach";
  attach_listen_ = env_.listen_unix(attach_path_);  // 0600
  if (attach_listen_ < 0) {
    ERUN_LOG_ERROR("{}: cannot listen on the attach socket {}: set TMPDIR on this host to a short directory", me_,
                   attach_path_);
    env_.rmdir(attach_dir_);
    attach_dir_.clear();
    attach_path_.clear();
    return false;
  }
  return true;
}

void Agent::accept_attachers() {
  while (true) {
    int fd = env_.accept(attach_listen_);
    if (fd < 0) return;
    if (attachers_.size() >= 4 || stopping_) {
      env_.close(fd);
      continue;
    }
    attachers_.push_back(Attacher{fd, {}, env_.now() + std::chrono::seconds(10)});
  }
}

void Agent::drop_attacher(size_t i, bool close) {
  if (close) env_.close(attachers_[i].fd);
  attachers_.erase(attachers_.begin() + static_cast<long>(i));
}

// Bytes from a would-be driver: its secret line, then ATTACH.
void Agent::on_attacher(size_t i) {
  Attacher& a = attachers_[i];
  char chunk[4096];
  ssize_t n = env_.recv(a.fd, chunk, sizeof chunk, MSG_DONTWAIT);
  if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return;
  auto drop = [&](const std::string& why) {
    if (!why.empty()) ERUN_LOG_WARN("{}: refused a driver's attach: {}", me_, why);
    drop_attacher(i);
  };
  if (n <= 0) return drop("");
  a.in.append(chunk, static_cast<size_t>(n));
  size_t nl = a.in.find('\n');
  if (nl == std::string::npos) {
    if (a.in.size() > kMaxSecret) drop("its first line is no job secret");
    return;
  }
  if (a.in.size() - nl - 1 < 4) return;
  size_t size = frame_size(a.in.data() + nl + 1);
  if (size > kMaxFrame) return drop("its first frame is too long");
  if (a.in.size() - nl - 1 < size) return;
  if (!handshake::equal_ct(std::string_view(a.in.data(), nl), secret_)) return drop("wrong job secret");
  auto m = decode(std::string_view(a.in).substr(nl + 1 + 4, size - 4));
  if (const Retire* r = m ? std::get_if<Retire>(&m.value()) : nullptr) {
    const int fd = a.fd;
    Retire retire = *r;
    drop_attacher(i, /*close=*/false);
    retire_on_request(fd, retire);
    env_.close(fd);
    return;
  }
  const Attach* at = m ? std::get_if<Attach>(&m.value()) : nullptr;
  if (!at) return drop("its first frame is neither ATTACH nor RETIRE");
  if (at->term <= term_) {
    (void)env_.send(a.fd, encode(Superseded{term_}), MSG_DONTWAIT | MSG_NOSIGNAL);
    return drop(fmt::format("it is driver term {}, and this agent obeys term {}", at->term, term_));
  }
  const int fd = a.fd;
  Attach attach = *at;
  std::string rest = a.in.substr(nl + 1 + size);
  drop_attacher(i, /*close=*/false);
  take_over_channel(fd, attach, rest);
}

// A driver failed this host while it could not reach it (a partition, a
// stopped host): the job went on without these workers, so they stop now
// instead of at the end of --driver-grace, and the job's host memory goes
// with the agent (unless another agent of the job holds it). A RETIRE from
// a driver older than the one this agent obeys changes nothing.
void Agent::retire_on_request(int fd, const Retire& r) {
  if (r.term < term_) {
    (void)env_.send(fd, encode(Superseded{term_}), MSG_DONTWAIT | MSG_NOSIGNAL);
    ERUN_LOG_WARN("{}: refused to retire: the request is driver term {}'s, and this agent obeys term {}", me_, r.term,
                  term_);
    return;
  }
  const auto running =
      static_cast<uint32_t>(std::count_if(workers_.begin(), workers_.end(), [](auto& w) { return !w.second.reaped; }));
  (void)env_.send(fd, encode(Retired{running}), MSG_DONTWAIT | MSG_NOSIGNAL);
  if (stopping_) return;
  // Its driver's channel, should it still look open, leads nowhere: nothing
  // more is held for it.
  if (attached_) close_channel();
  outbound_.clear();
  head_sent_ = 0;
  stop_all(fmt::format("driver term {} retired this agent ({}): the job went on without this host", r.term,
                       escape_for_log(r.reason, 300)),
           true);
  tell_watchdog_grace();  // nothing to keep for a new driver any more
}

State Agent::state_report() const {
  State st;
  st.term = term_;
  st.dropped_output = dropped_output_;
  for (auto& [id, w] : workers_) st.workers.push_back(WorkerReport{id, w.generation, w.rank, w.slot, w.pid, false});
  for (auto& [id, r] : departed_) st.workers.push_back(r);
  return st;
}

// The new driver's connection becomes the channel: a driver still attached
// hears SUPERSEDED and loses its channel (its workers stay); the new one gets
// HELLO, STATE, then every frame held for it.
void Agent::take_over_channel(int fd, const Attach& a, std::string_view rest) {
  if (attached_) {
    // The rest of a frame it got part of first, so that it reads SUPERSEDED
    // (best effort: a full pipe drops it, and the old driver sees EOF).
    std::string bye;
    if (head_sent_ > 0) bye = outbound_.substr(head_sent_, frame_size(outbound_.data()) - head_sent_);
    bye += encode(Superseded{a.term});
    (void)write_fully(out_fd_, bye);
    close_channel();
  }
  term_ = a.term;
  recorded_ = true;  // the new driver found it in the record
  env_.set_nonblocking(fd);
  in_fd_ = out_fd_ = fd;
  attached_ = driver_open_ = out_open_ = true;
  last_heard_ = env_.now();
  tell_watchdog_grace();  // a driver holds the job again
  tell_watchdog_channel();
  if (relay_) relay_->resume(a.rdzv_host, static_cast<int>(a.rdzv_port));
  tell_direct_workers(a);
  size_t held = outbound_.size();
  outbound_ = encode(Hello{kProtocolVersion, o_.host, env_.pid(), attach_path_}) + encode(state_report()) + outbound_;
  ERUN_LOG_WARN("{}: driver term {} took the job over: {} worker(s) here, {} bytes held for it", me_, term_,
                workers_.size(), held);
  last_sent_ = env_.now();
  flush_outbound();
  if (!rest.empty()) handle_frames(rest);
}

void Agent::tell_direct_workers(const Attach& a) {
  if (direct_rdzv_host_.empty() || a.rdzv_port == 0 || a.rdzv_port > 65535) return;
  if (!a.rdzv_host.empty()) direct_rdzv_host_ = a.rdzv_host;
  const std::string text = fmt::format("{} {}\n", direct_rdzv_host_, a.rdzv_port);
  // A temporary file renamed over the last: a worker reads all of it or
  // the one before. Fixed names (the watchdog removes both): the directory
  // is this agent's own, 0700, so nobody else can plant a link there.
  if (!env_.replace_file(attach_dir_, kDriverFile, kDriverFileTemp, text)) {
    ERUN_LOG_WARN("{}: cannot tell the workers where the new driver is ({}/{}: {}): they keep trying the old one",
                  me_, attach_dir_, kDriverFile, std::strerror(errno));
    return;
  }
  ERUN_LOG_INFO("{}: the workers that reach the driver themselves are pointed at {}:{}", me_, direct_rdzv_host_,
                a.rdzv_port);
}

bool Agent::read_secret() {
  auto deadline = env_.now() + o_.secret_timeout;
  char chunk[4096];
  while (true) {
    size_t nl = inbound_.find('\n');
    if (nl != std::string::npos) {
      secret_ = inbound_.substr(0, nl);
      inbound_.erase(0, nl + 1);
      return true;
    }
    if (inbound_.size() > kMaxSecret) {
      ERUN_LOG_ERROR("{}: the first line from the driver is longer than {} bytes: not a job secret", me_, kMaxSecret);
      return false;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - env_.now()).count();
    if (left <= 0) {
      ERUN_LOG_ERROR("{}: no job secret from the driver within {} s", me_,
                     std::chrono::duration_cast<std::chrono::seconds>(o_.secret_timeout).count());
      return false;
    }
    pollfd p{in_fd_, POLLIN, 0};
    if (env_.poll(&p, 1, static_cast<int>(std::min<long>(left, 1000))) <= 0) continue;
    ssize_t n = env_.read(in_fd_, chunk, sizeof chunk);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) {
      ERUN_LOG_ERROR("{}: the driver's channel closed before the job secret (erun gone?)", me_);
      return false;
    }
    inbound_.append(chunk, static_cast<size_t>(n));
  }
}

void Agent::on_driver_bytes() {
  char chunk[kReadChunk];
  ssize_t n = env_.read(in_fd_, chunk, sizeof chunk);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n <= 0) {
    lose_driver(n == 0 ? "the driver's channel closed (erun exited or the connection dropped)"
                       : fmt::format("cannot read from the driver: {}", std::strerror(errno)));
    return;
  }
  last_heard_ = env_.now();
  if (std::exchange(silent_, false)) {
    ERUN_LOG_WARN("{}: the driver speaks again", me_);
    tell_watchdog_grace();
  }
  handle_frames(std::string_view(chunk, static_cast<size_t>(n)));
}

void Agent::handle_frames(std::string_view bytes) {
  reader_.feed(bytes);
  while (driver_open_) {
    auto m = reader_.next();
    if (!m) {
      lose_driver(m.message());
      return;
    }
    if (!m->has_value()) return;
    handle(std::move(**m));
  }
}


}  // namespace erun::agent::internal

namespace erun::agent {

using internal::kReadChunk;

namespace {

// Carries bytes both ways between in_fd/out_fd and the agent's socket until
// either side ends; the pump's exit code.
int pump(Env& env, int sock, int in_fd, int out_fd) {
  // Two directions, each a buffer that poll() drains; either side's end ends both.
  std::string to_sock, to_out;
  bool in_open = true;
  char chunk[kReadChunk];
  while (true) {
    pollfd fds[4] = {{in_open && to_sock.size() < kReadChunk * 16 ? in_fd : -1, POLLIN, 0},
                     {to_out.size() < kReadChunk * 16 ? sock : -1, POLLIN, 0},
                     {to_sock.empty() ? -1 : sock, POLLOUT, 0},
                     {to_out.empty() ? -1 : out_fd, POLLOUT, 0}};
    if (!in_open && to_sock.empty()) env.shutdown_write(sock);
    if (env.poll(fds, 4, -1) < 0) {
      if (errno == EINTR) continue;
      return 1;
    }
    if (fds[0].revents) {
      ssize_t n = env.read(in_fd, chunk, sizeof chunk);
      if (n > 0) to_sock.append(chunk, static_cast<size_t>(n));
      if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) in_open = false;
    }
    if (fds[1].revents) {
      ssize_t n = env.recv(sock, chunk, sizeof chunk, 0);
      if (n > 0) to_out.append(chunk, static_cast<size_t>(n));
      if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) {
        (void)env.write_fully(out_fd, to_out);
        return 0;
      }
    }
    if (fds[2].revents && !to_sock.empty()) {
      ssize_t n = env.send(sock, to_sock, MSG_NOSIGNAL);
      if (n > 0) to_sock.erase(0, static_cast<size_t>(n));
      if (n < 0 && errno != EINTR && errno != EAGAIN) return 0;
    }
    if (fds[3].revents && !to_out.empty()) {
      ssize_t n = env.write(out_fd, to_out);
      if (n > 0) to_out.erase(0, static_cast<size_t>(n));
      if (n < 0 && errno != EINTR && errno != EAGAIN) return 0;
    }
    if (!in_open && to_sock.empty() && fds[1].fd < 0 && to_out.empty()) return 0;
  }
}

}  // namespace

int run_attach_pump(const std::string& path, int in_fd, int out_fd) {
  Env& env = Env::real();
  env.ignore_sigpipe();
  net::Address a;
  if (!net::unix_address(path, &a)) {
    ERUN_LOG_ERROR("erun --agent --attach {}: not a usable socket path", path);
    return 1;
  }
  std::string error;
  const int sock = env.connect_unix(a, env.now() + std::chrono::seconds(10), &error);
  if (sock < 0) {
    ERUN_LOG_ERROR("erun --agent --attach {}: cannot reach the agent ({}): it ended, or its host restarted", path,
                   error);
    return 1;
  }
  const int code = pump(env, sock, in_fd, out_fd);
  env.close(sock);
  return code;
}


}  // namespace erun::agent
