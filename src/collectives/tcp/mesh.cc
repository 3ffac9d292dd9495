#include "collectives/tcp/mesh.h"

#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <memory>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

#include "collectives/tcp/pair.h"
#include "common/log.h"

namespace erun::tcp {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// A connection that has not finished its handshake by then is dropped.
constexpr Duration kHandshakeTimeout = 5s;
// At most this many unauthenticated connections are kept; the oldest goes.
constexpr size_t kMaxPending = 256;

std::string key(int r) { return fmt::format("addr/{}", r); }

// One rank's part in forming the mesh: its listening socket, the pairs formed
// so far and the count of connections it refused.
class MeshForming {
 public:
  MeshForming(const TcpOptions& o, const std::string& who, const net::Interrupt& interrupt)
      : o_(o), who_(who), interrupt_(interrupt), fds_(o.size) {
    binding_.job_id = o.job_id;
    binding_.generation = o.generation;
    binding_.rank = o.rank;
    binding_.size = o.size;
    binding_.who = who;
  }

  std::vector<Fd> form(KvStore& store) {
    if (o_.secret.empty()) {
      throw std::invalid_argument("erun tcp: no job secret; the pairs of a multi-rank communicator must authenticate");
    }
    binding_.key = std::make_shared<const handshake::Key>(o_.secret);
    const auto start = Clock::now();
    const TimePoint deadline = start + (o_.connect_timeout > Duration::zero() ? o_.connect_timeout : o_.timeout);
    const std::string mine = listen_on_address();
    store.set(key(o_.rank), std::vector<char>(mine.begin(), mine.end()));
    // Higher ranks connect to lower ones: rank r first connects to 0..r-1
    // (each of which is already accepting, or finishing its own connects to
    // even lower ranks), then accepts r+1..size-1.
    for (int q = 0; q < o_.rank; ++q) {
      auto left = deadline - Clock::now();
      if (left <= Duration::zero()) throw CommError(fmt::format("erun tcp: {}: timed out waiting for rank {}'s address (it did not start its communicator: it may have failed; see its log)", who_, q));
      auto v = store.get(key(q), left);
      fds_[q] = connect_pair(binding_, q, std::string(v.begin(), v.end()), deadline, interrupt_);
    }
    accept_peers(deadline);
    listen_fd_.reset();
    ERUN_LOG_DEBUG("{}: tcp mesh of {} formed in {:.3f} s", who_, o_.size, seconds(Clock::now() - start));
    return std::move(fds_);
  }

 private:
  // Listens on o.address; returns the address:port it listens on.
  std::string listen_on_address() {
    net::Address e = resolve_address(o_.address, "0");
    if (e.is_wildcard()) {
      throw std::invalid_argument(fmt::format("erun tcp: address '{}' is the wildcard; give the address of this host "
                                              "that the peers reach it at", o_.address));
    }
    net::Socket s = net::listen(e, 128);
    if (!s.ok()) {
      if (s.outcome.call == "bind") {
        throw CommError(fmt::format("erun tcp: {}: cannot bind {}: {} (is it an address of this host?)", who_,
                                    o_.address, s.outcome.text()));
      }
      throw CommError(fmt::format("erun tcp: {}: {}", s.outcome.call, s.outcome.text()));
    }
    listen_fd_ = std::move(s.fd);
    return net::local_address(listen_fd_.get()).name();
  }

  // Accepts until every higher rank has authenticated. Strangers are handled
  // side by side with the real peers (a silent connection costs nothing but a
  // descriptor) and closed on the first wrong byte or after kHandshakeTimeout.
  void accept_peers(TimePoint deadline) {
    int missing = o_.size - 1 - o_.rank;
    std::deque<PendingPair> pending;
    while (missing > 0) {
      if (o_.cancelled && o_.cancelled()) {
        check_outcome({net::Outcome::kCancelled, 0, {}}, who_, "accepting the pair connections");
      }
      // Established pairs must stay up while the rest form: a peer that
      // died is noticed now, not at the first operation.
      std::vector<pollfd> pfds{{listen_fd_.get(), POLLIN, 0}, {interrupt_.fd, POLLIN, 0}};
      for (const Fd& fd : fds_) {
        if (fd) pfds.push_back({fd.get(), POLLRDHUP, 0});
      }
      const size_t first_pending = pfds.size();
      TimePoint wake = deadline;
      for (auto& p : pending) {
        pfds.push_back({p.fd.get(), POLLIN, 0});
        wake = std::min(wake, p.deadline);
      }
      wait(pfds, wake, deadline);
      check_established(pfds, first_pending);
      for (size_t i = first_pending; i < pfds.size(); ++i) {
        if (pfds[i].revents && advance(pending[i - first_pending])) --missing;
      }
      const auto now = Clock::now();
      for (auto& p : pending) {
        if (p.fd && now >= p.deadline) drop(p, "no complete handshake in time");
      }
      std::erase_if(pending, [](const PendingPair& p) { return !p.fd; });
      if (pfds[0].revents & POLLIN) accept_new(pending, deadline);
    }
    for (auto& p : pending) {
      if (p.fd) drop(p, "arrived after every peer had connected");
    }
    if (rejected_ > logged_rejections_) {
      ERUN_LOG_WARN("{}: {} connection(s) to the pair port were refused in all (not peers of this job, or peers "
                    "with another job secret); the communicator formed without them. If they are not yours, limit "
                    "who can reach the workers' ports",
                    who_, rejected_);
    }
  }

  // Polls the listening socket, the abort eventfd, the pairs and the pending
  // connections until `wake`; throws past the mesh's deadline and on abort.
  void wait(std::vector<pollfd>& pfds, TimePoint wake, TimePoint deadline) {
    int timeout = net::poll_ms(wake, 50ms);
    if (timeout == 0 && Clock::now() >= deadline) {
      std::string who_missing;
      for (int q = o_.rank + 1; q < o_.size; ++q) {
        if (!fds_[q]) who_missing += fmt::format("{}{}", who_missing.empty() ? "" : ", ", q);
      }
      throw CommError(fmt::format("erun tcp: {}: timed out waiting for rank(s) {} to connect (they failed, did not start, or cannot reach this host's port: see their log, and check that no firewall is between the hosts)", who_, who_missing));
    }
    int n = ::poll(pfds.data(), pfds.size(), timeout);
    if (n < 0 && errno != EINTR) throw CommError(fmt::format("erun tcp: poll: {}", std::strerror(errno)));
    if ((interrupt_.flag && *interrupt_.flag) || (pfds[1].revents & POLLIN)) {
      throw CommError(fmt::format("erun tcp: {}: aborted while forming the mesh", who_));
    }
  }

  // Throws when a formed pair (pfds[2, end)) closed.
  void check_established(const std::vector<pollfd>& pfds, size_t end) const {
    for (size_t i = 2; i < end; ++i) {
      if (pfds[i].revents & (POLLRDHUP | POLLHUP | POLLERR)) {
        int q = 0;
        while (fds_[q].get() != pfds[i].fd) ++q;
        throw CommError(fmt::format("erun tcp: {}: rank {} closed its connection while the mesh formed (it exited "
                                    "or failed)", who_, q));
      }
    }
  }

  // Reads what a pending connection sent; true when it became a peer.
  bool advance(PendingPair& p) {
    std::string why;
    switch (p.advance(binding_, fds_, &why)) {
      case PendingPair::Progress::kWaiting: return false;
      case PendingPair::Progress::kRefused: drop(p, why); return false;
      case PendingPair::Progress::kPeer: break;
    }
    fds_[p.from] = std::move(p.fd);  // p.fd is now invalid: erased from pending
    return true;
  }

  void accept_new(std::deque<PendingPair>& pending, TimePoint deadline) {
    while (true) {
      net::Address from;
      Fd fd = net::accept(listen_fd_.get(), &from);
      if (!fd) break;
      if (pending.size() >= kMaxPending) {
        drop(pending.front(), "too many unauthenticated connections; dropping the oldest");
        pending.pop_front();
      }
      pending.emplace_back(std::move(fd), from.name(), std::min(deadline, Clock::now() + kHandshakeTimeout));
    }
  }

  void drop(PendingPair& p, const std::string& why) {
    reject(p.peer, why);
    p.fd.reset();
  }

  // Logs a refused connection: the first few, then at most one line a second.
  void reject(const std::string& peer, const std::string& why) {
    ++rejected_;
    const auto now = Clock::now();
    if (logged_rejections_ < 5 || now - last_reject_log_ >= 1s) {
      ERUN_LOG_WARN("{}: closed a connection from {} to the pair port: {} ({} refused so far; the communicator "
                    "keeps waiting for its real peers)",
                    who_, peer, why, rejected_);
      ++logged_rejections_;
      last_reject_log_ = now;
    }
  }

  const TcpOptions& o_;
  const std::string& who_;
  const net::Interrupt& interrupt_;
  PairBinding binding_;
  std::vector<Fd> fds_;  // by rank; invalid for self
  Fd listen_fd_;
  size_t rejected_ = 0;
  size_t logged_rejections_ = 0;
  TimePoint last_reject_log_{};
};

}  // namespace

std::vector<Fd> form_mesh(KvStore& store, const TcpOptions& o, const std::string& who, const net::Interrupt& interrupt) {
  return MeshForming(o, who, interrupt).form(store);
}

}  // namespace erun::tcp
