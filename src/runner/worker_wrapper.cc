#include "runner/worker_wrapper.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include <fmt/format.h>

#include "common/log.h"
#include "common/strings.h"

namespace erun {

namespace {

bool is_identifier(const std::string& s) {
  if (s.empty() || (s[0] >= '0' && s[0] <= '9')) return false;
  for (char c : s) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    if (!ok) return false;
  }
  return true;
}

// The supervisor's fixed part. Names start with _erun_ so that the worker's env
// cannot clash with them. @GRACE@ is the grace in tenths of a second.
//
// Non-interactive shells start asynchronous lists with SIGINT and SIGQUIT
// ignored, and that cannot be undone with `trap` in sh; so the worker is a
// *foreground* command of the pipeline's left side, and the reader on the
// right learns its pid through the pipe:
//  - left: forwards erun's control lines (fd 3, saved stdin) into the pipe
//    (then "EOF"), runs `setsid` in the foreground (it is not a group leader,
//    so setsid(2) happens in place, no fork); the worker's first act, now a
//    session leader, is to send "W <pid>"; when it ends: "X <status>".
//  - right: acts on control lines (queued until the worker's pid is known),
//    and on "X" SIGKILLs what is left of the worker's group and exits with
//    the worker's status, which is the pipeline's and so the script's.
// Every helper ends by itself: nothing is left behind. The grace ends early
// when the worker's own process is gone (its group may hold zombies that a
// container's init never reaps; kill -0 would count them).
constexpr const char* kControlLoop = R"(exec 3<&0 </dev/null 4>&1
{
  { while IFS= read -r _erun_l; do printf '%s\n' "$_erun_l"; done; echo EOF; } <&3 &
  _erun_f=$!
  setsid -- /bin/sh -c 'echo "W $$" >&5; exec "$@" 5>&-' erun-worker @COMMAND@ 5>&1 >&4 4>&- 3<&-
  _erun_s=$?
  kill -KILL $_erun_f 2>/dev/null
  echo "X $_erun_s"
} | {
  _erun_w=
  _erun_p=
  _erun_stop() {
    kill -TERM -$_erun_w 2>/dev/null
    _erun_i=0
    while [ $_erun_i -lt @GRACE@ ] && kill -0 $_erun_w 2>/dev/null; do
      sleep 0.1 2>/dev/null || sleep 1
      _erun_i=$((_erun_i + 1))
    done
    kill -KILL -$_erun_w 2>/dev/null
  }
  _erun_do() {
    case $1 in
      TERM|EOF) _erun_stop ;;
      KILL) kill -KILL -$_erun_w ;;
      INT) kill -INT -$_erun_w ;;
      "SIG "*)
        _erun_n=${1#SIG }
        case $_erun_n in
          ''|*[!0-9]*) ;;
          *) kill -$_erun_n -$_erun_w ;;
        esac ;;
    esac
  }
  while IFS= read -r _erun_c; do
    case $_erun_c in
      "W "*)
        _erun_w=${_erun_c#W }
        if [ -n "$_erun_p" ]; then _erun_do "$_erun_p"; fi ;;
      "X "*)
        if [ -n "$_erun_w" ]; then kill -KILL -$_erun_w; fi
        exit ${_erun_c#X } ;;
      *)
        if [ -n "$_erun_w" ]; then
          _erun_do "$_erun_c"
        else
          case $_erun_c in
            KILL) _erun_p=KILL ;;
            TERM|EOF) if [ "$_erun_p" != KILL ]; then _erun_p=TERM; fi ;;
            *) if [ -z "$_erun_p" ]; then _erun_p=$_erun_c; fi ;;
          esac
        fi ;;
    esac
  done
  exit 125
} >/dev/null 2>&1 3<&- 4>&-
)";

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) {
    s.replace(at, from.size(), to);
  }
}

}  // namespace

Status validate_worker_spec(const WorkerSpec& spec) {
  if (spec.command.empty()) return Status::error("worker command is empty: give the program to run");
  for (const auto& [name, value] : spec.env) {
    if (!is_identifier(name)) {
      return Status::error(fmt::format(
          "environment variable name '{}' is not a shell identifier: use letters, digits and _", name));
    }
  }
  if (spec.secret.find('\n') != std::string::npos) {
    return Status::error("job secret contains a newline: it must be one line");
  }
  return Status::ok();
}

std::string worker_script(const WorkerSpec& spec) {
  std::string s;
  for (const auto& [name, value] : spec.env) {
    s += fmt::format("export {}={}\n", name, shell_quote(value));
  }
  s += fmt::format(
      "IFS= read -r ERUN_SECRET || {{ echo 'erun: no job secret on stdin (erun gone?)' >&2; exit {}; }}\n"
      "export ERUN_SECRET\n",
      kWrapperNoSecret);
  if (!spec.cwd.empty()) {
    s += fmt::format(
        "cd -- {0} 2>/dev/null || {{ printf 'erun: cannot enter the working directory %s on %s: "
        "create it or pass another working directory\\n' {0} \"$(uname -n)\" >&2; exit {1}; }}\n",
        shell_quote(spec.cwd), kWrapperSetupFailed);
  }
  s += fmt::format(
      "command -v setsid >/dev/null 2>&1 || {{ printf 'erun: setsid (util-linux) not found on %s: "
      "install it there\\n' \"$(uname -n)\" >&2; exit {}; }}\n",
      kWrapperSetupFailed);

  std::string command;
  for (const auto& word : spec.command) command += (command.empty() ? "" : " ") + shell_quote(word);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(spec.term_grace).count();
  long tenths = std::max<long>(1, (ms + 99) / 100);

  std::string loop = kControlLoop;
  replace_all(loop, "@COMMAND@", command);
  replace_all(loop, "@GRACE@", std::to_string(tenths));
  return s + loop;
}

std::string control_line_terminate() { return "TERM\n"; }
std::string control_line_kill() { return "KILL\n"; }
std::string control_line_signal(int sig) {
  if (sig == SIGKILL) return control_line_kill();
  if (sig == SIGINT) return "INT\n";
  return fmt::format("SIG {}\n", sig);
}

bool write_control(int fd, std::string_view data) {
  if (fd < 0) return false;
  // Block SIGPIPE in this thread, write, and swallow a SIGPIPE we caused.
  sigset_t pipe_set, old_set;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  sigset_t pending;
  sigpending(&pending);
  bool was_pending = sigismember(&pending, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_set, &old_set);

  bool ok = true;
  size_t done = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) &&
        std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 50);
      continue;
    }
    ok = false;
    break;
  }

  if (!ok && errno == EPIPE && !was_pending) {
    timespec zero{0, 0};
    while (sigtimedwait(&pipe_set, nullptr, &zero) < 0 && errno == EINTR) {
    }
  }
  pthread_sigmask(SIG_SETMASK, &old_set, nullptr);
  return ok;
}

std::optional<pid_t> find_supervised_worker(pid_t supervisor_group) {
  struct Proc {
    long pid, ppid, pgrp, session;
  };
  std::vector<Proc> procs;
  DIR* dir = ::opendir("/proc");
  if (!dir) return std::nullopt;
  while (dirent* e = ::readdir(dir)) {
    long pid;
    if (!parse_int(e->d_name, pid)) continue;
    std::ifstream in(fmt::format("/proc/{}/stat", pid));
    std::string stat;
    if (!std::getline(in, stat)) continue;
    // pid (comm) state ppid pgrp session ...; comm may hold spaces and parens.
    size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 1));
    std::string state;
    Proc p{pid, 0, 0, 0};
    if (rest >> state >> p.ppid >> p.pgrp >> p.session && state != "Z") procs.push_back(p);
  }
  ::closedir(dir);
  for (const auto& w : procs) {
    if (w.session != w.pid || w.pgrp != w.pid) continue;
    for (const auto& parent : procs) {
      if (parent.pid == w.ppid && parent.pgrp == supervisor_group) return static_cast<pid_t>(w.pid);
    }
  }
  return std::nullopt;
}

Status SupervisedWorker::start_control(Subprocess& process, const std::string& secret,
                                       const std::string& what) {
  int fd = process.stdin_fd();
  ERUN_CHECK(fd >= 0);
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  if (!write_control(fd, secret + "\n")) {
    return Status::error(fmt::format("{}: the supervisor exited before it read the job secret", what));
  }
  return Status::ok();
}

SupervisedWorker::SupervisedWorker(Subprocess process, bool local)
    : process_(std::move(process)), local_(local) {}

SupervisedWorker::~SupervisedWorker() {
  if (process_.poll()) return;
  send(control_line_kill());
  if (local_) kill_worker_group();
  process_.close_stdin();
  // The supervisor (or ssh, once the remote one ended) exits within moments;
  // the Subprocess destructor SIGKILLs its group if it did not.
  (void)process_.wait_for(std::chrono::seconds(local_ ? 1 : 3));
}

std::optional<ExitStatus> SupervisedWorker::poll() { return process_.poll(); }

void SupervisedWorker::terminate() { send(control_line_terminate()); }

void SupervisedWorker::kill() {
  if (process_.poll()) return;
  send(control_line_kill());
  if (local_) {
    kill_worker_group();
    process_.signal(SIGKILL);
  }
}

void SupervisedWorker::signal(int sig) {
  if (process_.poll()) return;
  send(control_line_signal(sig));
}

void SupervisedWorker::send(const std::string& line) { (void)write_control(process_.stdin_fd(), line); }

void SupervisedWorker::kill_worker_group() {
  if (auto worker = find_supervised_worker(process_.pid())) ::kill(-*worker, SIGKILL);
}

Result<std::unique_ptr<WorkerHandle>> launch_through(const WorkerSpec& spec, std::vector<std::string> argv,
                                                      const std::string& via, const std::string& hint) {
  using R = Result<std::unique_ptr<WorkerHandle>>;
  SpawnOptions options;
  options.argv = std::move(argv);
  options.pipe_stdin = true;
  options.pipe_stdout = true;
  options.pipe_stderr = true;
  options.new_process_group = true;
  auto process = Subprocess::spawn(options);
  if (!process) {
    return R::error(fmt::format("rank {} on {}: {} ({})", spec.rank, spec.host, process.message(), hint));
  }
  Subprocess p = std::move(process).value();
  // ssh and srun hold stdin until the connection or step is up, then forward
  // it: the secret write succeeds even if the host turns out unreachable, and
  // poll() then reports the failure (255 for ssh).
  std::string what = fmt::format("rank {} on {} ({})", spec.rank, spec.host, via);
  if (Status s = SupervisedWorker::start_control(p, spec.secret, what); !s) return R(s);
  return std::unique_ptr<WorkerHandle>(new SupervisedWorker(std::move(p), /*local=*/false));
}

}  // namespace erun
