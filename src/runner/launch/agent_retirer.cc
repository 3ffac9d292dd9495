#include "runner/launch/agent_retirer.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <optional>

#include <fmt/format.h>

#include "agent/protocol.h"
#include "common/log.h"
#include "common/strings.h"

namespace erun {

using SteadyClock = std::chrono::steady_clock;
using namespace std::chrono_literals;

const char* to_string(AgentRetirer::Outcome o) {
  switch (o) {
    case AgentRetirer::Outcome::kRetired: return "retired";
    case AgentRetirer::Outcome::kSuperseded: return "held by a newer driver";
    case AgentRetirer::Outcome::kGone: return "gone";
    case AgentRetirer::Outcome::kUnreachable: return "host unreachable";
    case AgentRetirer::Outcome::kTimedOut: return "no answer in time";
  }
  return "?";
}

struct AgentRetirer::Try {
  Subprocess channel;
  TimePoint deadline{};
  agent::FrameReader reader;
  std::string err_tail;  // the transport's last stderr bytes (ssh's reason)
  bool out_open = true;
};

struct AgentRetirer::Entry {
  std::string host, path, secret, reason;
  uint64_t term = 0;
  TimePoint since{};
  TimePoint next_try{};
  Duration gap{};
  int tries = 0;
  std::optional<Try> current;
  std::optional<Outcome> last;
  std::string last_detail;
  bool done = false;
};

AgentRetirer::AgentRetirer(Open open, Options options) : open_(std::move(open)), options_(options) {
  thread_ = std::thread([this] { run(); });
}

AgentRetirer::~AgentRetirer() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  // The tries still in flight end with their Subprocess (SIGKILL of its group).
}

void AgentRetirer::set_driver(const std::string& secret, uint64_t term) {
  std::lock_guard lock(mu_);
  secret_ = secret;
  term_ = term;
}

void AgentRetirer::add(const std::string& host, const std::string& path, const std::string& reason) {
  if (path.empty()) return;
  std::lock_guard lock(mu_);
  if (stop_ || secret_.empty()) return;
  for (auto& e : entries_) {
    if (e->host == host && e->path == path) return;
  }
  auto e = std::make_unique<Entry>();
  e->host = host;
  e->path = path;
  e->secret = secret_;
  e->term = term_;
  e->reason = reason;
  e->since = e->next_try = SteadyClock::now();
  e->gap = options_.first_gap;
  ERUN_LOG_INFO("agent on {}: lost while it may hold its workers for a new erun (--driver-grace): erun tells it the job "
                "went on without them as soon as the host can be reached",
                host);
  entries_.push_back(std::move(e));
  cv_.notify_all();
}

size_t AgentRetirer::left() const {
  std::lock_guard lock(mu_);
  return static_cast<size_t>(std::count_if(entries_.begin(), entries_.end(), [](auto& e) { return !e->done; }));
}

std::optional<AgentRetirer::Outcome> AgentRetirer::last_outcome(const std::string& path) const {
  std::lock_guard lock(mu_);
  for (auto& e : entries_) {
    if (e->path == path) return e->last;
  }
  return std::nullopt;
}

size_t AgentRetirer::finish(Duration limit) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, limit, [&] { return std::all_of(entries_.begin(), entries_.end(), [](auto& e) { return e->done; }); });
  stop_ = true;
  size_t left = 0;
  for (auto& e : entries_) {
    if (e->done) continue;
    ++left;
    ERUN_LOG_WARN("agent on {}: could not be told that the job went on without it ({} tr{}, the last: {}{}): its "
                  "workers stop by themselves at the end of --driver-grace",
                  e->host, e->tries, e->tries == 1 ? "y" : "ies", e->last ? to_string(*e->last) : "none ended",
                  e->last_detail.empty() ? "" : ": " + e->last_detail);
  }
  lock.unlock();
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  return left;
}

void AgentRetirer::abandon() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void AgentRetirer::run() {
  std::unique_lock lock(mu_);
  while (!stop_) {
    tend();
    cv_.wait_for(lock, options_.tick, [&] { return stop_; });
  }
  for (auto& e : entries_) e->current.reset();  // kills what is in flight
}

void AgentRetirer::tend() {
  const TimePoint now = SteadyClock::now();
  bool any_done = false;
  for (auto& ep : entries_) {
    Entry& e = *ep;
    if (e.done) continue;
    if (e.current) {
      if (check_try(e, now)) any_done = any_done || e.done;
      continue;
    }
    if (now >= e.next_try) start_try(e);
  }
  if (any_done) cv_.notify_all();
}

void AgentRetirer::start_try(Entry& e) {
  const TimePoint now = SteadyClock::now();
  ++e.tries;
  auto channel = open_(e.host, e.path);
  if (!channel) {
    // On this machine, a socket that refuses or is gone: the agent ended.
    end_try(e, Outcome::kGone, channel.message(), now);
    return;
  }
  Try t{std::move(channel).value(), now + options_.try_limit, {}, {}, true};
  for (int fd : {t.channel.stdin_fd(), t.channel.stdout_fd(), t.channel.stderr_fd()}) {
    if (fd >= 0) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  }
  // A few hundred bytes: the pipe or socket takes them at once.
  std::string ask = e.secret + "\n" + agent::encode(agent::Retire{e.term, e.reason});
  sigset_t pipe_set, old;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
  (void)!::write(t.channel.stdin_fd(), ask.data(), ask.size());
  timespec zero{0, 0};
  while (sigtimedwait(&pipe_set, nullptr, &zero) == SIGPIPE) {
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  e.current.emplace(std::move(t));
}

bool AgentRetirer::check_try(Entry& e, TimePoint now) {
  Try& t = *e.current;
  char buf[4096];
  if (int fd = t.channel.stderr_fd(); fd >= 0) {
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof buf)) > 0) {
      t.err_tail.append(buf, static_cast<size_t>(n));
      if (t.err_tail.size() > 1024) t.err_tail.erase(0, t.err_tail.size() - 1024);
    }
  }
  if (read_answer(e, now)) return true;
  if (!t.out_open) return channel_closed(e, now);
  if (now >= t.deadline) {
    end_try(e, Outcome::kTimedOut, "", now);
    return true;
  }
  return false;
}

bool AgentRetirer::read_answer(Entry& e, TimePoint now) {
  Try& t = *e.current;
  char buf[4096];
  while (t.out_open) {
    ssize_t n = ::read(t.channel.stdout_fd(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n <= 0) {
      t.out_open = false;
      break;
    }
    t.reader.feed(std::string_view(buf, static_cast<size_t>(n)));
    while (true) {
      auto m = t.reader.next();
      if (!m) {
        end_try(e, Outcome::kGone, "it sent a malformed frame", now);
        return true;
      }
      if (!m->has_value()) break;
      if (auto* r = std::get_if<agent::Retired>(&m->value())) {
        ERUN_LOG_WARN("agent on {}: reached again {:.1f} s after it was lost, and told that the job went on without "
                      "it: its {} worker(s) there stop now",
                      e.host, std::chrono::duration<double>(now - e.since).count(), r->workers);
        end_try(e, Outcome::kRetired, "", now);
        return true;
      }
      if (auto* s = std::get_if<agent::Superseded>(&m->value())) {
        ERUN_LOG_INFO("agent on {}: obeys driver term {} now: it is that driver's, not this one's to retire", e.host,
                      s->term);
        end_try(e, Outcome::kSuperseded, "", now);
        return true;
      }
      // Anything else (an agent of another version): not this try's answer.
    }
  }
  return false;
}

bool AgentRetirer::channel_closed(Entry& e, TimePoint now) {
  Try& t = *e.current;
  // No answer and the channel closed: the process's exit says why.
  std::optional<ExitStatus> st;
  if (t.channel.pid() > 0) st = t.channel.poll();
  if (t.channel.pid() > 0 && !st && now < t.deadline) return false;  // its exit comes at a later look
  std::string why(trim(t.err_tail));
  if (size_t nl = why.rfind('\n'); nl != std::string::npos) why = why.substr(nl + 1);
  why = escape_for_log(why, 300);
  // ssh's 255: the host could not be reached (or refused us): again later.
  // Anything else: `erun --agent --attach` found no agent there.
  if (st && st->code == 255) {
    end_try(e, Outcome::kUnreachable, why, now);
  } else {
    end_try(e, Outcome::kGone, why.empty() && st ? st->describe() : why, now);
  }
  return true;
}

void AgentRetirer::end_try(Entry& e, Outcome outcome, const std::string& detail, TimePoint now) {
  e.current.reset();  // a process still running is killed with its group
  e.last = outcome;
  e.last_detail = detail;
  if (outcome == Outcome::kUnreachable || outcome == Outcome::kTimedOut) {
    e.next_try = now + e.gap;
    e.gap = std::min<Duration>(e.gap * 2, options_.max_gap);
    ERUN_LOG_DEBUG("agent on {}: try {} to retire it: {}{}", e.host, e.tries, to_string(outcome),
                   detail.empty() ? "" : ": " + detail);
    return;
  }
  if (outcome == Outcome::kGone) {
    ERUN_LOG_INFO("agent on {}: ended already ({}): nothing of it to retire", e.host,
                  detail.empty() ? "its attach socket is gone" : detail);
  }
  e.done = true;
}

}  // namespace erun
