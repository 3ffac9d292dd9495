#include "agent/watchdog.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "agent/commit_dir.h"
#include "agent/detached.h"
#include "agent/protocol.h"
#include "common/oom.h"
#include "common/strings.h"

namespace erun::agent {

void WatchdogState::feed(std::string_view bytes) {
  partial.append(bytes);
  size_t nl;
  while ((nl = partial.find('\n')) != std::string::npos) {
    const std::string line = partial.substr(0, nl);
    partial.erase(0, nl + 1);
    apply(line);
  }
}

void WatchdogState::apply(std::string_view line) {
  if (line.rfind("D /", 0) == 0) {
    relay_dir = std::string(line.substr(2));
    return;
  }
  if (line.rfind("C /", 0) == 0) {
    commit_dir = std::string(line.substr(2));
    return;
  }
  if (line.rfind("T /", 0) == 0) {
    attach_dir = std::string(line.substr(2));
    return;
  }
  if (line == "E") {
    ended_on_purpose = true;
    return;
  }
  if (line == "o") {
    channel_dropped = true;
    return;
  }
  auto words = split(line, ' ');
  long pgid = 0, grace = 0;
  if (words.size() == 3 && words[0] == "A" && parse_int(words[1], pgid) && parse_int(words[2], grace) && pgid > 1) {
    groups[static_cast<pid_t>(pgid)] = grace;
  } else if (words.size() == 2 && words[0] == "R" && parse_int(words[1], pgid)) {
    groups.erase(static_cast<pid_t>(pgid));
  } else if (long ms = 0; words.size() == 2 && words[0] == "G" && parse_int(words[1], ms) && ms >= 0) {
    keep_commits_until = ms == 0 ? std::chrono::steady_clock::time_point{}
                                 : std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  }
}

namespace {

using SteadyClock = std::chrono::steady_clock;

// One read of the agent's channel: its bytes into `chunk`, and the
// descriptor it passed with them (SCM_RIGHTS), if any, into `*fd`.
ssize_t receive(int channel, char* chunk, size_t size, int* fd) {
  iovec io{chunk, size};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  msghdr m{};
  m.msg_iov = &io;
  m.msg_iovlen = 1;
  m.msg_control = control;
  m.msg_controllen = sizeof control;
  ssize_t n = ::recvmsg(channel, &m, MSG_CMSG_CLOEXEC);
  for (cmsghdr* c = n > 0 ? CMSG_FIRSTHDR(&m) : nullptr; c; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && c->cmsg_len == CMSG_LEN(sizeof(int))) {
      std::memcpy(fd, CMSG_DATA(c), sizeof(int));
    }
  }
  return n;
}

// The agent's channel to its driver, as the agent last handed it over, and
// the OOM count of the agent's cgroup as of the agent's last word.
struct DriverChannel {
  int fd = -1;
  OomWatch oom;
  void take(int new_fd) {
    if (fd >= 0) ::close(fd);
    fd = new_fd;
  }
  // The agent ended without a word: ENDED is the stream's last frame.
  void tell_ended() {
    if (fd < 0) return;
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);  // the agent, which shared it, is gone
    const std::string frame = encode(Ended{static_cast<uint8_t>(oom.fired() ? 1 : 0)});
    (void)!::write(fd, frame.data(), frame.size());
  }
};

// Reads the agent's lines into `state` until the channel ends or the agent has
// been silent for `silence_ms` (0: never), which SIGKILLs the agent. Keeps
// the agent's driver channel in `driver` (closed on "o" and "E").
void listen(int fd, pid_t agent, long silence_ms, WatchdogState& state, DriverChannel& driver) {
  char chunk[4096];
  auto last_word = SteadyClock::now();
  while (true) {
    int wait_ms = -1;
    if (silence_ms > 0) {
      auto quiet = std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - last_word).count();
      if (quiet >= silence_ms) {
        // Still our parent, so the pid is the agent's (not reaped, not reused).
        if (::getppid() == agent) ::kill(agent, SIGKILL);
        return;
      }
      wait_ms = static_cast<int>(silence_ms - quiet);
    }
    pollfd p{fd, POLLIN, 0};
    int ready = ::poll(&p, 1, wait_ms);
    if (ready < 0 && errno != EINTR) return;
    if (ready <= 0) continue;
    int passed = -1;
    ssize_t n = receive(fd, chunk, sizeof chunk, &passed);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    last_word = SteadyClock::now();
    state.feed(std::string_view(chunk, static_cast<size_t>(n)));
    // In the order sent: the lines of this read, then the descriptor that
    // came with its "O" (a read ends with the bytes that carry one).
    if (state.channel_dropped || state.ended_on_purpose) {
      state.channel_dropped = false;
      driver.take(-1);
    }
    if (passed >= 0 && state.ended_on_purpose) {
      ::close(passed);
    } else if (passed >= 0) {
      driver.take(passed);
    }
    // Alive and talking: a later OOM kill is what ENDED reports (read again
    // each time: the agent may have been moved to another cgroup).
    if (driver.fd >= 0 && ::getppid() == agent) driver.oom = OomWatch::of(agent);
  }
}

// SIGTERM to every group, up to the longest grace for them to end, SIGKILL.
void stop_groups(const std::map<pid_t, long>& groups) {
  long grace = 0;
  for (auto& [g, ms] : groups) {
    if (::kill(-g, SIGTERM) == 0) grace = std::max(grace, ms);
  }
  auto deadline = SteadyClock::now() + std::chrono::milliseconds(grace);
  while (SteadyClock::now() < deadline) {
    bool any = false;
    for (auto& [g, ms] : groups) any = any || ::kill(-g, 0) == 0;
    if (!any) break;
    ::usleep(50 * 1000);
  }
  for (auto& [g, ms] : groups) ::kill(-g, SIGKILL);
}

// Runs in the forked child, in its own session, with every inherited
// descriptor but its channel (fd) closed.
[[noreturn]] void watchdog_main(int fd, pid_t agent, long silence_ms) {
  WatchdogState state;
  DriverChannel driver;
  listen(fd, agent, silence_ms, state, driver);
  if (!state.ended_on_purpose) driver.tell_ended();
  driver.take(-1);  // the driver's side of the channel ends with this
  stop_groups(state.groups);
  // A killed agent leaves the relay's socket behind: unlink and rmdir, never
  // through a link, never a directory with anything else in it.
  if (!state.relay_dir.empty()) {
    ::unlink((state.relay_dir + "/rdzv").c_str());
    ::rmdir(state.relay_dir.c_str());
  }
  if (!state.attach_dir.empty()) {
    ::unlink((state.attach_dir + "/attach").c_str());
    ::unlink((state.attach_dir + "/" + kDriverFile).c_str());
    ::unlink((state.attach_dir + "/" + kDriverFileTemp).c_str());
    ::rmdir(state.attach_dir.c_str());
  }
  if (!state.commit_dir.empty()) {
    // With a driver, it starts the host's agent again at once (or one that
    // only holds the memory, when the host may not run workers now); without
    // one, the memory waits for a new driver as the workers did.
    auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(state.keep_commits_until -
                                                                      SteadyClock::now());
    adopt_or_remove_commit_dir(state.commit_dir, std::max<std::chrono::milliseconds>(wait, kCommitAdoptGrace));
  }
  ::_exit(0);
}

}  // namespace

bool send_channel_to_watchdog(int watchdog_fd, int channel_fd) {
  if (watchdog_fd < 0) return false;
  char text[] = "O\n";
  if (channel_fd < 0) text[0] = 'o';
  iovec io{text, 2};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr m{};
  m.msg_iov = &io;
  m.msg_iovlen = 1;
  if (channel_fd >= 0) {
    m.msg_control = control;
    m.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &channel_fd, sizeof(int));
  }
  ssize_t n;
  do {
    n = ::sendmsg(watchdog_fd, &m, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  return n == 2;
}

int spawn_watchdog(long silence_ms, std::string_view first_lines) {
  const pid_t agent = ::getpid();
  // stderr on /dev/null: the watchdog outlives the driver's connection.
  // It is not the agent's to reap through SIGCHLD bookkeeping: it is reaped
  // with the workers' waitpid(-1) and ignored there.
  return spawn_helper([agent, silence_ms](int channel) { watchdog_main(channel, agent, silence_ms); },
                      /*keep_stderr=*/false, first_lines);
}

}  // namespace erun::agent
