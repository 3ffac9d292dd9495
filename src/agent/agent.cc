#include "agent/agent.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include <fmt/format.h>

#include "agent/protocol.h"
#include "agent/commit_dir.h"
#include "agent/detached.h"
#include "agent/replicas.h"
#include "agent/persister.h"
#include "agent/relay.h"
#include "agent/watchdog.h"
#include "commits/replica.h"
#include "common/fd.h"
#include "common/log.h"
#include "common/net.h"
#include "common/private_files.h"
#include "common/strings.h"
#include "common/subprocess.h"

extern char** environ;

namespace erun::agent {

namespace {

using SteadyClock = std::chrono::steady_clock;
namespace si = erun::state_internal;
using namespace std::chrono_literals;

constexpr size_t kReadChunk = 64 * 1024;
constexpr size_t kMaxLine = 64 * 1024;              // longer lines are forwarded in pieces
constexpr size_t kMaxOutbound = 64u * 1024 * 1024;  // output dropped beyond this backlog
// After a worker is reaped, how long its EXITED waits for its pipes' EOF
// (a process that left its session may hold them open for ever).
constexpr Duration kExitOutputWait = 200ms;
// The watchdog takes an agent that wrote it nothing for the heartbeat
// timeout plus this for frozen or hung (the driver has declared the host
// lost by then), kills it and stops its workers.
constexpr Duration kWatchdogSlack = 2s;

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

// write(2) of everything, retrying EINTR; for the watchdog's lines and the output files.
bool write_fully(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

// ---- the agent ------------------------------------------------------------

struct Stream {
  int fd = -1;
  int file_fd = -1;  // --output-filename on this host, or -1
  std::string partial;
};

struct Worker {
  uint64_t id = 0;
  long generation = 0;
  int rank = 0;
  int slot = 0;
  pid_t pid = -1;
  Stream out, err;
  LineTail err_tail;  // the last stderr lines, for EXITED
  Duration grace = 5s;
  std::optional<SteadyClock::time_point> kill_at;  // after TERMINATE
  // Reaped: its EXITED waits for the pipes' EOF until output_deadline. No
  // signal goes to its pid any more.
  std::optional<ExitStatus> reaped;
  SteadyClock::time_point output_deadline{};
};

class Agent {
 public:
  explicit Agent(const AgentOptions& o) : o_(o) {}

  int run();

 private:
  // The steps of run().
  bool begin();
  void keep_in_touch(SteadyClock::time_point now);
  void kill_overdue(SteadyClock::time_point now);
  bool stopped(SteadyClock::time_point now);
  void poll_once(SteadyClock::time_point now);
  int poll_timeout_ms(SteadyClock::time_point now) const;
  void finish();

  void log_prefix_init() { me_ = fmt::format("agent on {} (pid {})", o_.host, ::getpid()); }
  bool holding() const { return !attached_ && o_.driver_grace > Duration::zero() && !stopping_; }
  void send(const Message& m);
  void flush_outbound();
  // The driver's channel broke without SHUTDOWN: with --driver-grace the
  // workers keep running and the agent waits for a new driver; without, it
  // stops them (stop_all).
  void lose_driver(const std::string& why);
  void close_channel();
  // The attach socket (--driver-grace): a new driver's connection proves the
  // job secret and sends ATTACH with a higher term; it then becomes the
  // driver's channel.
  bool listen_for_attach();
  void accept_attachers();
  void on_attacher(size_t i);
  void take_over_channel(Fd fd, const Attach& a, std::string_view rest);
  State state_report() const;
  bool read_secret();
  void on_driver_bytes();
  // Feeds bytes from the driver and handles every whole frame in them.
  void handle_frames(std::string_view bytes);
  void handle(Message m);
  void start(const Start& s);
  std::vector<std::string> worker_env(const Start& s);
  SpawnOptions spawn_options(const Start& s);
  void add_worker(const Start& s, Subprocess& p);
  void open_output_files(Worker& w, const Start& s);
  void on_sigchld();
  void pump(Worker& w, Stream& s, uint8_t stream, bool final);
  // Sends EXITED for reaped workers whose pipes ended or whose wait is over.
  void report_exits(SteadyClock::time_point now);
  void stop_all(const std::string& why, bool lost);
  void ensure_watchdog();
  void relay_env(std::map<std::string, std::string>& env);
  Worker* find(uint64_t id);
  Worker* live(uint64_t id);  // a worker not reaped yet

  AgentOptions o_;
  std::string me_;
  std::string secret_;
  std::string inbound_;  // bytes read after the secret line
  FrameReader reader_;
  std::string outbound_;   // whole frames; the first is written from head_sent_ on
  size_t head_sent_ = 0;
  size_t dropped_output_ = 0;
  int in_fd_ = -1, out_fd_ = -1;  // the driver's channel: stdin/stdout, or an attach connection
  bool attached_ = true;          // a driver's channel is open
  bool recorded_ = false;         // RECORDED came: a new driver can find this agent
  bool silent_ = false;           // attached, but the driver is past its heartbeat timeout
  uint64_t term_ = 1;             // the driver obeyed: the first one is term 1
  SteadyClock::time_point grace_until_{};
  // Workers whose EXITED is queued but not yet written: a new driver learns
  // them from STATE.
  std::map<uint64_t, WorkerReport> departed_;
  std::string attach_dir_, attach_path_;
  Fd attach_listen_;
  struct Attacher {
    Fd fd;
    std::string in;
    SteadyClock::time_point deadline;
  };
  std::vector<Attacher> attachers_;
  bool driver_open_ = true;   // reading the driver's channel
  bool out_open_ = true;      // writing to it
  bool stopping_ = false;
  bool lost_ = false;
  SteadyClock::time_point stop_deadline_{};
  SteadyClock::time_point last_heard_{};
  SteadyClock::time_point last_sent_{};
  int sig_fd_ = -1;
  int watchdog_fd_ = -1;
  SteadyClock::time_point last_watchdog_word_{};  // the last "H" to the watchdog
  std::map<uint64_t, Worker> workers_;
  // The job's host-memory commit directory (the first START's
  // ERUN_COMMIT_DIR) and this agent's shared lock on its lease.
  void hold_commit_dir(const std::map<std::string, std::string>& env);
  bool hold_commit_dir(const std::string& dir);
  // Commit replicas (agent/replicas.h): KEEP starts the keeper, REPLICATE
  // (re)targets the pusher.
  void keep(const Keep& k);
  void unkeep(const Unkeep& u);
  void replicate(const Replicate& r);
  void stop_pushers();
  // While no keeper runs: removes the replicas that this host's workers
  // hold a commit as new as (all of them after UNKEEP with forget, while no
  // worker runs), now and then until none is left. Armed by UNKEEP and by
  // START (an agent started anew may find a lost one's replicas).
  void sweep_replicas(SteadyClock::time_point now);
  void arm_sweep(bool all);
  KeeperProcess keeper_;
  bool sweeping_ = false;
  bool sweep_all_ = false;  // UNKEEP said forget, and no START came since
  SteadyClock::time_point next_sweep_{};
  std::chrono::milliseconds sweep_every_{1000};  // doubles while nothing goes
  struct Pusher {
    int channel = -1;
    std::string to;  // host:port
  };
  std::map<std::string, Pusher> pushers_;  // by the keeper's commit directory
  // With ERUN_CHECKPOINT_DIR too, the persister that writes its newest
  // commit to disk (agent/persister.h); `cwd` resolves a relative directory.
  void start_persister(const std::map<std::string, std::string>& env, const std::string& cwd);
  std::string commit_dir_;
  int commit_lease_fd_ = -1;
  int persister_fd_ = -1;
  bool persister_tried_ = false;  // at the first START, once
  std::unique_ptr<Relay> relay_;  // made for the first worker that has a rendezvous to relay
  bool relay_failed_ = false;     // could not be made: workers connect directly
};

Worker* Agent::find(uint64_t id) {
  auto it = workers_.find(id);
  return it == workers_.end() ? nullptr : &it->second;
}

Worker* Agent::live(uint64_t id) {
  Worker* w = find(id);
  return w && !w->reaped ? w : nullptr;
}

void Agent::send(const Message& m) {
  if (!out_open_ && !holding()) return;
  bool is_output = std::holds_alternative<Output>(m);
  if (is_output && outbound_.size() > kMaxOutbound) {
    ++dropped_output_;
    return;
  }
  outbound_ += encode(m);
  if (out_open_) {
    last_sent_ = SteadyClock::now();
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
    ssize_t n = ::write(out_fd_, outbound_.data() + head_sent_, outbound_.size() - head_sent_);
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
  if (in_fd_ >= 0 && in_fd_ != out_fd_) ::close(in_fd_);
  if (out_fd_ >= 0) ::close(out_fd_);
  in_fd_ = out_fd_ = -1;
  driver_open_ = out_open_ = attached_ = false;
  head_sent_ = 0;  // the next driver gets the first frame whole
  reader_ = FrameReader();
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
  grace_until_ = SteadyClock::now() + o_.driver_grace;
  // The relay waits for the next driver's address instead of retrying this one.
  if (relay_) relay_->pause();
  size_t running = std::count_if(workers_.begin(), workers_.end(), [](auto& w) { return !w.second.reaped; });
  ERUN_LOG_WARN("{}: {}: keeping {} worker(s) running for {:.0f} s (--driver-grace) while a new erun takes the "
                "job over (the same erun command again, or erun --attach)",
                me_, why, running, std::chrono::duration<double>(o_.driver_grace).count());
  // The agent's stderr was erun's (a local agent) or its ssh session's: let
  // it go, so that nothing waiting for erun's output to end (a pipe, a
  // terminal) waits for this agent. Its later lines are lost.
  if (int devnull = ::open("/dev/null", O_WRONLY | O_CLOEXEC); devnull >= 0) {
    ::dup2(devnull, STDERR_FILENO);
    ::close(devnull);
  }
}

bool Agent::listen_for_attach() {
  std::string templ = o_.relay_dir + "/erun-agent-XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr) {  // mode 0700
    ERUN_LOG_ERROR("{}: cannot create a private directory for the attach socket ({}): {}", me_, templ,
                   std::strerror(errno));
    return false;
  }
  attach_dir_ = templ;
  attach_path_ = attach_dir_ + "/attach";
  net::Address a;
  net::Socket sock;
  if (net::unix_address(attach_path_, &a)) sock = net::listen(a, 16);
  if (!sock.ok()) {
    ERUN_LOG_ERROR("{}: cannot listen on the attach socket {}: set TMPDIR on this host to a short directory", me_,
                   attach_path_);
    ::rmdir(attach_dir_.c_str());
    attach_dir_.clear();
    attach_path_.clear();
    return false;
  }
  ::chmod(attach_path_.c_str(), 0600);
  attach_listen_ = std::move(sock.fd);
  return true;
}

void Agent::accept_attachers() {
  while (true) {
    Fd fd = net::accept(attach_listen_.get());
    if (!fd) return;
    if (attachers_.size() >= 4 || stopping_) continue;  // closes it
    attachers_.push_back(Attacher{std::move(fd), {}, SteadyClock::now() + std::chrono::seconds(10)});
  }
}

// Bytes from a would-be driver: its secret line, then ATTACH.
void Agent::on_attacher(size_t i) {
  Attacher& a = attachers_[i];
  char chunk[4096];
  ssize_t n = ::recv(a.fd.get(), chunk, sizeof chunk, MSG_DONTWAIT);
  if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return;
  auto drop = [&](const std::string& why) {
    if (!why.empty()) ERUN_LOG_WARN("{}: refused a driver's attach: {}", me_, why);
    attachers_.erase(attachers_.begin() + static_cast<long>(i));
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
  const std::string_view secret(a.in.data(), nl);
  bool same = secret.size() == secret_.size();
  unsigned char diff = 0;
  for (size_t k = 0; same && k < secret.size(); ++k) diff |= static_cast<unsigned char>(secret[k] ^ secret_[k]);
  if (!same || diff != 0) return drop("wrong job secret");
  auto m = decode(std::string_view(a.in).substr(nl + 1 + 4, size - 4));
  const Attach* at = m ? std::get_if<Attach>(&m.value()) : nullptr;
  if (!at) return drop("its first frame is not ATTACH");
  if (at->term <= term_) {
    std::string no = encode(Superseded{term_});
    (void)!::send(a.fd.get(), no.data(), no.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    return drop(fmt::format("it is driver term {}, and this agent obeys term {}", at->term, term_));
  }
  Fd fd = std::move(a.fd);
  Attach attach = *at;
  std::string rest = a.in.substr(nl + 1 + size);
  attachers_.erase(attachers_.begin() + static_cast<long>(i));
  take_over_channel(std::move(fd), attach, rest);
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
void Agent::take_over_channel(Fd fd, const Attach& a, std::string_view rest) {
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
  (void)net::set_nonblocking(fd.get());
  in_fd_ = out_fd_ = fd.release();
  attached_ = driver_open_ = out_open_ = true;
  last_heard_ = SteadyClock::now();
  if (relay_) relay_->resume(a.rdzv_host, static_cast<int>(a.rdzv_port));
  size_t held = outbound_.size();
  outbound_ = encode(Hello{kProtocolVersion, o_.host, ::getpid(), attach_path_}) + encode(state_report()) + outbound_;
  ERUN_LOG_WARN("{}: driver term {} took the job over: {} worker(s) here, {} bytes held for it", me_, term_,
                workers_.size(), held);
  last_sent_ = SteadyClock::now();
  flush_outbound();
  if (!rest.empty()) handle_frames(rest);
}

bool Agent::read_secret() {
  auto deadline = SteadyClock::now() + o_.secret_timeout;
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
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now()).count();
    if (left <= 0) {
      ERUN_LOG_ERROR("{}: no job secret from the driver within {} s", me_,
                     std::chrono::duration_cast<std::chrono::seconds>(o_.secret_timeout).count());
      return false;
    }
    pollfd p{in_fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(std::min<long>(left, 1000))) <= 0) continue;
    ssize_t n = ::read(in_fd_, chunk, sizeof chunk);
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
  ssize_t n = ::read(in_fd_, chunk, sizeof chunk);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n <= 0) {
    lose_driver(n == 0 ? "the driver's channel closed (erun exited or the connection dropped)"
                       : fmt::format("cannot read from the driver: {}", std::strerror(errno)));
    return;
  }
  last_heard_ = SteadyClock::now();
  if (std::exchange(silent_, false)) ERUN_LOG_WARN("{}: the driver speaks again", me_);
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

void Agent::handle(Message m) {
  if (auto* s = std::get_if<Start>(&m)) {
    start(*s);
  } else if (auto* sig = std::get_if<Signal>(&m)) {
    if (Worker* w = live(sig->id); w && sig->sig > 0 && sig->sig < NSIG) ::kill(-w->pid, sig->sig);
  } else if (auto* t = std::get_if<Terminate>(&m)) {
    if (Worker* w = live(t->id); w && !w->kill_at) {
      ::kill(-w->pid, SIGTERM);
      w->kill_at = SteadyClock::now() + w->grace;
    }
  } else if (auto* k = std::get_if<Kill>(&m)) {
    if (Worker* w = live(k->id)) ::kill(-w->pid, SIGKILL);
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
  } else if (std::holds_alternative<Attach>(m)) {
    // Only an attach connection starts with ATTACH; on a channel it changes nothing.
  } else {
    lose_driver(fmt::format("agent protocol: the driver sent {}, a message only agents send", message_name(m)));
  }
}

void Agent::start(const Start& s) {
  if (stopping_ || s.argv.empty() || find(s.id)) {
    send(StartFailed{s.id, stopping_ ? "the agent is stopping" : s.argv.empty() ? "empty command" : "duplicate id"});
    return;
  }
  auto spawned = Subprocess::spawn(spawn_options(s));
  if (!spawned) {
    send(StartFailed{s.id, spawned.message()});
    return;
  }
  add_worker(s, spawned.value());
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
SpawnOptions Agent::spawn_options(const Start& s) {
  SpawnOptions o;
  o.argv = s.argv;
  o.env = worker_env(s);
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
void Agent::add_worker(const Start& s, Subprocess& p) {
  Worker w;
  w.id = s.id;
  w.generation = s.generation;
  w.rank = s.rank;
  w.slot = s.slot;
  w.out.fd = p.release_stdout();
  w.err.fd = p.release_stderr();
  const pid_t pid = p.release();  // reaped with waitpid(-1) in on_sigchld()
  w.pid = pid;
  set_nonblocking(w.out.fd);
  set_nonblocking(w.err.fd);
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
  // The driver made it absolute from its own directory (make_spec).
  std::filesystem::path dir = std::filesystem::path(s.output_dir) / fmt::format("rank.{}", s.rank);
  auto who_s = who(s.generation, o_.host, s.rank);
  Status made = ensure_private_dir(dir.string(), "--output-filename directory",
                                   DirPolicy{.refuse_shared_write = false, .refuse_link = true});
  if (!made) {
    ERUN_LOG_WARN("{}: {}: {}; its output goes to erun only", me_, who_s, made.message());
    return;
  }
  for (auto [stream, name] : {std::pair{&w.out, "stdout"}, std::pair{&w.err, "stderr"}}) {
    Result<int> fd = open_private_append((dir / name).string(), "--output-filename file");
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
    ssize_t n = ::read(s.fd, chunk, sizeof chunk);
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
  signalfd_siginfo info;
  while (::read(sig_fd_, &info, sizeof info) == sizeof info) {
    if (info.ssi_signo == SIGHUP && o_.driver_grace > Duration::zero()) {
      // The terminal that ran erun is gone: erun's loss, not a stop order.
      ERUN_LOG_DEBUG("{}: SIGHUP ignored (--driver-grace)", me_);
    } else if (info.ssi_signo == SIGTERM || info.ssi_signo == SIGHUP || info.ssi_signo == SIGINT) {
      stop_all(fmt::format("signal {} ({})", info.ssi_signo, strsignal(static_cast<int>(info.ssi_signo))), true);
    }
  }
  while (true) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) break;
    for (auto& [id, w] : workers_) {
      if (w.pid != pid || w.reaped) continue;
      w.reaped = ExitStatus::from_wait_status(status);
      // Strays of the worker's session go with it, so that none keeps the
      // pipes open; EXITED follows their EOF (report_exits).
      ::kill(-w.pid, SIGKILL);
      if (watchdog_fd_ >= 0) (void)write_fully(watchdog_fd_, fmt::format("R {}\n", w.pid));
      w.output_deadline = SteadyClock::now() + kExitOutputWait;
      break;
    }
  }
  report_exits(SteadyClock::now());
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
    send(Exited{w.id, w.reaped->code, w.reaped->signal, w.err_tail.lines()});
    if (!outbound_.empty()) departed_[w.id] = WorkerReport{w.id, w.generation, w.rank, w.slot, w.pid, true};
    close_fd(w.out.file_fd);
    close_fd(w.err.file_fd);
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
    ::kill(-w.pid, SIGTERM);
    if (!w.kill_at) w.kill_at = SteadyClock::now() + w.grace;
    longest = std::max(longest, w.grace);
  }
  stop_deadline_ = SteadyClock::now() + longest + 2s;
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

void Agent::hold_commit_dir(const std::map<std::string, std::string>& env) {
  auto it = env.find("ERUN_COMMIT_DIR");
  if (it != env.end()) hold_commit_dir(it->second);
}

bool Agent::hold_commit_dir(const std::string& dir) {
  if (!commit_dir_.empty()) return commit_dir_ == dir;
  if (dir.empty() || dir[0] != '/') return false;
  commit_dir_ = dir;
  std::string error;
  commit_lease_fd_ = agent::hold_commit_dir(commit_dir_, &error);
  if (commit_lease_fd_ < 0) {
    ERUN_LOG_WARN("{}: cannot hold the host-memory commit directory: {}", me_, error);
  }
  if (watchdog_fd_ >= 0) (void)write_fully(watchdog_fd_, fmt::format("C {}\n", commit_dir_));
  return true;
}

// Whether a forked helper's channel hung up: the helper ended.
bool helper_ended(int channel) {
  pollfd p{channel, POLLIN, 0};
  return channel < 0 || ::poll(&p, 1, 0) != 0;
}

void Agent::keep(const Keep& k) {
  // The driver repeats KEEP: a keeper that ended (its channel hung up) is
  // started again, on a new port that the answer says.
  if (keeper_.channel >= 0 && helper_ended(keeper_.channel)) {
    ERUN_LOG_WARN("{}: the commit replica keeper ended: starting another", me_);
    stop_helper(std::exchange(keeper_.channel, -1), kReplicaStopWait);
  }
  if (keeper_.channel < 0) {
    if (stopping_) {
      send(Keeping{0, "the agent is stopping"});
      return;
    }
    if (!hold_commit_dir(k.commit_dir)) {
      send(Keeping{0, fmt::format("cannot keep commits in {}: this agent holds {}", k.commit_dir,
                                  commit_dir_.empty() ? std::string("none") : commit_dir_)});
      return;
    }
    ensure_watchdog();  // it removes the directory should this agent die
    std::string error;
    keeper_ = spawn_keeper(commit_dir_, secret_, me_, &error);
    if (keeper_.channel < 0) {
      send(Keeping{0, error});
      return;
    }
    ERUN_LOG_DEBUG("{}: keeping commit replicas in {} (port {})", me_, commit_dir_, keeper_.port);
  }
  send(Keeping{static_cast<uint32_t>(keeper_.port), ""});
}

void Agent::unkeep(const Unkeep& u) {
  if (keeper_.channel >= 0) {
    stop_helper(std::exchange(keeper_.channel, -1), kReplicaStopWait);
    keeper_.port = 0;
    ERUN_LOG_DEBUG("{}: keeps commit replicas no more", me_);
  }
  arm_sweep(u.forget);
  sweep_replicas(SteadyClock::now());
}

void Agent::arm_sweep(bool all) {
  sweeping_ = true;
  sweep_all_ = all;
  sweep_every_ = 1s;
  next_sweep_ = SteadyClock::time_point{};  // at once
}

void Agent::sweep_replicas(SteadyClock::time_point now) {
  if (!sweeping_ || now < next_sweep_) return;
  if (keeper_.channel >= 0 || commit_dir_.empty()) {  // kept again since, or nothing held
    sweeping_ = false;
    return;
  }
  // `forget` holds only while no worker runs here: one that started since
  // may be restoring from a replica. Without it, only a worker's own commit
  // makes a replica redundant: with no worker, there is nothing to look at.
  const bool working = std::any_of(workers_.begin(), workers_.end(), [](auto& w) { return !w.second.reaped; });
  const bool all = sweep_all_ && !working;
  si::RemovedReplicas r;
  if (all || working) r = si::remove_replicas(commit_dir_, all);
  if (!r.names.empty()) {
    ERUN_LOG_INFO("{}: removed the commit replicas {} ({:.1f} MiB): {}", me_, join(r.names, ", "),
                  static_cast<double>(r.bytes) / (1 << 20),
                  all ? "no longer a keeper" : "this host's workers hold a commit as new");
  }
  // Looked at again a second later, then less often while nothing goes
  // (a State without a worker file, or workers still behind the replica).
  sweep_every_ = r.names.empty() ? std::min<std::chrono::milliseconds>(sweep_every_ * 2, 8s) : 1s;
  next_sweep_ = now + sweep_every_;
  sweeping_ = !(all || working) || r.left > 0;
}

void Agent::stop_pushers() {
  for (auto& [dir, p] : pushers_) stop_helper(p.channel, kReplicaStopWait);
  pushers_.clear();
}

void Agent::replicate(const Replicate& r) {
  if (r.keeper_dir.empty()) {  // stop every pusher
    stop_pushers();
    return;
  }
  const std::string to = fmt::format("{}:{}", r.host, r.port);
  const bool wanted = r.port > 0 && r.port <= 65535 && !r.host.empty();  // port 0: stop this keeper's pusher
  if (auto it = pushers_.find(r.keeper_dir); it != pushers_.end()) {
    // The driver repeats REPLICATE: a pusher that still runs to the same
    // address goes on; one that ended, or whose keeper moved, starts again.
    if (wanted && it->second.to == to && !helper_ended(it->second.channel)) return;
    stop_helper(it->second.channel, kReplicaStopWait);
    pushers_.erase(it);
  }
  if (!wanted || stopping_) return;
  if (commit_dir_.empty()) {
    ERUN_LOG_WARN("{}: cannot replicate commits to {}: this host keeps no commits", me_, to);
    return;
  }
  int fd = spawn_pusher(commit_dir_, secret_, r.host, static_cast<int>(r.port), r.keeper_dir, me_);
  if (fd < 0) {
    ERUN_LOG_ERROR("{}: cannot start pushing commit replicas to {}: {}", me_, to, std::strerror(errno));
    return;
  }
  pushers_[r.keeper_dir] = Pusher{fd, to};
  ERUN_LOG_DEBUG("{}: replicating commits from {} to {} ({})", me_, commit_dir_, to, r.keeper_dir);
}

void Agent::start_persister(const std::map<std::string, std::string>& env, const std::string& cwd) {
  if (std::exchange(persister_tried_, true) || commit_dir_.empty()) return;
  auto dir = env.find("ERUN_CHECKPOINT_DIR");
  auto interval = env.find("ERUN_PERSIST_INTERVAL_MS");
  long ms = 0;
  if (dir == env.end() || dir->second.empty() || interval == env.end() || !parse_int(interval->second, ms)) return;
  PersisterOptions po;
  po.commit_dir = commit_dir_;
  po.checkpoint_dir = dir->second[0] == '/' || cwd.empty() ? dir->second : cwd + "/" + dir->second;
  po.interval = std::chrono::milliseconds(std::max(ms, 0L));
  po.me = me_;
  persister_fd_ = spawn_persister(po);
  if (persister_fd_ < 0) ERUN_LOG_ERROR("{}: cannot start the persister: {}", me_, std::strerror(errno));
}

void Agent::ensure_watchdog() {
  if (watchdog_fd_ >= 0) {
    pollfd p{watchdog_fd_, 0, 0};
    if (::poll(&p, 1, 0) == 0) return;
    ERUN_LOG_WARN("{}: the watchdog ended: starting another", me_);
    close_fd(watchdog_fd_);
  }
  watchdog_fd_ = spawn_watchdog(
      std::chrono::duration_cast<std::chrono::milliseconds>(o_.heartbeat_timeout + kWatchdogSlack).count());
  last_watchdog_word_ = SteadyClock::now();
  if (watchdog_fd_ < 0) {
    ERUN_LOG_ERROR("{}: cannot start the watchdog: {}", me_, std::strerror(errno));
    return;
  }
  for (auto& [id, w] : workers_) {
    if (w.reaped) continue;
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(w.grace).count();
    (void)write_fully(watchdog_fd_, fmt::format("A {} {}\n", w.pid, ms));
  }
  if (relay_) (void)write_fully(watchdog_fd_, fmt::format("D {}\n", relay_->directory()));
  if (!attach_dir_.empty()) (void)write_fully(watchdog_fd_, fmt::format("T {}\n", attach_dir_));
  if (!commit_dir_.empty()) (void)write_fully(watchdog_fd_, fmt::format("C {}\n", commit_dir_));
}

int Agent::run() {
  log_prefix_init();
  if (!begin()) return 1;
  while (true) {
    auto now = SteadyClock::now();
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
    if (stopping_ && stopped(now)) break;
    ensure_watchdog();
    poll_once(now);
  }
  finish();
  return lost_ ? 1 : 0;
}

// Signals, the job secret, the watchdog, HELLO, and the frames that came
// with the secret.
bool Agent::begin() {
  // Signals the agent handles arrive through a signalfd; SIGPIPE is an error
  // return from write, not a death.
  ::signal(SIGPIPE, SIG_IGN);
  sigset_t handled;
  sigemptyset(&handled);
  for (int s : {SIGCHLD, SIGTERM, SIGHUP, SIGINT}) sigaddset(&handled, s);
  ::sigprocmask(SIG_BLOCK, &handled, nullptr);
  sig_fd_ = ::signalfd(-1, &handled, SFD_NONBLOCK | SFD_CLOEXEC);
  if (sig_fd_ < 0) {
    ERUN_LOG_ERROR("{}: signalfd: {}", me_, std::strerror(errno));
    return false;
  }
  in_fd_ = o_.in_fd;
  out_fd_ = o_.out_fd;
  if (!read_secret()) return false;
  set_nonblocking(in_fd_);
  set_nonblocking(out_fd_);
  if (o_.driver_grace > Duration::zero()) listen_for_attach();
  ensure_watchdog();
  last_heard_ = SteadyClock::now();
  send(Hello{kProtocolVersion, o_.host, ::getpid(), attach_path_});
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
    if (now >= attachers_[i].deadline) attachers_.erase(attachers_.begin() + static_cast<long>(i));
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
      ::kill(-w.pid, SIGKILL);
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
    if (!w.reaped) ::kill(-w.pid, SIGKILL);
  }
  return workers_.empty() || now >= stop_deadline_ + 2s;
}

// One poll round over the signalfd, the driver's channel, the workers'
// pipes and the relay, and what each ready descriptor asks for.
void Agent::poll_once(SteadyClock::time_point now) {
  std::vector<pollfd> fds;
  std::vector<std::pair<uint64_t, int>> streams;  // worker id, 1/2; from fds[3] on
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
  }
  Relay* relay = relay_.get();  // the one whose descriptors are listed (a START may make one)
  size_t relay_first = relay ? relay->add_fds(fds) : fds.size();
  const size_t attach_first = fds.size();
  fds.push_back({attach_listen_.get(), POLLIN, 0});
  for (auto& a : attachers_) fds.push_back({a.fd.get(), POLLIN, 0});
  const size_t attachers_listed = attachers_.size();
  int n = ::poll(fds.data(), fds.size(), poll_timeout_ms(now));
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
  stop_helper(std::exchange(persister_fd_, -1), lost_ ? std::chrono::seconds(5) : std::chrono::seconds(60));
  stop_pushers();
  stop_helper(std::exchange(keeper_.channel, -1), kReplicaStopWait);  // it ends before the directory goes
  if (!commit_dir_.empty()) release_commit_dir(commit_dir_, std::exchange(commit_lease_fd_, -1));
  attachers_.clear();
  attach_listen_.reset();
  if (!attach_path_.empty()) ::unlink(attach_path_.c_str());
  if (!attach_dir_.empty()) ::rmdir(attach_dir_.c_str());
  close_fd(watchdog_fd_);  // the watchdog finds no group left and exits
}

}  // namespace

int run_agent(const AgentOptions& options) { return Agent(options).run(); }

int run_attach_pump(const std::string& path, int in_fd, int out_fd) {
  ::signal(SIGPIPE, SIG_IGN);
  net::Address a;
  if (!net::unix_address(path, &a)) {
    ERUN_LOG_ERROR("erun --agent --attach {}: not a usable socket path", path);
    return 1;
  }
  net::Socket s = net::connect_unix(a, SteadyClock::now() + std::chrono::seconds(10));
  if (!s.ok()) {
    ERUN_LOG_ERROR("erun --agent --attach {}: cannot reach the agent ({}): it ended, or its host restarted", path,
                   s.outcome.text());
    return 1;
  }
  const int sock = s.fd.get();
  // Two directions, each a buffer that poll() drains; either side's end ends both.
  std::string to_sock, to_out;
  bool in_open = true;
  char chunk[kReadChunk];
  while (true) {
    pollfd fds[4] = {{in_open && to_sock.size() < kReadChunk * 16 ? in_fd : -1, POLLIN, 0},
                     {to_out.size() < kReadChunk * 16 ? sock : -1, POLLIN, 0},
                     {to_sock.empty() ? -1 : sock, POLLOUT, 0},
                     {to_out.empty() ? -1 : out_fd, POLLOUT, 0}};
    if (!in_open && to_sock.empty()) ::shutdown(sock, SHUT_WR);
    if (::poll(fds, 4, -1) < 0) {
      if (errno == EINTR) continue;
      return 1;
    }
    if (fds[0].revents) {
      ssize_t n = ::read(in_fd, chunk, sizeof chunk);
      if (n > 0) to_sock.append(chunk, static_cast<size_t>(n));
      if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) in_open = false;
    }
    if (fds[1].revents) {
      ssize_t n = ::recv(sock, chunk, sizeof chunk, 0);
      if (n > 0) to_out.append(chunk, static_cast<size_t>(n));
      if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) {
        (void)write_fully(out_fd, to_out);
        return 0;
      }
    }
    if (fds[2].revents && !to_sock.empty()) {
      ssize_t n = ::send(sock, to_sock.data(), to_sock.size(), MSG_NOSIGNAL);
      if (n > 0) to_sock.erase(0, static_cast<size_t>(n));
      if (n < 0 && errno != EINTR && errno != EAGAIN) return 0;
    }
    if (fds[3].revents && !to_out.empty()) {
      ssize_t n = ::write(out_fd, to_out.data(), to_out.size());
      if (n > 0) to_out.erase(0, static_cast<size_t>(n));
      if (n < 0 && errno != EINTR && errno != EAGAIN) return 0;
    }
    if (!in_open && to_sock.empty() && fds[1].fd < 0 && to_out.empty()) return 0;
  }
}

}  // namespace erun::agent
