#include "collectives/shm/shm_communicator.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <linux/futex.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <stdexcept>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "collectives/call_signature.h"
#include "collectives/reduce_kernels.h"
#include "common/check.h"
#include "common/fd.h"

namespace erun {
namespace {

static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared-memory counters must be lock-free");
static_assert(std::atomic<uint32_t>::is_always_lock_free, "shared-memory counters must be lock-free");

constexpr uint64_t kMagic = 0x65'72'75'6e'73'68'6d'31ULL;  // "erunshm1"
constexpr uint32_t kVersion = 4;  // 2: call signatures in the rank slots; 3: the failed peer in the header; 4: `outside`
constexpr size_t kLine = 64;
constexpr size_t kPage = 4096;

size_t round_up(size_t v, size_t to) { return (v + to - 1) / to * to; }

std::string errno_text(int err) { return std::strerror(err); }

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

struct alignas(kLine) Header {
  uint64_t magic;
  uint64_t nonce;
  uint32_t version;
  uint32_t size;
  uint64_t step_bytes;
  uint64_t small_bytes;
  uint64_t total_bytes;
  alignas(kLine) std::atomic<uint32_t> attached;
  // 0 while healthy; 1 + the rank that aborted or failed first.
  alignas(kLine) std::atomic<uint32_t> aborted_by;
  std::atomic<uint32_t> abort_kind;  // AbortKind, set after `reason` and the failed peer
  char reason[200];
  int32_t failed_rank;   // kPeerFailure: the rank that failed the aborting one, or -1
  uint32_t failed_fate;  // its PeerFate
  // Sleeping waiters block on futex_word; arrivals bump it when sleepers > 0.
  alignas(kLine) std::atomic<uint32_t> futex_word;
  std::atomic<uint32_t> sleepers;
};

enum AbortKind : uint32_t { kUserAbort = 1, kPeerFailure = 2 };

// A rank's arrival counter and, next to it in the same cache line, the call
// it made at that synchronisation (CallSignature words), by epoch parity: a
// peer can be one synchronisation ahead, never two, so the slot of epoch e is
// stable until everyone has read it. `outside`: 1 while the rank is busy
// outside the communicator on purpose (ShmCommunicator::set_outside), read
// only when a peer's deadline passes.
struct alignas(kLine) RankSlot {
  std::atomic<uint64_t> epoch;
  std::atomic<uint64_t> call[2][2];
  std::atomic<uint32_t> outside;
};

// Who holds a rank: its pid (0 until mapped) and PID namespace, so that only
// peers whose pids mean something here are watched for death.
struct Peer {
  uint64_t pid_ns;
  std::atomic<int32_t> pid;
};

uint64_t my_pid_namespace() {
  struct stat st {};
  return ::stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

// Offsets of the parts of a segment for `size` ranks.
struct Layout {
  size_t ctl = 0, pids = 0, small = 0, step = 0, result = 0, total = 0;
  size_t small_bytes = 0, step_bytes = 0;

  Layout(size_t size, size_t small_b, size_t step_b) {
    small_bytes = round_up(std::max<size_t>(small_b, kLine), kLine);
    step_bytes = round_up(std::max<size_t>(step_b, kPage), kPage);
    ctl = round_up(sizeof(Header), kLine);
    pids = ctl + size * sizeof(RankSlot);
    small = round_up(pids + size * sizeof(Peer), kPage);
    step = round_up(small + 2 * size * small_bytes, kPage);
    result = step + size * step_bytes;
    total = result + step_bytes;
  }
};

std::string sanitize(const std::string& tag) {
  std::string out;
  for (char c : tag.substr(0, 64)) out += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_') ? c : '_';
  return out.empty() ? "erun" : out;
}

uint64_t random_u64() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// True when `pid` no longer runs: gone (ESRCH) or a zombie waiting for its parent.
bool process_dead(pid_t pid) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  Fd fd(::open(path, O_RDONLY | O_CLOEXEC));
  if (!fd) return errno == ENOENT;
  char buf[512];
  ssize_t n = ::read(fd.get(), buf, sizeof(buf) - 1);
  if (n <= 0) return false;
  buf[n] = '\0';
  const char* paren = std::strrchr(buf, ')');
  if (!paren || paren[1] == '\0' || paren[2] == '\0') return false;
  char state = paren[2];
  return state == 'Z' || state == 'X' || state == 'x';
}

class Mapping {
 public:
  Mapping() = default;
  Mapping(void* addr, size_t len) : addr_(addr), len_(len) {}
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (addr_) ::munmap(addr_, len_);
  }
  char* base() const { return static_cast<char*>(addr_); }

 private:
  void* addr_ = nullptr;
  size_t len_ = 0;
};

// Removes the segment's name when construction fails before everyone mapped it.
struct UnlinkGuard {
  std::string name;
  ~UnlinkGuard() {
    if (!name.empty()) ::shm_unlink(name.c_str());
  }
};

class SegmentCommunicator final : public ShmCommunicator {
 public:
  SegmentCommunicator(KvStore& store, const ShmOptions& o) : options_(o), layout_(o.size, o.small_bytes, o.step_bytes) {
    ERUN_CHECK(o.size >= 1 && o.rank >= 0 && o.rank < o.size);
    const long cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
    const bool oversubscribed = o.size > cpus;
    spin_ = oversubscribed ? std::chrono::microseconds(2) : std::chrono::microseconds(200);
    yield_ = oversubscribed ? Duration::zero() : Duration(std::chrono::milliseconds(1));
    // Measured per op (10th percentile, float32 sum, 2-core VM): 2 ranks
    // 1 MiB 17 vs 10 GB/s with the own part written during the reduction; 4
    // ranks 16 MiB 2.5 vs 3.0 GB/s, 64 MiB 2.3 vs 2.8 (the reduction phase,
    // which every rank waits for, gets longer while ranks share CPUs).
    own_part_in_reduce_ = !oversubscribed;
    if (o.size == 1) return;
    deadline_ = std::chrono::steady_clock::now() + o.timeout;
    UnlinkGuard guard;
    if (o.rank == 0) {
      create(store, guard);
    } else {
      open(store, guard);
    }
    // Everyone waits until all have mapped the segment; then the name goes.
    while (header()->attached.load(std::memory_order_acquire) < static_cast<uint32_t>(o.size)) {
      check_aborted("connect");
      if (o.cancelled && o.cancelled()) {
        fail("connect", "gave up: a new generation was announced while the segment was being mapped", true);
      }
      for (int r = 0; r < o.size; ++r) {
        pid_t pid = pid_of(r);
        if (pid != 0 && watched(r) && process_dead(pid)) {
          fail_peer("connect", r, "died while connecting", PeerFate::kDead);
        }
      }
      if (std::chrono::steady_clock::now() > deadline_) {
        std::string missing;
        for (int r = 0; r < o.size; ++r) {
          if (pid_of(r) == 0) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        }
        fail("connect", "ranks " + missing + " did not map the segment within the timeout", true);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    ::shm_unlink(name_.c_str());
    guard.name.clear();
  }

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }

  void allreduce(void* data, size_t count, DataType type, ReduceOp op) override {
    begin("allreduce", CallSignature::allreduce(count, type, op));
    kernels::visit_cpu_type(type, [&](auto* tag) {
      allreduce_typed<std::remove_pointer_t<decltype(tag)>>(data, count, op);
    });
  }

  void broadcast(void* data, size_t bytes, int root) override {
    ERUN_CHECK(root >= 0 && root < size());
    const char* what = "broadcast";
    begin(what, CallSignature::broadcast(bytes, root));
    if (size() == 1 || bytes == 0) return;
    auto* p = static_cast<char*>(data);
    const bool is_root = rank() == root;
    if (bytes <= layout_.small_bytes) {
      char* buf = small(root, next_parity());
      if (is_root) std::memcpy(buf, p, bytes);
      sync(what);
      if (!is_root) std::memcpy(p, buf, bytes);
      return;
    }
    // Two halves of the staging area, alternately: the root fills one while
    // the others drain the other; one synchronisation per piece.
    fence(what);
    const size_t half = (layout_.result + layout_.step_bytes - layout_.step) / 2 / kLine * kLine;
    ERUN_CHECK(half > 0 && layout_.step + half <= layout_.result);  // the first half never overlaps the result area
    size_t steps = (bytes + half - 1) / half;
    for (size_t s = 0; s <= steps; ++s) {
      if (is_root && s < steps) {
        size_t off = s * half;
        std::memcpy(base() + layout_.step + (s % 2) * half, p + off, std::min(half, bytes - off));
      }
      if (!is_root && s > 0) {
        size_t off = (s - 1) * half;
        std::memcpy(p + off, base() + layout_.step + ((s - 1) % 2) * half, std::min(half, bytes - off));
      }
      sync(what);
    }
  }

  void allgather(const void* in, void* out, size_t bytes) override {
    begin("allgather", CallSignature::allgather(bytes));
    allgather_impl("allgather", in, out, bytes);
  }

  std::vector<std::vector<char>> allgatherv(const void* in, size_t bytes) override {
    const char* what = "allgatherv";
    begin(what, CallSignature::allgatherv());
    std::vector<uint64_t> sizes(size());
    uint64_t mine = bytes;
    allgather_impl(what, &mine, sizes.data(), sizeof(mine));
    std::vector<std::vector<char>> result(size());
    size_t longest = 0;
    for (int r = 0; r < size(); ++r) {
      result[r].resize(sizes[r]);
      longest = std::max<size_t>(longest, sizes[r]);
    }
    const auto* i = static_cast<const char*>(in);
    if (size() == 1) {
      if (bytes) std::memcpy(result[0].data(), i, bytes);
      return result;
    }
    if (longest == 0) return result;
    if (longest <= layout_.small_bytes) {
      int b = next_parity();
      if (bytes) std::memcpy(small(rank(), b), i, bytes);
      sync(what);
      for (int r = 0; r < size(); ++r) {
        if (sizes[r]) std::memcpy(result[r].data(), small(r, b), sizes[r]);
      }
      return result;
    }
    fence(what);
    const size_t step = layout_.step_bytes;
    for (size_t off = 0; off < longest; off += step) {
      if (off < bytes) std::memcpy(slot(rank()), i + off, std::min(step, bytes - off));
      sync(what);
      for (int r = 0; r < size(); ++r) {
        if (off < sizes[r]) std::memcpy(result[r].data() + off, slot(r), std::min<size_t>(step, sizes[r] - off));
      }
      sync(what);
    }
    return result;
  }

  void barrier() override {
    begin("barrier", CallSignature::barrier());
    if (size() > 1) sync("barrier");
  }

  void abort() override {
    aborted_.store(true);
    if (base()) publish_abort(kUserAbort);
  }

  void set_outside(bool outside) override {
    if (base()) ctl(rank()).outside.store(outside ? 1 : 0, std::memory_order_relaxed);
  }

 private:
  template <typename T>
  void allreduce_typed(void* data, size_t count, ReduceOp op) {
    switch (op) {
      case ReduceOp::kSum: return allreduce_op<T, ReduceOp::kSum>(static_cast<T*>(data), count);
      case ReduceOp::kAverage: return allreduce_op<T, ReduceOp::kAverage>(static_cast<T*>(data), count);
      case ReduceOp::kMin: return allreduce_op<T, ReduceOp::kMin>(static_cast<T*>(data), count);
      case ReduceOp::kMax: return allreduce_op<T, ReduceOp::kMax>(static_cast<T*>(data), count);
      case ReduceOp::kProduct: return allreduce_op<T, ReduceOp::kProduct>(static_cast<T*>(data), count);
    }
    ERUN_CHECK(false);
  }

  // After begin() (in allreduce()).
  template <typename T, ReduceOp OP>
  void allreduce_op(T* data, size_t count) {
    const char* what = "allreduce";
    const size_t n_ranks = static_cast<size_t>(size());
    if (count == 0 || n_ranks == 1) return;
    const T* in[64];
    std::vector<const T*> in_heap;
    const T** inputs = in;
    if (n_ranks > 64) {
      in_heap.resize(n_ranks);
      inputs = in_heap.data();
    }
    const size_t bytes = count * sizeof(T);
    if (bytes <= layout_.small_bytes) {
      // One synchronisation: everyone publishes, then everyone reduces it all.
      int b = next_parity();
      std::memcpy(small(rank(), b), data, bytes);
      sync(what);
      for (size_t r = 0; r < n_ranks; ++r) inputs[r] = reinterpret_cast<const T*>(small(static_cast<int>(r), b));
      kernels::reduce_all<T, OP>(data, inputs, n_ranks, count);
      if constexpr (OP == ReduceOp::kAverage) kernels::divide(data, count, size());
      return;
    }
    if (bytes <= direct_bytes()) return allreduce_direct<T, OP>(data, count, inputs);
    fence(what);
    // Pipelined reduce-scatter + allgather through the staging slots: per
    // piece, everyone stages it, rank r reduces the r-th part into the result
    // area, everyone copies the result out. With a CPU per rank the reduction
    // also writes the own part into the caller's buffer and the copy skips it.
    const bool own_part_done = own_part_in_reduce_ && OP != ReduceOp::kAverage;
    const size_t step = layout_.step_bytes / sizeof(T);
    T* result = reinterpret_cast<T*>(base() + layout_.result);
    for (size_t off = 0; off < count; off += step) {
      const size_t n = std::min(step, count - off);
      const size_t part = round_up((n + n_ranks - 1) / n_ranks, kLine / sizeof(T));
      const size_t lo = std::min(n, rank() * part), hi = std::min(n, lo + part);
      T* mine = reinterpret_cast<T*>(slot(rank()));
      std::memcpy(mine, data + off, lo * sizeof(T));
      std::memcpy(mine + hi, data + off + hi, (n - hi) * sizeof(T));
      sync(what);
      if (hi > lo) {
        for (size_t r = 0; r < n_ranks; ++r) {
          inputs[r] = r == static_cast<size_t>(rank()) ? data + off + lo
                                                        : reinterpret_cast<const T*>(slot(static_cast<int>(r))) + lo;
        }
        if (own_part_done) {
          kernels::reduce_all2<T, OP>(result + lo, data + off + lo, inputs, n_ranks, hi - lo);
        } else {
          kernels::reduce_all<T, OP>(result + lo, inputs, n_ranks, hi - lo);
          if constexpr (OP == ReduceOp::kAverage) kernels::divide(result + lo, hi - lo, size());
        }
      }
      sync(what);
      if (own_part_done) {
        std::memcpy(data + off, result, lo * sizeof(T));
        std::memcpy(data + off + hi, result + hi, (n - hi) * sizeof(T));
      } else {
        std::memcpy(data + off, result, n * sizeof(T));
      }
    }
    // No closing barrier: peers may still copy from the result area, which no
    // operation writes before its own first synchronisation (the broadcast's
    // first half lies below it; everything else writes slots or the small area).
  }

  // Every rank stages its whole vector in one half of its slot, then every
  // rank reduces all of them into its own buffer: one synchronisation. The
  // halves alternate, so a rank rewrites a half only after everyone passed the
  // next direct allreduce's synchronisation, i.e. finished reading it. Peers
  // may still read when this returns: `fence_` makes the next operation that
  // stages into the slots otherwise synchronise first.
  template <typename T, ReduceOp OP>
  void allreduce_direct(T* data, size_t count, const T** inputs) {
    const size_t offset = static_cast<size_t>(half_) * direct_bytes();
    half_ ^= 1;
    std::memcpy(slot(rank()) + offset, data, count * sizeof(T));
    sync("allreduce");
    for (int r = 0; r < size(); ++r) inputs[r] = reinterpret_cast<const T*>(slot(r) + offset);
    kernels::reduce_all<T, OP>(data, inputs, static_cast<size_t>(size()), count);
    if constexpr (OP == ReduceOp::kAverage) kernels::divide(data, count, size());
    fence_ = true;
  }

  // Bytes per rank up to which allreduce takes the direct path (after the
  // small one): half a slot. Measured on the 2-core VM (per-op 10th
  // percentile busbw, float32 sum), direct vs reduce-scatter + allgather:
  // 2 ranks 64 KiB 10.9 vs 7.5 GB/s, 256 KiB 9.2 vs 7.4, 512 KiB 9.2 vs 6.9,
  // but 1 MiB (as two direct pieces) 6.5 vs 17; 4 ranks 64 KiB 5.9 vs 0.6,
  // 256 KiB 7.3 vs 2.8. Extra work (all ranks read all inputs) is cheaper
  // than a second synchronisation up to about half a MiB.
  size_t direct_bytes() const { return layout_.step_bytes / 2 / kLine * kLine; }

  // Waits until no peer can still be reading the slots from a direct allreduce.
  void fence(const char* what) {
    if (!fence_) return;
    fence_ = false;
    sync(what);
  }

  // allgather after begin(): the caller's call signature is already set.
  void allgather_impl(const char* what, const void* in, void* out, size_t bytes) {
    if (bytes == 0) return;
    auto* o = static_cast<char*>(out);
    const auto* i = static_cast<const char*>(in);
    if (size() == 1) {
      if (o != i) std::memmove(o, i, bytes);
      return;
    }
    if (bytes <= layout_.small_bytes) {
      int b = next_parity();
      std::memcpy(small(rank(), b), i, bytes);
      sync(what);
      for (int r = 0; r < size(); ++r) {
        if (r != rank()) std::memcpy(o + r * bytes, small(r, b), bytes);
      }
      if (o + rank() * bytes != i) std::memcpy(o + rank() * bytes, small(rank(), b), bytes);
      return;
    }
    fence(what);
    const size_t step = layout_.step_bytes;
    for (size_t off = 0; off < bytes; off += step) {
      size_t n = std::min(step, bytes - off);
      std::memcpy(slot(rank()), i + off, n);
      sync(what);
      for (int r = 0; r < size(); ++r) std::memcpy(o + r * bytes + off, slot(r), n);
      sync(what);
    }
  }

  // --- segment ---

  void create(KvStore& store, UnlinkGuard& guard) {
    const uint64_t nonce = random_u64();
    Fd fd;
    for (int attempt = 0; attempt < 5 && !fd; ++attempt) {
      name_ = "/erun-" + sanitize(options_.segment_tag) + "-" + hex(attempt == 0 ? nonce : random_u64());
      fd.reset(::shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600));
      if (!fd && errno != EEXIST) break;
    }
    if (!fd) fail("connect", "cannot create shared memory segment " + name_ + ": " + errno_text(errno), false);
    guard.name = name_;
    if (::ftruncate(fd.get(), static_cast<off_t>(layout_.total)) != 0) {
      fail("connect", "cannot size shared memory segment " + name_ + ": " + errno_text(errno), false);
    }
    // Reserve the pages now: a /dev/shm that is too small is an error here,
    // not a SIGBUS in the middle of a collective.
    if (int err = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(layout_.total)); err != 0) {
      fail("connect",
           "cannot reserve " + std::to_string(layout_.total) + " bytes of shared memory for " + name_ + ": " +
               errno_text(err) + "; enlarge /dev/shm (e.g. docker --shm-size) or lower the staging sizes",
           false);
    }
    map(fd.get(), layout_.total);
    auto* h = new (base()) Header{};
    h->magic = kMagic;
    h->nonce = nonce;
    h->version = kVersion;
    h->size = static_cast<uint32_t>(options_.size);
    h->step_bytes = layout_.step_bytes;
    h->small_bytes = layout_.small_bytes;
    h->total_bytes = layout_.total;
    for (int r = 0; r < options_.size; ++r) {
      new (&ctl(r)) RankSlot{};
      new (&peer(r)) Peer{};
    }
    peer(0).pid_ns = pid_ns_;
    peer(0).pid.store(::getpid(), std::memory_order_release);
    h->attached.store(1, std::memory_order_release);
    std::string value = name_ + " " + hex(nonce);
    store.set("segment", std::vector<char>(value.begin(), value.end()));
  }

  void open(KvStore& store, UnlinkGuard& guard) {
    auto remaining = std::max(Duration::zero(), deadline_ - std::chrono::steady_clock::now());
    std::vector<char> raw;
    try {
      raw = store.get("segment", remaining);
    } catch (const CommError& e) {
      fail("connect", std::string("rank 0 did not publish the segment name: ") + e.what(), false);
    }
    std::string value(raw.begin(), raw.end());
    auto space = value.find(' ');
    if (space == std::string::npos) fail("connect", "malformed segment record '" + value + "'", false);
    name_ = value.substr(0, space);
    const uint64_t nonce = std::strtoull(value.c_str() + space + 1, nullptr, 16);
    Fd fd(::shm_open(name_.c_str(), O_RDWR | O_CLOEXEC, 0600));
    if (!fd) fail("connect", "cannot open shared memory segment " + name_ + ": " + errno_text(errno), false);
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0 || static_cast<size_t>(st.st_size) < sizeof(Header)) {
      fail("connect", "shared memory segment " + name_ + " is truncated", false);
    }
    // Rank 0 created it 0600 as this user; anything else was planted.
    if (st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) {
      char mode[8];
      std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
      fail("connect", "shared memory segment " + name_ + " is not private to this user (owner uid " +
                          std::to_string(st.st_uid) + ", mode " + mode + ")",
           false);
    }
    map(fd.get(), static_cast<size_t>(st.st_size));
    const Header* h = header();
    if (h->magic != kMagic || h->version != kVersion || h->nonce != nonce ||
        h->size != static_cast<uint32_t>(options_.size) || h->total_bytes != static_cast<uint64_t>(st.st_size)) {
      fail("connect", "shared memory segment " + name_ + " does not belong to this communicator (size " +
                          std::to_string(h->size) + ", expected " + std::to_string(options_.size) + ")",
           false);
    }
    // Rank 0's staging sizes win, whatever this rank was given.
    layout_ = Layout(options_.size, h->small_bytes, h->step_bytes);
    peer(rank()).pid_ns = pid_ns_;
    peer(rank()).pid.store(::getpid(), std::memory_order_release);
    if (header()->attached.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(options_.size)) {
      ::shm_unlink(name_.c_str());
    } else {
      guard.name = name_;
    }
  }

  void map(int fd, size_t len) {
    void* addr = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (addr == MAP_FAILED) fail("connect", "cannot map shared memory segment " + name_ + ": " + errno_text(errno), false);
    mapping_ = std::make_unique<Mapping>(addr, len);
  }

  char* base() const { return mapping_ ? mapping_->base() : nullptr; }
  Header* header() const { return reinterpret_cast<Header*>(base()); }
  RankSlot& ctl(int r) const { return reinterpret_cast<RankSlot*>(base() + layout_.ctl)[r]; }
  Peer& peer(int r) const { return reinterpret_cast<Peer*>(base() + layout_.pids)[r]; }
  pid_t pid_of(int r) const { return peer(r).pid.load(std::memory_order_acquire); }
  // Peers in another PID namespace (containers sharing /dev/shm) or threads
  // of this process are not watched: only the deadline catches those.
  bool watched(int r) const {
    return pid_of(r) != 0 && pid_of(r) != ::getpid() && pid_ns_ != 0 && peer(r).pid_ns == pid_ns_;
  }
  char* small(int r, int parity) const {
    return base() + layout_.small + (static_cast<size_t>(r) * 2 + parity) * layout_.small_bytes;
  }
  char* slot(int r) const { return base() + layout_.step + static_cast<size_t>(r) * layout_.step_bytes; }
  int next_parity() {
    int p = parity_;
    parity_ ^= 1;
    return p;
  }

  // --- synchronisation ---

  void begin(const char* what, const CallSignature& call) {
    if (aborted_) fail(what, "the communicator was aborted", false);
    if (broken_) fail(what, "an earlier operation failed: " + broken_reason_, false, failed_rank_, failed_fate_);
    if (base()) check_aborted(what);
    deadline_ = std::chrono::steady_clock::now() + options_.timeout;
    call_[0] = call.word0();
    call_[1] = call.word1();
  }

  // A barrier among all ranks that also checks that they all made the same
  // call: publish this rank's call signature, announce the next epoch, wait
  // until every rank has announced it, compare the signatures (in the cache
  // lines the wait has just read). A mismatch throws CallMismatch on every
  // rank, since each sees the same signatures.
  void sync(const char* what) {
    const uint64_t e = ++epoch_;
    RankSlot& me = ctl(rank());
    me.call[e & 1][0].store(call_[0], std::memory_order_relaxed);
    me.call[e & 1][1].store(call_[1], std::memory_order_relaxed);
    wait_all(e, what);
    for (int r = 0; r < size(); ++r) {
      const auto& c = ctl(r).call[e & 1];
      if (c[0].load(std::memory_order_relaxed) != call_[0] || c[1].load(std::memory_order_relaxed) != call_[1]) {
        mismatch(e, what);
      }
    }
  }

  // Announces epoch e (releasing the call signature stored before) and waits
  // until every rank has announced it. Busy-polls first (waking a sleeping process costs tens
  // of microseconds), only briefly when there are more ranks than CPUs (the
  // peers need this CPU), then yields a little, then sleeps on a futex that
  // every arrival wakes. Checks for abort, dead peers and the deadline.
  void wait_all(uint64_t e, const char* what) {
    Header* h = header();
    ctl(rank()).epoch.store(e, std::memory_order_seq_cst);
    if (h->sleepers.load(std::memory_order_seq_cst) != 0) wake_all();
    int waiting_for = pending(e, 0);
    if (waiting_for < 0) return;
    const auto start = std::chrono::steady_clock::now();
    for (uint32_t i = 1;; ++i) {
      cpu_relax();
      waiting_for = pending(e, waiting_for);
      if (waiting_for < 0) return;
      if ((i & 63) == 0) {
        if (h->aborted_by.load(std::memory_order_relaxed) != 0) break;
        if (std::chrono::steady_clock::now() - start > spin_) break;
      }
    }
    auto next_check = start;
    while ((waiting_for = pending(e, waiting_for)) >= 0) {
      check_aborted(what);
      auto now = std::chrono::steady_clock::now();
      if (now >= next_check) {
        for (int r = 0; r < size(); ++r) {
          if (ctl(r).epoch.load(std::memory_order_acquire) >= e) continue;
          pid_t pid = pid_of(r);
          if (watched(r) && process_dead(pid)) {
            fail_peer(what, r, "died (process " + std::to_string(pid) + " is gone)", PeerFate::kDead);
          }
        }
        if (now > deadline_) {
          if (ctl(waiting_for).outside.load(std::memory_order_relaxed) != 0) {
            // Busy elsewhere on purpose: whatever holds it up is not this
            // rank, and it reports that itself; blame nobody.
            fail(what,
                 "rank " + std::to_string(waiting_for) + " did not arrive within the timeout: it is busy in " +
                     options_.outside_work,
                 true, -1, PeerFate::kUnknown);
          }
          fail_peer(what, waiting_for,
                    "did not arrive within the timeout (process " + std::to_string(pid_of(waiting_for)) +
                        " is alive but stopped, hung or slow)",
                    PeerFate::kAlive);
        }
        next_check = now + std::chrono::milliseconds(2);
      }
      if (now - start < yield_) {
        ::sched_yield();
        continue;
      }
      // Sleep until an arrival bumps the futex word (or 2 ms pass, for the
      // checks above). Announcing ourselves before the last look at the
      // counters pairs with the poster's store-then-load of `sleepers`.
      const uint32_t seen = h->futex_word.load(std::memory_order_seq_cst);
      h->sleepers.fetch_add(1, std::memory_order_seq_cst);
      if (pending(e, waiting_for) >= 0 && h->aborted_by.load(std::memory_order_seq_cst) == 0) {
        struct timespec ts {0, 2'000'000};
        ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&h->futex_word), FUTEX_WAIT, seen, &ts, nullptr, 0);
      }
      h->sleepers.fetch_sub(1, std::memory_order_seq_cst);
    }
  }

  void wake_all() {
    Header* h = header();
    h->futex_word.fetch_add(1, std::memory_order_seq_cst);
    ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&h->futex_word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
  }

  // The first rank (from `from`, wrapping) that has not reached epoch e, or -1.
  int pending(uint64_t e, int from) const {
    const int n = size();
    for (int k = 0; k < n; ++k) {
      int r = (from + k) % n;
      if (ctl(r).epoch.load(std::memory_order_acquire) < e) return r;
    }
    return -1;
  }

  void check_aborted(const char* what) {
    if (aborted_) fail(what, "the communicator was aborted", false);
    uint32_t by = header()->aborted_by.load(std::memory_order_acquire);
    if (by == 0) return;
    int who = static_cast<int>(by) - 1;
    uint32_t kind = 0;
    for (int i = 0; i < 100000 && kind == 0; ++i) kind = header()->abort_kind.load(std::memory_order_acquire);
    if (kind == kUserAbort) fail(what, "rank " + std::to_string(who) + " aborted the communicator", false);
    std::string reason = kind ? std::string(header()->reason, strnlen(header()->reason, sizeof(header()->reason))) : "";
    int peer = kind ? header()->failed_rank : -1;
    auto fate = kind ? static_cast<PeerFate>(header()->failed_fate) : PeerFate::kUnknown;
    fail(what, "rank " + std::to_string(who) + " gave up: " + (reason.empty() ? "a failure" : reason), false, peer,
         fate);
  }

  void publish_abort(AbortKind kind, const std::string& reason = "", int peer = -1,
                     PeerFate fate = PeerFate::kUnknown) {
    uint32_t expected = 0;
    if (header()->aborted_by.compare_exchange_strong(expected, static_cast<uint32_t>(rank()) + 1)) {
      std::memset(header()->reason, 0, sizeof(header()->reason));
      std::memcpy(header()->reason, reason.data(), std::min(reason.size(), sizeof(header()->reason) - 1));
      header()->failed_rank = peer;
      header()->failed_fate = static_cast<uint32_t>(fate);
      header()->abort_kind.store(kind, std::memory_order_release);
    }
    wake_all();
  }

  // The ranks made different calls at synchronisation e: a bug in the
  // program, not a failure, so no CommError. Every rank throws by itself.
  [[noreturn]] void mismatch(uint64_t e, const char* what) {
    std::vector<RankCall> calls;
    for (int r = 0; r < size(); ++r) {
      const auto& c = ctl(r).call[e & 1];
      calls.push_back({r, CallSignature::unpack(c[0].load(std::memory_order_relaxed),
                                                c[1].load(std::memory_order_relaxed))});
    }
    CallMismatch err("shm " + std::string(what) + " on rank " + std::to_string(rank()) + " of " +
                         std::to_string(size()) + " (segment " + name_ + ")",
                     std::move(calls));
    broken_ = true;
    broken_reason_ = err.what();
    throw err;
  }

  [[noreturn]] void fail_peer(const char* what, int peer, const std::string& cause, PeerFate fate) {
    fail(what, "rank " + std::to_string(peer) + " " + cause, true, peer, fate);
  }

  // Marks the communicator broken (telling the peers through the segment when
  // `tell_peers`) and throws.
  [[noreturn]] void fail(const char* what, const std::string& cause, bool tell_peers, int peer = -1,
                         PeerFate fate = PeerFate::kUnknown) {
    if (!broken_) {
      broken_reason_ = cause;
      failed_rank_ = peer;
      failed_fate_ = fate;
    }
    broken_ = true;
    if (tell_peers && base()) publish_abort(kPeerFailure, cause, peer, fate);
    throw CommError("shm " + std::string(what) + " failed on rank " + std::to_string(rank()) + " of " +
                    std::to_string(size()) + " (segment " + (name_.empty() ? "-" : name_) + ", timeout " +
                    std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(options_.timeout).count()) +
                    " ms): " + cause + "; rebuild the communicator (restore and re-join)",
                    failed_rank_, failed_fate_);
  }

  const ShmOptions options_;
  Layout layout_;
  std::string name_;
  std::unique_ptr<Mapping> mapping_;
  TimePoint deadline_{};
  Duration spin_{};
  Duration yield_{};
  const uint64_t pid_ns_ = my_pid_namespace();
  uint64_t epoch_ = 0;
  int parity_ = 0;
  int half_ = 0;
  uint64_t call_[2] = {0, 0};  // this rank's current CallSignature words
  bool fence_ = false;
  bool own_part_in_reduce_ = true;
  bool broken_ = false;
  std::string broken_reason_;
  int failed_rank_ = -1;
  PeerFate failed_fate_ = PeerFate::kUnknown;
  std::atomic<bool> aborted_{false};
};

}  // namespace

std::unique_ptr<ShmCommunicator> make_shm_communicator(KvStore& store, const ShmOptions& options) {
  return std::make_unique<SegmentCommunicator>(store, options);
}

}  // namespace erun
