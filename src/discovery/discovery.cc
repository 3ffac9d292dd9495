#include "discovery/discovery.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "common/fd.h"
#include "common/log.h"
#include "common/strings.h"
#include "common/subprocess.h"

namespace erun {

namespace {

constexpr size_t kMaxStdout = 16U << 20;
constexpr size_t kMaxStderrKept = 64U << 10;
constexpr int kStderrTailLines = 5;
// After the script exits, how long a process it left behind may keep its
// output pipes open before erun stops reading and kills it.
constexpr auto kDrainAfterExit = std::chrono::milliseconds(500);

// Reads what is available; false at EOF or on an error.
bool drain(int fd, std::string& out, size_t keep_last) {
  char buf[65536];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
      if (keep_last && out.size() > 2 * keep_last) out.erase(0, out.size() - keep_last);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    return false;
  }
}

// True once the child has exited; leaves it a zombie so that its pid, and so
// its process group id, cannot be reused until it is reaped.
bool exited_unreaped(pid_t pid) {
  siginfo_t info{};
  while (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) < 0) {
    if (errno != EINTR) return true;  // not our child any more
  }
  return info.si_pid == pid;
}

std::string stderr_tail(const std::string& err) {
  auto lines = split(trim(err), '\n');
  if (lines.size() == 1 && trim(lines[0]).empty()) return " (it printed nothing on stderr)";
  size_t from = lines.size() > kStderrTailLines ? lines.size() - kStderrTailLines : 0;
  std::string out = "; its stderr ends with:";
  for (size_t i = from; i < lines.size(); ++i) out += "\n    " + escape_for_log(trim(lines[i]));
  return out;
}

// When the script's first word is a path, checks it before running it so the
// user gets a precise message instead of the shell's.
Status precheck(const std::string& script) {
  auto cmd = trim(script);
  auto end = cmd.find_first_of(" \t");
  auto first = std::string(cmd.substr(0, end));
  if (first.empty()) return Status::error("the discovery script is empty: give a path to a script");
  if (first.find('/') == std::string::npos ||
      first.find_first_of("'\"\\$`;|&<>(){}*?~=") != std::string::npos) {
    return Status::ok();  // PATH lookup, VAR=value or shell syntax: the shell reports errors
  }
  struct stat st {};
  if (::stat(first.c_str(), &st) != 0) {
    char cwd[4096] = "?";
    if (!::getcwd(cwd, sizeof cwd)) std::strcpy(cwd, "?");
    return Status::error(fmt::format(
        "discovery script {} not found ({}; relative paths start from erun's working directory {})",
        first, std::strerror(errno), cwd));
  }
  if (S_ISDIR(st.st_mode)) {
    return Status::error(fmt::format("discovery script {} is a directory, not a script", first));
  }
  if (::access(first.c_str(), X_OK) != 0) {
    return Status::error(fmt::format(
        "discovery script {} is not executable: run chmod +x {} (and give it a #! line)", first,
        shell_quote(first)));
  }
  return Status::ok();
}

}  // namespace

ScriptDiscovery::ScriptDiscovery(std::string script, Duration timeout, int default_slots)
    : script_(std::move(script)), timeout_(timeout), default_slots_(default_slots) {}

std::string ScriptDiscovery::describe() const { return "script " + script_; }

// One run of the script: its output, and how it ended.
struct ScriptDiscovery::Run {
  std::string out, err;
  bool timed_out = false;
  bool too_much = false;
  std::optional<ExitStatus> status;  // none: it did not exit even after SIGKILL
};

Result<ScriptDiscovery::Run> ScriptDiscovery::run_script() {
  auto deadline = std::chrono::steady_clock::now() + timeout_;
  SpawnOptions opts;
  opts.argv = {"/bin/sh", "-c", script_};
  opts.new_process_group = true;
  opts.kill_with_parent = true;
  auto spawned = Subprocess::spawn(opts);
  if (!spawned) return Result<Run>::error(fmt::format("discovery script {}: {}", script_, spawned.message()));
  Subprocess& proc = *spawned;
  Fd out(proc.release_stdout());
  Fd err(proc.release_stderr());
  for (int fd : {out.get(), err.get()}) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);

  Run run;
  run.out.reserve(last_output_.size() + 1);
  std::optional<TimePoint> exited_at;
  while (true) {
    bool leader_gone = exited_unreaped(proc.pid());
    auto now = std::chrono::steady_clock::now();
    if (leader_gone && !exited_at) exited_at = now;
    if (leader_gone && out.get() < 0 && err.get() < 0) break;
    if (exited_at && now - *exited_at >= kDrainAfterExit) {
      ERUN_LOG_DEBUG("discovery script {} exited but left a process holding its output; killing it",
                     script_);
      break;
    }
    if (now >= deadline) {
      run.timed_out = true;
      break;
    }
    pollfd fds[2];
    nfds_t n = 0;
    for (int fd : {out.get(), err.get()}) {
      if (fd >= 0) fds[n++] = pollfd{fd, POLLIN, 0};
    }
    // Short polls: the exit of the script itself is noticed by waitid, not by a pipe.
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count();
    int wait_ms = static_cast<int>(std::clamp<long>(left + 1, 1, 20));
    if (n > 0) ::poll(fds, n, wait_ms);
    else ::usleep(static_cast<useconds_t>(std::min(wait_ms, 5)) * 1000);
    if (out.get() >= 0 && !drain(out.get(), run.out, 0)) out.reset();
    if (err.get() >= 0 && !drain(err.get(), run.err, kMaxStderrKept)) err.reset();
    if (run.out.size() > kMaxStdout) {
      run.too_much = true;
      break;
    }
  }
  // Kill whatever is left of its process group (children it started in the
  // background included) while the unreaped leader still holds the group id.
  ::kill(-proc.pid(), SIGKILL);
  run.status = proc.wait_for(std::chrono::seconds(5));
  return run;
}

std::optional<std::string> ScriptDiscovery::failure(const Run& run) const {
  if (run.timed_out) {
    return fmt::format(
        "discovery script {} hung: no result within --discovery-timeout ({:.3g} s); killed it and "
        "its child processes. Make it finish sooner or raise --discovery-timeout{}",
        script_, seconds(timeout_), stderr_tail(run.err));
  }
  if (run.too_much) {
    return fmt::format("discovery script {} printed more than {} MiB: it should print one host[:slots] per line",
                       script_, kMaxStdout >> 20);
  }
  if (!run.status) {
    return fmt::format("discovery script {} did not exit after it was killed (stuck in the kernel, e.g. on a "
                       "hung file system); it is tried again at the next --discovery-interval",
                       script_);
  }
  const ExitStatus& status = *run.status;
  if (status.ok()) return std::nullopt;
  std::string hint;
  if (status.code == 126) hint = " (the shell could not execute it: check chmod +x and its #! line)";
  if (status.code == 127) hint = " (command not found: check the path, or chmod +x and its #! line)";
  if (status.code > 128 && status.code < 128 + 65) {
    hint = fmt::format(" (the shell's way of saying it was killed by signal {}, {})", status.code - 128,
                       strsignal(status.code - 128));
  }
  return fmt::format("discovery script {} failed with {}{}{}", script_, status.describe(), hint,
                     stderr_tail(run.err));
}

Result<HostSet> ScriptDiscovery::discover() {
  using R = Result<HostSet>;
  if (auto st = precheck(script_); !st) return st;
  auto run = run_script();
  if (!run) return R::error(run.message());
  if (auto why = failure(*run)) return R::error(*why);
  if (last_parsed_ && run->out == last_output_) return *last_parsed_;
  auto hosts = parse_discovery_output(run->out, default_slots_);
  if (hosts) {
    last_output_ = std::move(run->out);
    last_parsed_ = *hosts;
  } else {
    last_parsed_.reset();
  }
  if (!hosts) {
    return R::error(fmt::format("discovery script {} printed bad output: {}; it must print one host[:slots] per line",
                                script_, hosts.message()));
  }
  return hosts;
}

void FakeDiscovery::set(HostSet hosts) {
  std::lock_guard lock(mu_);
  next_ = std::move(hosts);
}

void FakeDiscovery::set_error(std::string message) {
  std::lock_guard lock(mu_);
  next_ = Result<HostSet>::error(std::move(message));
}

Result<HostSet> FakeDiscovery::discover() {
  std::lock_guard lock(mu_);
  ++calls_;
  return next_;
}

DiscoveryLoop::DiscoveryLoop(HostDiscovery& discovery, Duration interval)
    : discovery_(discovery), interval_(interval) {}

DiscoveryLoop::~DiscoveryLoop() { stop(); }

Status DiscoveryLoop::first() {
  auto r = discovery_.discover();
  std::lock_guard lock(mu_);
  apply(r);
  return r.status();
}

void DiscoveryLoop::start() {
  std::lock_guard lock(mu_);
  if (thread_.joinable() || stop_) return;
  thread_ = std::thread([this] { run(); });
}

void DiscoveryLoop::stop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

DiscoveryLoop::Snapshot DiscoveryLoop::snapshot() const {
  std::lock_guard lock(mu_);
  return snap_;
}

long DiscoveryLoop::version() const {
  std::lock_guard lock(mu_);
  return snap_.version;
}

DiscoveryLoop::Snapshot DiscoveryLoop::wait_for_change(long seen, Duration timeout) const {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return snap_.version != seen || stop_; });
  return snap_;
}

void DiscoveryLoop::poke() {
  {
    std::lock_guard lock(mu_);
    poked_ = true;
  }
  cv_.notify_all();
}

void DiscoveryLoop::run() {
  std::unique_lock lock(mu_);
  // Without a first() on the caller's thread, the loop discovers at once.
  bool due = !attempted_;
  while (!stop_) {
    if (!due) cv_.wait_for(lock, interval_, [&] { return stop_ || poked_; });
    due = false;
    if (stop_) break;
    poked_ = false;
    lock.unlock();
    auto r = discovery_.discover();
    lock.lock();
    apply(r);
  }
}

// Called with mu_ held.
void DiscoveryLoop::apply(const Result<HostSet>& r) {
  attempted_ = true;
  if (!r) {
    snap_.last_error = r.message();
    ++snap_.failures_in_a_row;
    if (warned_.size() >= 64) warned_.clear();
    // The first discovery's failure is the caller's to report (it fails the start).
    if (have_good_ && warned_.insert(r.message()).second) {
      ERUN_LOG_WARN("host discovery ({}) failed, keeping the previous hosts ({}): {}. The job goes on with them; "
                    "fix the discovery (it is tried again every --discovery-interval; the same error is logged once)",
                    discovery_.describe(),
                    snap_.hosts.empty() ? std::string("none") : snap_.hosts.summary(),
                    r.message());
    }
    cv_.notify_all();
    return;
  }
  if (snap_.failures_in_a_row > 0 && have_good_) {
    ERUN_LOG_INFO("host discovery ({}) works again after {} failure(s)", discovery_.describe(),
                  snap_.failures_in_a_row);
  }
  snap_.last_error.clear();
  snap_.failures_in_a_row = 0;
  warned_.clear();
  if (!have_good_ || !(r.value() == snap_.hosts)) {
    if (have_good_) {
      ERUN_LOG_INFO("host discovery: {} (now {})", diff_hosts(snap_.hosts, r.value()).summary(),
                    r.value().empty() ? std::string("no hosts") : r.value().summary());
    }
    snap_.hosts = r.value();
    ++snap_.version;
    snap_.updated = std::chrono::steady_clock::now();
    have_good_ = true;
  }
  cv_.notify_all();
}

}  // namespace erun
