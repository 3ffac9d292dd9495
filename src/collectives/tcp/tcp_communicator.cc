#include "collectives/tcp/tcp_communicator.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "collectives/reduce_kernels.h"
#include "collectives/tcp/mesh.h"
#include "common/check.h"
#include "common/fd.h"
#include "common/log.h"
#include "common/net.h"

namespace erun {
namespace {

static_assert(std::endian::native == std::endian::little, "the pair wire format is little-endian");

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// An idle sender thread outwaits its caller by this much past the operation's
// deadline: the caller, blocked on a receive, is the one that names a peer.
constexpr Duration kIdleSenderGrace = 2s;

// ---- data frames ------------------------------------------------------------

constexpr uint32_t kFrameMagic = 0x46504545;  // "EEPF"
constexpr uint8_t kFrameVersion = 1;

enum class Op : uint8_t { kAllreduce = 1, kBroadcast = 2, kAllgather = 3, kAllgathervSizes = 4, kAllgatherv = 5, kBarrier = 6 };

const char* op_name(uint8_t op) {
  switch (static_cast<Op>(op)) {
    case Op::kAllreduce: return "allreduce";
    case Op::kBroadcast: return "broadcast";
    case Op::kAllgather: return "allgather";
    case Op::kAllgathervSizes:
    case Op::kAllgatherv: return "allgatherv";
    case Op::kBarrier: return "barrier";
  }
  return "unknown-op";
}

// What a collective call is, as both ends must agree on it.
struct Call {
  Op op = Op::kBarrier;
  uint8_t dtype = 0;
  uint8_t reduce = 0;
  uint64_t count = 0;  // elements for allreduce, bytes otherwise
  int32_t root = 0;
};

struct FrameHeader {
  uint32_t magic;
  uint8_t version, op, dtype, reduce;
  uint32_t generation;
  int32_t from;
  uint64_t seq;
  uint64_t count;
  uint64_t offset;
  uint64_t length;
  int32_t root;
  uint32_t check;  // FNV-1a of the bytes before it
};
static_assert(sizeof(FrameHeader) == 56, "FrameHeader must have no padding");

uint32_t fnv1a(const void* p, size_t n) {
  uint32_t h = 2166136261u;
  auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 16777619u;
  return h;
}

std::string describe(uint8_t op, uint8_t dtype, uint8_t reduce, uint64_t count, int32_t root) {
  switch (static_cast<Op>(op)) {
    case Op::kAllreduce:
      return fmt::format("allreduce({} x {}, {})", count, dtype <= 6 ? to_string(static_cast<DataType>(dtype)) : "?",
                         reduce <= 4 ? to_string(static_cast<ReduceOp>(reduce)) : "?");
    case Op::kBroadcast: return fmt::format("broadcast({} bytes, root {})", count, root);
    case Op::kAllgather: return fmt::format("allgather({} bytes each)", count);
    case Op::kAllgathervSizes:
    case Op::kAllgatherv: return "allgatherv";
    case Op::kBarrier: return "barrier";
  }
  return fmt::format("unknown operation {}", op);
}
std::string describe(const Call& c) {
  return describe(static_cast<uint8_t>(c.op), c.dtype, c.reduce, c.count, c.root);
}

using ReduceFn = void (*)(void* out, const void* a, const void* b, size_t n);

template <typename T, ReduceOp OP>
void reduce_typed(void* out, const void* a, const void* b, size_t n) {
  kernels::combine<T, OP>(static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b), n);
}

ReduceFn reduce_fn(DataType type, ReduceOp op) {
  return kernels::visit_cpu_type(type, [&](auto* tag) -> ReduceFn {
    using T = std::remove_pointer_t<decltype(tag)>;
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAverage: return &reduce_typed<T, ReduceOp::kSum>;
      case ReduceOp::kProduct: return &reduce_typed<T, ReduceOp::kProduct>;
      case ReduceOp::kMin: return &reduce_typed<T, ReduceOp::kMin>;
      case ReduceOp::kMax: return &reduce_typed<T, ReduceOp::kMax>;
    }
    return nullptr;
  });
}

using net::poll_ms;

// ---- the communicator -------------------------------------------------------

// One operation's transfer with one peer: a frame out or a frame in.
struct SendOp {
  int peer = 0;
  FrameHeader header{};
  const char* data = nullptr;
  size_t done = 0;  // bytes of header + payload written
};

struct RecvOp {
  int peer = 0;
  uint64_t offset = 0;  // the frame's expected offset and length
  uint64_t length = 0;
  char* dst = nullptr;
  // Called with [from, to) of the payload as it arrives, whole elements only.
  std::function<void(size_t, size_t)> on_data;
  size_t unit = 1;
  // When > 0, the payload is staged through dst[0, window) over and over
  // (cache-resident) and on_data is called for every full window: the data
  // of [from, to) is then at dst + from % window.
  size_t window = 0;
  size_t done = 0;  // bytes of header + payload read
  size_t reported = 0;
  int step = 0;  // of a pipelined ring
  FrameHeader header{};
};

// Ring block i of n over `total` units: [begin, end).
size_t block_begin(size_t total, int n, int i) { return total * static_cast<size_t>(i) / static_cast<size_t>(n); }

// Byte offsets of the n ring blocks of `total` units of `unit` bytes each:
// block i is [off[i], off[i+1]).
std::vector<size_t> block_offsets(size_t total, int n, size_t unit = 1) {
  std::vector<size_t> off(static_cast<size_t>(n) + 1);
  for (int i = 0; i <= n; ++i) off[static_cast<size_t>(i)] = block_begin(total, n, i) * unit;
  return off;
}

class TcpCommunicator final : public Communicator {
 public:
  TcpCommunicator(KvStore& store, const TcpOptions& o) : o_(o), fds_(o.size) {
    abort_fd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    wake_fd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    done_fd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!abort_fd_ || !wake_fd_ || !done_fd_) {
      throw CommError(fmt::format("erun tcp: eventfd: {}", std::strerror(errno)));
    }
    interrupt_ = {abort_fd_.get(), &aborted_, o_.cancelled};
    who_ = who(o.generation, o.address, o.rank);
    cpu_per_rank_ = o.machine_ranks <= ::sysconf(_SC_NPROCESSORS_ONLN);
    if (o.size > 1) fds_ = tcp::form_mesh(store, o_, who_, interrupt_);
  }

  ~TcpCommunicator() override {
    if (sender_.joinable()) {
      {
        std::lock_guard lock(sender_mu_);
        sender_quit_ = true;
      }
      sender_cv_.notify_all();
      sender_.join();
    }
  }

  int rank() const override { return o_.rank; }
  int size() const override { return o_.size; }

  void allreduce(void* data, size_t count, DataType type, ReduceOp op) override {
    ReduceFn fn = reduce_fn(type, op);  // throws for float16/bfloat16 before anything is sent
    Call c{Op::kAllreduce, static_cast<uint8_t>(type), static_cast<uint8_t>(op), count, 0};
    run(c, [&] {
      if (size() == 1) return;
      const size_t esize = data_type_size(type);
      const size_t bytes = count * esize;
      if (bytes <= kDirectAllreduceBytes || count < static_cast<size_t>(size())) {
        allreduce_direct(c, static_cast<char*>(data), count, esize, fn);
      } else if (bytes <= kScatterGatherBytes && size() > 2 && size() <= kScatterGatherRanks) {
        allreduce_scatter_gather(c, static_cast<char*>(data), count, esize, fn);
      } else {
        allreduce_ring(c, static_cast<char*>(data), count, esize, fn);
      }
    });
    if (op == ReduceOp::kAverage && size() > 1) {
      kernels::visit_cpu_type(type, [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        kernels::divide(static_cast<T*>(data), count, size());
      });
    }
  }

  void broadcast(void* data, size_t bytes, int root) override {
    if (root < 0 || root >= size()) throw std::invalid_argument(fmt::format("erun tcp: broadcast root {} is not a rank of {}", root, size()));
    Call c{Op::kBroadcast, 0, 0, bytes, root};
    run(c, [&] {
      if (size() == 1) return;
      char* p = static_cast<char*>(data);
      if (size() == 2 || bytes <= kDirectBroadcastBytes) {
        std::vector<SendOp> sends;
        std::vector<RecvOp> recvs;
        if (rank() == root) {
          for (int q = 0; q < size(); ++q) {
            if (q != root) sends.push_back(make_send(q, c, 0, bytes, p));
          }
        } else {
          recvs.push_back(make_recv(root, 0, bytes, p));
        }
        transfer(c, sends, recvs);
        return;
      }
      // Scatter from the root, then a ring allgather: the root sends each
      // byte about twice instead of size()-1 times.
      const std::vector<size_t> off = block_offsets(bytes, size());
      std::vector<SendOp> sends;
      std::vector<RecvOp> recvs;
      if (rank() == root) {
        for (int q = 0; q < size(); ++q) {
          if (q != root) sends.push_back(make_send(q, c, off[q], off[q + 1] - off[q], p + off[q]));
        }
      } else {
        recvs.push_back(make_recv(root, off[rank()], off[rank() + 1] - off[rank()], p + off[rank()]));
      }
      transfer(c, sends, recvs);
      ring_allgather(c, p, off, rank());
    });
  }

  void allgather(const void* in, void* out, size_t bytes) override {
    Call c{Op::kAllgather, 0, 0, bytes, 0};
    run(c, [&] {
      char* o = static_cast<char*>(out);
      if (bytes) std::memmove(o + rank() * bytes, in, bytes);
      if (size() == 1) return;
      std::vector<size_t> off(size() + 1);
      for (int i = 0; i <= size(); ++i) off[i] = i * bytes;
      gather_blocks(c, o, off);
    });
  }

  std::vector<std::vector<char>> allgatherv(const void* in, size_t bytes) override {
    std::vector<std::vector<char>> result(size());
    Call sizes{Op::kAllgathervSizes, 0, 0, 0, 0};
    run(sizes, [&] {
      std::vector<uint64_t> lens(size());
      lens[rank()] = bytes;
      if (size() > 1) {
        std::vector<size_t> off(size() + 1);
        for (int i = 0; i <= size(); ++i) off[i] = i * sizeof(uint64_t);
        direct_allgather(sizes, reinterpret_cast<char*>(lens.data()), off);
      }
      std::vector<size_t> off(size() + 1, 0);
      for (int i = 0; i < size(); ++i) off[i + 1] = off[i] + lens[i];
      std::vector<char> all(off[size()]);
      if (bytes) std::memcpy(all.data() + off[rank()], in, bytes);
      Call data{Op::kAllgatherv, 0, 0, off[size()], 0};
      if (size() > 1) gather_blocks(data, all.data(), off);
      for (int i = 0; i < size(); ++i) result[i].assign(all.begin() + off[i], all.begin() + off[i + 1]);
    });
    return result;
  }

  void barrier() override {
    Call c{Op::kBarrier, 0, 0, 0, 0};
    run(c, [&] {
      // Dissemination: round k, tell rank+2^k and hear from rank-2^k.
      uint64_t round = 0;
      for (int dist = 1; dist < size(); dist *= 2, ++round) {
        std::vector<SendOp> sends{make_send((rank() + dist) % size(), c, round, 0, nullptr)};
        std::vector<RecvOp> recvs{make_recv((rank() - dist + size()) % size(), round, 0, nullptr)};
        transfer(c, sends, recvs);
      }
    });
  }

  void abort() override {
    aborted_ = true;
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(abort_fd_.get(), &one, sizeof(one));
    shutdown_all();
  }

 private:
  // Below these, one direct exchange (one round trip) beats a ring.
  static constexpr size_t kDirectAllreduceBytes = 128 << 10;
  static constexpr size_t kDirectBroadcastBytes = 256 << 10;
  static constexpr size_t kDirectGatherBytes = 256 << 10;
  // Up to this size, and with 3 to this many ranks, a medium allreduce is a
  // direct reduce-scatter and a direct allgather: the ring's bytes in 2
  // steps instead of 2(n-1), each a hop that waits for the slowest rank to
  // be scheduled (docs/performance.md section 8). With 2 ranks the ring is
  // already 2 steps, and it pipelines the block in segments.
  static constexpr size_t kScatterGatherBytes = 4 << 20;
  static constexpr int kScatterGatherRanks = 8;
  // Received data is reduced in pieces of this size while the rest arrives
  // (a multiple of every element size).
  static constexpr size_t kReduceSegment = 256 << 10;
  // The pipelined ring moves a block in frames of at most this size; a
  // segment is forwarded as soon as it has arrived (and been reduced).
  static constexpr size_t kSegmentBytes = 512 << 10;
  // From this block size (bytes / ranks) up, the ring's sends go out on the
  // sender thread when the machine has a CPU per rank (cpu_per_rank_);
  // below it the hand-over per segment costs more than the overlap gains.
  // With more ranks than CPUs, the second thread costs CPU for 4 MiB blocks
  // but not from 16 MiB up, where it keeps a rank's stream moving while the
  // scheduler runs its neighbours (docs/performance.md section 8).
  static constexpr size_t kSenderThreadBlockBytes = 4 << 20;
  static constexpr size_t kOversubscribedSenderThreadBlockBytes = 16 << 20;

  // Runs one collective: checks the communicator is usable, numbers it, and
  // turns every failure into a CommError that names the operation and rank,
  // after shutting the sockets so that the peers fail at once too.
  template <typename F>
  void run(const Call& c, F&& body) {
    if (aborted_) throw CommError(fmt::format("erun tcp: {}: {} after abort()", who_, op_name(static_cast<uint8_t>(c.op))));
    if (broken_) throw CommError(fmt::format("erun tcp: {}: {} on a communicator that already failed ({})", who_, op_name(static_cast<uint8_t>(c.op)), broken_reason_));
    ++seq_;
    deadline_ = Clock::now() + o_.timeout;
    try {
      body();
    } catch (const CommError& e) {
      broken_ = true;
      broken_reason_ = e.what();
      shutdown_all();
      throw;
    }
  }

  [[noreturn]] void fail(const Call& c, const std::string& what) {
    throw CommError(fmt::format("erun tcp: {}: {} (collective #{}): {}", who_, op_name(static_cast<uint8_t>(c.op)), seq_, what));
  }

  // A timeout or a closed connection: names `peer` (a rank of this
  // communicator) as silent; it may itself be blocked on another rank.
  [[noreturn]] void fail_peer(const Call& c, int peer, const std::string& what) {
    throw CommError(fmt::format("erun tcp: {}: {} (collective #{}): {}", who_, op_name(static_cast<uint8_t>(c.op)), seq_, what),
                    peer, PeerFate::kSilent);
  }

  void shutdown_all() {
    for (const Fd& fd : fds_) {
      if (fd) ::shutdown(fd.get(), SHUT_RDWR);
    }
  }

  SendOp make_send(int peer, const Call& c, uint64_t offset, uint64_t length, const char* data) {
    SendOp s;
    s.peer = peer;
    FrameHeader& h = s.header;
    h.magic = kFrameMagic;
    h.version = kFrameVersion;
    h.op = static_cast<uint8_t>(c.op);
    h.dtype = c.dtype;
    h.reduce = c.reduce;
    h.generation = static_cast<uint32_t>(o_.generation);
    h.from = rank();
    h.seq = seq_;
    h.count = c.count;
    h.offset = offset;
    h.length = length;
    h.root = c.root;
    h.check = fnv1a(&h, offsetof(FrameHeader, check));
    s.data = data;
    return s;
  }

  static RecvOp make_recv(int peer, uint64_t offset, uint64_t length, char* dst) {
    RecvOp r;
    r.peer = peer;
    r.offset = offset;
    r.length = length;
    r.dst = dst;
    return r;
  }

  // Why a received header is refused, checked before a byte of its payload
  // is read into the caller's buffer.
  void check_frame(const Call& c, const RecvOp& r) {
    const FrameHeader& h = r.header;
    const int p = r.peer;
    if (h.magic != kFrameMagic || h.version != kFrameVersion || h.check != fnv1a(&h, offsetof(FrameHeader, check))) {
      fail(c, fmt::format("corrupted frame header from rank {} (magic {:#x}, version {}, check {:#x}); the stream "
                          "from that rank is not trustworthy", p, h.magic, h.version, h.check));
    }
    if (h.generation != static_cast<uint32_t>(o_.generation) || h.from != p) {
      fail(c, fmt::format("frame from rank {} claims generation {} rank {}; this connection is generation {} rank {}", p,
                          h.generation, h.from, o_.generation, p));
    }
    const Call mine = c;
    if (h.seq != seq_ || h.op != static_cast<uint8_t>(mine.op) || h.dtype != mine.dtype || h.reduce != mine.reduce ||
        h.count != mine.count || h.root != mine.root) {
      fail(c, fmt::format("collective mismatch: rank {} called #{} {} but rank {} called #{} {}; every rank must call "
                          "the same collectives with the same arguments in the same order",
                          rank(), seq_, describe(mine), p, h.seq, describe(h.op, h.dtype, h.reduce, h.count, h.root)));
    }
    if (h.offset != r.offset || h.length != r.length) {
      fail(c, fmt::format("rank {} sent [{}, +{}) of {} where [{}, +{}) was due; the ranks disagree on the algorithm "
                          "(different erun versions?)", p, h.offset, h.length, describe(mine), r.offset, r.length));
    }
  }

  // Moves every send and receive to completion at once (full duplex, so two
  // ranks sending to each other never wait on each other's buffers), bounded
  // by the operation's deadline and woken by abort().
  void transfer(const Call& c, std::vector<SendOp>& sends, std::vector<RecvOp>& recvs) {
    size_t left = sends.size() + recvs.size();
    std::vector<pollfd> pfds;
    std::vector<int> which;  // >= 0: sends[i], < 0: recvs[-i-1]
    while (left > 0) {
      bool progressed = false;
      for (auto& s : sends) {
        const size_t total = sizeof(FrameHeader) + s.header.length;
        if (s.done == total) continue;
        if (step_send(c, s)) progressed = true;
        if (s.done == total) --left;
      }
      for (auto& r : recvs) {
        const size_t total = sizeof(FrameHeader) + r.length;
        if (r.done == total) continue;
        if (step_recv(c, r)) progressed = true;
        if (r.done == total) --left;
      }
      if (left == 0) break;
      if (progressed) continue;
      pfds.clear();
      which.clear();
      pfds.push_back({abort_fd_.get(), POLLIN, 0});
      which.push_back(0);
      for (size_t i = 0; i < sends.size(); ++i) {
        if (sends[i].done < sizeof(FrameHeader) + sends[i].header.length) {
          pfds.push_back({fds_[sends[i].peer].get(), POLLOUT, 0});
          which.push_back(static_cast<int>(i));
        }
      }
      for (size_t i = 0; i < recvs.size(); ++i) {
        if (recvs[i].done < sizeof(FrameHeader) + recvs[i].length) {
          pfds.push_back({fds_[recvs[i].peer].get(), POLLIN, 0});
          which.push_back(-static_cast<int>(i) - 1);
        }
      }
      int timeout = poll_ms(deadline_, 1h);
      if (timeout == 0) {
        std::string waiting;
        int named = -1, named_recv = -1;  // the first peer this rank waits to receive from, else to send to
        for (size_t i = 1; i < pfds.size(); ++i) {
          int peer = which[i] >= 0 ? sends[which[i]].peer : recvs[-which[i] - 1].peer;
          if (named < 0) named = peer;
          if (named_recv < 0 && which[i] < 0) named_recv = peer;
          waiting += fmt::format("{}{} rank {}", waiting.empty() ? "" : ", ", which[i] >= 0 ? "sending to" : "receiving from", peer);
        }
        fail_peer(c, named_recv >= 0 ? named_recv : named,
                  fmt::format("timed out after {:.1f} s {} (is that rank alive, or stopped?)", seconds(o_.timeout), waiting));
      }
      int n = ::poll(pfds.data(), pfds.size(), timeout);
      if (n < 0 && errno != EINTR) fail(c, fmt::format("poll: {}", std::strerror(errno)));
      if (aborted_ || (pfds[0].revents & POLLIN)) fail(c, "aborted");
    }
  }

  // One non-blocking write; true when bytes moved.
  bool step_send(const Call& c, SendOp& s) {
    iovec iov[2];
    int n_iov = 0;
    constexpr size_t hb = sizeof(FrameHeader);
    if (s.done < hb) iov[n_iov++] = {reinterpret_cast<char*>(&s.header) + s.done, hb - s.done};
    const size_t payload_done = s.done > hb ? s.done - hb : 0;
    if (payload_done < s.header.length) iov[n_iov++] = {const_cast<char*>(s.data) + payload_done, s.header.length - payload_done};
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = n_iov;
    ssize_t n = ::sendmsg(fds_[s.peer].get(), &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      s.done += static_cast<size_t>(n);
      return true;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return false;
    if (aborted_) fail(c, "aborted");
    fail_peer(c, s.peer, fmt::format("sending to rank {} failed: {} (it exited or failed)", s.peer, n < 0 ? std::strerror(errno) : "closed"));
  }

  // One non-blocking read, never past the end of this frame; true when bytes moved.
  bool step_recv(const Call& c, RecvOp& r) {
    constexpr size_t hb = sizeof(FrameHeader);
    char* ptr;
    size_t want;
    if (r.done < hb) {
      ptr = reinterpret_cast<char*>(&r.header) + r.done;
      want = hb - r.done;
    } else if (r.window) {
      const size_t got = r.done - hb;
      ptr = r.dst + got % r.window;
      want = std::min(r.length - got, r.window - got % r.window);
    } else {
      ptr = r.dst + (r.done - hb);
      want = r.length - (r.done - hb);
    }
    ssize_t n = ::recv(fds_[r.peer].get(), ptr, want, MSG_DONTWAIT);
    if (n > 0) {
      const bool had_header = r.done >= hb;
      r.done += static_cast<size_t>(n);
      if (!had_header && r.done >= hb) check_frame(c, r);
      if (r.done > hb && r.on_data) {
        const size_t got = r.done - hb;
        const size_t whole = got - got % r.unit;
        const bool window_full = r.window && whole > r.reported && whole % r.window == 0;
        if (whole == r.length || window_full || (!r.window && whole - r.reported >= kReduceSegment)) {
          r.on_data(r.reported, whole);
          r.reported = whole;
        }
      }
      return true;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return false;
    if (aborted_) fail(c, "aborted");
    fail_peer(c, r.peer, fmt::format("receiving from rank {} failed: {} (it exited, failed or aborted)", r.peer,
                        n < 0 ? std::strerror(errno) : "connection closed"));
  }

  // Small allreduce: everyone sends everything to everyone, then reduces the
  // inputs in rank order, so every rank computes the same bits.
  void allreduce_direct(const Call& c, char* data, size_t count, size_t esize, ReduceFn fn) {
    const size_t bytes = count * esize;
    scratch_.resize(bytes * size());
    char* slots = scratch_.data();
    if (bytes) std::memcpy(slots + rank() * bytes, data, bytes);
    std::vector<SendOp> sends;
    std::vector<RecvOp> recvs;
    for (int q = 0; q < size(); ++q) {
      if (q == rank()) continue;
      sends.push_back(make_send(q, c, 0, bytes, data));
      recvs.push_back(make_recv(q, 0, bytes, slots + q * bytes));
    }
    transfer(c, sends, recvs);
    reduce_slots(data, slots, bytes, count, fn);
  }

  // out = slot 0 op slot 1 op ... op slot n-1 (slots of `bytes` each, one per
  // rank, in rank order), so that every rank computing it gets the same bits.
  void reduce_slots(char* out, const char* slots, size_t bytes, size_t count, ReduceFn fn) const {
    fn(out, slots, slots + bytes, count);
    for (int q = 2; q < size(); ++q) fn(out, out, slots + q * bytes, count);
  }

  // Medium allreduce: every rank sends block q to rank q, which reduces the
  // n inputs of its block in rank order and sends the result to every rank.
  // Each rank moves what the ring moves (2(n-1)/n of the buffer) in two
  // steps; each block is reduced by one rank only, so every rank ends with
  // the same bits.
  void allreduce_scatter_gather(const Call& c, char* data, size_t count, size_t esize, ReduceFn fn) {
    const int n = size(), me = rank();
    const std::vector<size_t> off = block_offsets(count, n, esize);
    const size_t mine = off[me + 1] - off[me];
    scratch_.resize(mine * n);
    char* slots = scratch_.data();
    std::memcpy(slots + me * mine, data + off[me], mine);
    std::vector<SendOp> sends;
    std::vector<RecvOp> recvs;
    for (int q = 0; q < n; ++q) {
      if (q == me) continue;
      sends.push_back(make_send(q, c, off[q], off[q + 1] - off[q], data + off[q]));
      recvs.push_back(make_recv(q, off[me], mine, slots + q * mine));
    }
    transfer(c, sends, recvs);
    reduce_slots(data + off[me], slots, mine, mine / esize, fn);
    direct_allgather(c, data, off);
  }

  // ---- the sender thread ----

  // One operation's sends on the sender thread: frames [0, ready) may go
  // out, release() adds one more; finish() waits until all have gone (or the
  // sender failed: its error is rethrown here). Destroyed without finish()
  // (the caller's side failed), it stops the sender and waits until it has
  // let go of the frames: no send outlives the operation.
  class SenderJob {
   public:
    SenderJob(TcpCommunicator& t, const Call& c, std::vector<SendOp>& frames, size_t ready) : t_(t) {
      t_.start_sender_job(c, frames, ready);
    }
    ~SenderJob() {
      if (!finished_) t_.stop_sender_job();
    }
    SenderJob(const SenderJob&) = delete;
    SenderJob& operator=(const SenderJob&) = delete;

    void release() {
      t_.job_ready_.fetch_add(1, std::memory_order_release);
      t_.wake_sender();
    }
    // Blocks until sends[0, n) are complete: only ever for the instructions
    // between the kernel taking the last byte and the count moving on, since
    // the data a receive waits for cannot arrive before those bytes left
    // (the ring carries them around first). Returns at once when the sender
    // ended, and check() then throws its error.
    void wait_sent(size_t n) {
      size_t now = t_.job_sent_.load(std::memory_order_acquire);
      while (now < n) {
        t_.job_sent_.wait(now, std::memory_order_acquire);
        now = t_.job_sent_.load(std::memory_order_acquire);
      }
      if (now == kSenderEnded) check();
    }
    // Throws the sender's error if it ended with one.
    void check() { t_.check_sender_job(); }
    void finish() {
      t_.wait_sender_job();
      finished_ = true;
    }

   private:
    TcpCommunicator& t_;
    bool finished_ = false;
  };
  friend class SenderJob;

  // Large allreduce: ring reduce-scatter then ring allgather, run as one
  // pipelined stream. Step s (0 .. 2(n-1)-1) sends block
  // rank-s to the right and receives block rank-s-1 from the left (reducing
  // it in the first n-1 steps, storing it in the rest); each block travels as
  // frames of at most kSegmentBytes, and the segment received at step s is
  // what goes out at step s+1, so it is released to the sender the moment it
  // is complete instead of after the whole step: the steps overlap, and no
  // rank waits at a step boundary for its slowest transfer. The caller's
  // thread receives and reduces (through one small window that stays in
  // cache); for large blocks on a machine with a CPU per rank, the
  // communicator's sender thread writes the frames to the right neighbour
  // meanwhile, so the copy into the kernel overlaps the copy out of it and
  // the reduction. Every rank reduces the same inputs in the same
  // order, so the result is bitwise the same on every rank.
  void allreduce_ring(const Call& c, char* data, size_t count, size_t esize, ReduceFn fn) {
    const int n = size();
    const int right = (rank() + 1) % n, left = (rank() - 1 + n) % n;
    const std::vector<size_t> off = block_offsets(count, n, esize);
    const size_t seg = std::max<size_t>(kSegmentBytes / esize, 1) * esize;
    scratch_.resize(kReduceSegment);
    const int steps = 2 * (n - 1);
    auto block_of = [&](int s) { return ((rank() - s) % n + n) % n; };

    // Every frame of the operation, in order: the sends (this rank's own
    // block, then each received segment forwarded, except the last step's)
    // and the receives. `sent_at` remembers which send last read a segment,
    // so that it is not overwritten by a receive before that send is done.
    std::vector<SendOp> sends;
    std::map<std::pair<int, size_t>, size_t> sent_at;  // (step, offset) -> index in sends
    struct Planned {
      int step;
      size_t offset, length;
      size_t after_send;  // sends[0, after_send) must be complete first
    };
    std::vector<Planned> recvs;
    for (size_t from = off[block_of(0)]; from < off[block_of(0) + 1]; from += seg) {
      sent_at[{0, from}] = sends.size();
      sends.push_back(make_send(right, c, from, std::min(from + seg, off[block_of(0) + 1]) - from, data + from));
    }
    const size_t own_frames = sends.size();
    for (int s = 0; s < steps; ++s) {
      const int block = block_of(s + 1);
      for (size_t from = off[block]; from < off[block + 1]; from += seg) {
        const size_t len = std::min(from + seg, off[block + 1]) - from;
        size_t after = 0;
        if (s >= n - 1) {  // the allgather overwrites what step s+1-n sent
          auto it = sent_at.find({s + 1 - n, from});
          ERUN_CHECK(it != sent_at.end());
          after = it->second + 1;
        }
        recvs.push_back({s, from, len, after});
        if (s + 1 < steps) {
          sent_at[{s + 1, from}] = sends.size();
          sends.push_back(make_send(right, c, from, len, data + from));
        }
      }
    }

    auto receive_op = [&](const Planned& p) {
      RecvOp r = make_recv(left, p.offset, p.length, data + p.offset);
      if (p.step < n - 1) {
        char* target = data + p.offset;
        const char* in = scratch_.data();
        r.dst = scratch_.data();
        r.unit = esize;
        r.window = kReduceSegment;
        r.on_data = [fn, esize, target, in](size_t a, size_t b) {
          fn(target + a, target + a, in + a % kReduceSegment, (b - a) / esize);
        };
      }
      return r;
    };
    if (off[1] - off[0] < (cpu_per_rank_ ? kSenderThreadBlockBytes : kOversubscribedSenderThreadBlockBytes)) {
      // Small blocks: handing each segment to another thread costs more
      // than it overlaps; one thread moves the sends and receives side by
      // side (a receive cannot complete before the send it overwrites has
      // left: the ring carries those bytes around first).
      size_t released = own_frames, next_send = 0;
      for (const Planned& p : recvs) {
        RecvOp r = receive_op(p);
        pump(c, sends, next_send, released, &r);
        if (p.step + 1 < steps) ++released;
      }
      pump(c, sends, next_send, released, nullptr);
      return;
    }
    SenderJob job(*this, c, sends, own_frames);
    for (const Planned& p : recvs) {
      job.wait_sent(p.after_send);
      RecvOp r = receive_op(p);
      receive(c, r, job);
      if (p.step + 1 < steps) job.release();
    }
    job.finish();
  }

  // Writes sends[next, released) in order while reading `recv` (if any) on
  // one thread, until the receive is complete (without one: until those
  // sends are). Bounded by the operation's deadline and woken by abort().
  void pump(const Call& c, std::vector<SendOp>& sends, size_t& next, size_t released, RecvOp* recv) {
    auto recv_done = [&] { return !recv || recv->done == sizeof(FrameHeader) + recv->length; };
    while (!recv_done() || (!recv && next < released)) {
      bool progressed = false;
      while (next < released) {
        SendOp& s = sends[next];
        const bool moved = step_send(c, s);
        progressed |= moved;
        if (s.done == sizeof(FrameHeader) + s.header.length) {
          ++next;
        } else if (!moved) {
          break;
        }
      }
      if (recv && !recv_done() && step_recv(c, *recv)) progressed = true;
      if (progressed) continue;
      pollfd pfds[3] = {{abort_fd_.get(), POLLIN, 0}, {-1, 0, 0}, {-1, 0, 0}};
      if (next < released) pfds[1] = {fds_[sends[next].peer].get(), POLLOUT, 0};
      if (recv) pfds[2] = {fds_[recv->peer].get(), POLLIN, 0};
      int timeout = poll_ms(deadline_, 1h);
      if (timeout == 0) {
        std::string waiting;
        if (next < released) waiting = fmt::format("sending to rank {}", sends[next].peer);
        if (recv) waiting += fmt::format("{}receiving from rank {}", waiting.empty() ? "" : ", ", recv->peer);
        fail_peer(c, recv ? recv->peer : sends[next].peer,
                  fmt::format("timed out after {:.1f} s {} (is that rank alive, or stopped?)", seconds(o_.timeout), waiting));
      }
      int n = ::poll(pfds, 3, timeout);
      if (n < 0 && errno != EINTR) fail(c, fmt::format("poll: {}", std::strerror(errno)));
      if (aborted_ || (pfds[0].revents & POLLIN)) fail(c, "aborted");
    }
  }

  // Reads one frame to its end, bounded by the operation's deadline and
  // woken by abort() or by the sender thread's failure.
  void receive(const Call& c, RecvOp& r, SenderJob& job) {
    const size_t total = sizeof(FrameHeader) + r.length;
    while (r.done < total) {
      if (step_recv(c, r)) continue;
      pollfd pfds[3] = {{abort_fd_.get(), POLLIN, 0}, {fds_[r.peer].get(), POLLIN, 0}, {done_fd_.get(), POLLIN, 0}};
      int timeout = poll_ms(deadline_, 1h);
      if (timeout == 0) {
        fail_peer(c, r.peer, fmt::format("timed out after {:.1f} s receiving from rank {} (is that rank alive, or stopped?)",
                                         seconds(o_.timeout), r.peer));
      }
      int got = ::poll(pfds, 3, timeout);
      if (got < 0 && errno != EINTR) fail(c, fmt::format("poll: {}", std::strerror(errno)));
      if (aborted_ || (pfds[0].revents & POLLIN)) fail(c, "aborted");
      if (pfds[2].revents & POLLIN) job.check();
    }
  }

  static constexpr size_t kSenderEnded = ~size_t{0};

  void start_sender_job(const Call& c, std::vector<SendOp>& frames, size_t ready) {
    uint64_t drain;
    while (::read(done_fd_.get(), &drain, sizeof(drain)) > 0) {}
    std::unique_lock lock(sender_mu_);
    if (!sender_.joinable()) sender_ = std::thread([this] { sender_main(); });
    job_call_ = &c;
    job_frames_ = &frames;
    job_ready_.store(ready, std::memory_order_relaxed);
    job_sent_.store(0, std::memory_order_relaxed);
    job_stop_ = false;
    job_error_ = nullptr;
    job_running_ = true;
    lock.unlock();
    sender_cv_.notify_all();
  }

  void wake_sender() {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_fd_.get(), &one, sizeof(one));
  }

  // The caller failed: the sender gives up at its next wake-up.
  void stop_sender_job() {
    job_stop_ = true;
    wake_sender();
    std::unique_lock lock(sender_mu_);
    sender_cv_.wait(lock, [&] { return !job_running_; });
  }

  void check_sender_job() {
    uint64_t drain;
    while (::read(done_fd_.get(), &drain, sizeof(drain)) > 0) {}
    std::lock_guard lock(sender_mu_);
    if (!job_running_ && job_error_) std::rethrow_exception(job_error_);
  }

  // After the last receive: the sends still queued go out, bounded by the
  // operation's deadline (the sender's own) and abort() (which wakes it).
  void wait_sender_job() {
    std::unique_lock lock(sender_mu_);
    sender_cv_.wait(lock, [&] { return !job_running_; });
    if (job_error_) std::rethrow_exception(job_error_);
  }

  void sender_main() {
    std::unique_lock lock(sender_mu_);
    while (true) {
      sender_cv_.wait(lock, [&] { return sender_quit_ || (job_running_ && job_frames_); });
      if (sender_quit_) return;
      const Call& c = *job_call_;
      std::vector<SendOp>& frames = *job_frames_;
      job_frames_ = nullptr;
      lock.unlock();
      std::exception_ptr error;
      try {
        send_frames(c, frames);
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      job_error_ = std::move(error);
      job_running_ = false;
      job_sent_.store(kSenderEnded, std::memory_order_release);
      job_sent_.notify_all();
      uint64_t one = 1;
      [[maybe_unused]] ssize_t n = ::write(done_fd_.get(), &one, sizeof(one));
      sender_cv_.notify_all();
    }
  }

  // Writes the released frames in order; bounded by the operation's deadline
  // and woken by abort(), by release() and by stop_sender_job().
  void send_frames(const Call& c, std::vector<SendOp>& frames) {
    size_t i = 0;
    while (i < frames.size()) {
      if (job_stop_) return;
      const size_t ready = job_ready_.load(std::memory_order_acquire);
      bool progressed = false;
      while (i < ready) {
        const bool moved = step_send(c, frames[i]);
        progressed |= moved;
        if (frames[i].done < sizeof(FrameHeader) + frames[i].header.length) {
          if (!moved) break;
          continue;
        }
        ++i;
        job_sent_.store(i, std::memory_order_release);
        job_sent_.notify_all();
      }
      if (i == frames.size()) break;
      if (progressed) continue;
      pollfd pfds[3] = {{abort_fd_.get(), POLLIN, 0}, {wake_fd_.get(), POLLIN, 0}, {-1, 0, 0}};
      if (i < ready) pfds[2] = {fds_[frames[i].peer].get(), POLLOUT, 0};
      // Blocked sending: the peer is not reading, so it is the one named at
      // the deadline. Idle (every released frame sent): the caller is the one
      // waiting, on its own receive with the same deadline; it names the rank
      // it waits for and stops this job. The sender gives it a grace period,
      // so that an idle sender never blames its healthy right neighbour.
      const bool idle = i >= ready;
      const TimePoint limit = idle && deadline_ != TimePoint::max() ? deadline_ + kIdleSenderGrace : deadline_;
      int timeout = poll_ms(limit, 1h);
      if (timeout == 0) {
        if (idle) fail(c, "the sender thread waited past the operation's deadline for its caller");
        fail_peer(c, frames[i].peer, fmt::format("timed out after {:.1f} s sending to rank {} (is that rank alive, or stopped?)",
                                                 seconds(o_.timeout), frames[i].peer));
      }
      int n = ::poll(pfds, 3, timeout);
      if (n < 0 && errno != EINTR) fail(c, fmt::format("poll: {}", std::strerror(errno)));
      if (aborted_ || (pfds[0].revents & POLLIN)) fail(c, "aborted");
      if (pfds[1].revents & POLLIN) {
        uint64_t drain;
        [[maybe_unused]] ssize_t r = ::read(wake_fd_.get(), &drain, sizeof(drain));
      }
    }
  }

  // Ring allgather of blocks [off[i], off[i+1]) of `base`; this rank starts
  // with block `own` complete.
  void ring_allgather(const Call& c, char* base, const std::vector<size_t>& off, int own) {
    const int n = size();
    const int right = (rank() + 1) % n, left = (rank() - 1 + n) % n;
    for (int s = 0; s < n - 1; ++s) {
      const int send_block = (own - s + n) % n;
      const int recv_block = (own - s - 1 + 2 * n) % n;
      std::vector<SendOp> sends{make_send(right, c, off[send_block], off[send_block + 1] - off[send_block], base + off[send_block])};
      std::vector<RecvOp> recvs{make_recv(left, off[recv_block], off[recv_block + 1] - off[recv_block], base + off[recv_block])};
      transfer(c, sends, recvs);
    }
  }

  // Every rank's block to every other rank in one exchange.
  void direct_allgather(const Call& c, char* base, const std::vector<size_t>& off) {
    std::vector<SendOp> sends;
    std::vector<RecvOp> recvs;
    const int me = rank();
    for (int q = 0; q < size(); ++q) {
      if (q == me) continue;
      sends.push_back(make_send(q, c, off[me], off[me + 1] - off[me], base + off[me]));
      recvs.push_back(make_recv(q, off[q], off[q + 1] - off[q], base + off[q]));
    }
    transfer(c, sends, recvs);
  }

  void gather_blocks(const Call& c, char* base, const std::vector<size_t>& off) {
    if (off[size()] <= kDirectGatherBytes) return direct_allgather(c, base, off);
    ring_allgather(c, base, off, rank());
  }

  const TcpOptions o_;
  std::string who_;
  std::vector<Fd> fds_;  // by rank; invalid for self
  Fd abort_fd_;
  // Ends the handshake's waits: abort_fd_, aborted_, o_.cancelled.
  net::Interrupt interrupt_;
  std::atomic<bool> aborted_{false};
  bool broken_ = false;
  std::string broken_reason_;
  uint64_t seq_ = 0;
  TimePoint deadline_{};
  std::vector<char> scratch_;
  // The sender thread (started by the first ring allreduce that uses it:
  // blocks of kSenderThreadBlockBytes, or kOversubscribedSenderThreadBlockBytes
  // without cpu_per_rank_) and its job.
  bool cpu_per_rank_ = true;
  std::thread sender_;
  std::mutex sender_mu_;
  std::condition_variable sender_cv_;
  bool sender_quit_ = false;     // guarded by sender_mu_
  bool job_running_ = false;     // guarded by sender_mu_
  const Call* job_call_ = nullptr;           // guarded by sender_mu_
  std::vector<SendOp>* job_frames_ = nullptr;  // guarded by sender_mu_
  std::exception_ptr job_error_;  // guarded by sender_mu_; rethrown by the caller
  std::atomic<size_t> job_ready_{0};  // frames the sender may write
  std::atomic<size_t> job_sent_{0};   // frames written, or kSenderEnded
  std::atomic<bool> job_stop_{false};
  Fd wake_fd_;  // caller -> sender: a frame was released, or stop
  Fd done_fd_;  // sender -> caller: the job ended
};

}  // namespace

std::unique_ptr<Communicator> make_tcp_communicator(KvStore& store, const TcpOptions& o) {
  if (o.size < 1 || o.rank < 0 || o.rank >= o.size) {
    throw std::invalid_argument(fmt::format("erun tcp: rank {} of size {} is not a rank", o.rank, o.size));
  }
  return std::make_unique<TcpCommunicator>(store, o);
}

}  // namespace erun
