#include "collectives/shm/segment.h"
#include "collectives/hierarchical.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <linux/futex.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "common/check.h"
#include "common/fd.h"

namespace erun::shm {

static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared-memory counters must be lock-free");
static_assert(std::atomic<uint32_t>::is_always_lock_free, "shared-memory counters must be lock-free");

namespace {

constexpr size_t kPage = 4096;
constexpr uint64_t kMagic = 0x65'72'75'6e'73'68'6d'31ULL;  // "erunshm1"
constexpr uint32_t kVersion = 4;  // 2: call signatures in the rank slots; 3: the failed peer in the header; 4: `outside`

std::string errno_text(int err) { return std::strerror(err); }

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

uint64_t my_pid_namespace() {
  struct stat st {};
  return ::stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

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

}  // namespace

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

Layout::Layout(size_t size, size_t small_b, size_t step_b) {
  small_bytes = round_up(std::max<size_t>(small_b, kLine), kLine);
  step_bytes = round_up(std::max<size_t>(step_b, kPage), kPage);
  ctl = round_up(sizeof(Header), kLine);
  pids = ctl + size * sizeof(RankSlot);
  small = round_up(pids + size * sizeof(Peer), kPage);
  step = round_up(small + 2 * size * small_bytes, kPage);
  result = step + size * step_bytes;
  total = result + step_bytes;
}

// --- the segment ---

Segment::Segment(KvStore& store, const ShmOptions& o)
    : options_(o), layout_(o.size, o.small_bytes, o.step_bytes), pid_ns_(my_pid_namespace()) {
  ERUN_CHECK(o.size >= 1 && o.rank >= 0 && o.rank < o.size);
  const long cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
  const bool oversubscribed = o.size > cpus;
  spin_ = oversubscribed ? std::chrono::microseconds(2) : std::chrono::microseconds(200);
  yield_ = oversubscribed ? Duration::zero() : Duration(std::chrono::milliseconds(1));
  cpu_per_rank_ = !oversubscribed;
  if (o.size == 1) return;
  deadline_ = std::chrono::steady_clock::now() + o.timeout;
  UnlinkGuard guard;
  if (o.rank == 0) {
    create(store, guard);
  } else {
    open(store, guard);
  }
  await_mapped();
  ::shm_unlink(name_.c_str());
  guard.name.clear();
}

Segment::~Segment() = default;

// Everyone waits until all have mapped the segment; then the name goes.
void Segment::await_mapped() {
  const ShmOptions& o = options_;
  while (header()->attached.load(std::memory_order_acquire) < static_cast<uint32_t>(o.size)) {
    check_aborted("connect");
    if (o.cancelled && o.cancelled()) {
      fail("connect", "gave up: a new generation was announced while the segment was being mapped", true);
    }
    for (int r = 0; r < o.size; ++r) {
      pid_t pid = pid_of(r);
      // A rank that mapped it, passed this wait and exited meanwhile did not
      // die while connecting: look at the count again once it is gone.
      if (pid != 0 && watched(r) && process_dead(pid) &&
          header()->attached.load(std::memory_order_acquire) < static_cast<uint32_t>(o.size)) {
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
}

void Segment::create(KvStore& store, UnlinkGuard& guard) {
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
    const std::string cause = "cannot reserve " + std::to_string(layout_.total) + " bytes of shared memory for " +
                              name_ + ": " + errno_text(err) +
                              "; enlarge /dev/shm (e.g. docker --shm-size) or lower the staging sizes";
    if (err == ENOSPC) {
      broken_ = true;
      broken_reason_ = cause;
      throw ShmNoRoom("shm connect failed on rank " + std::to_string(rank()) + " of " + std::to_string(size()) +
                      ": " + cause);
    }
    fail("connect", cause, false);
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

void Segment::open(KvStore& store, UnlinkGuard& guard) {
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

void Segment::map(int fd, size_t len) {
  void* addr = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (addr == MAP_FAILED) fail("connect", "cannot map shared memory segment " + name_ + ": " + errno_text(errno), false);
  mapping_ = std::make_unique<Mapping>(addr, len);
  base_ = mapping_->base();
}

Header* Segment::header() const { return reinterpret_cast<Header*>(base()); }
RankSlot& Segment::ctl(int r) const { return reinterpret_cast<RankSlot*>(base() + layout_.ctl)[r]; }
Peer& Segment::peer(int r) const { return reinterpret_cast<Peer*>(base() + layout_.pids)[r]; }
pid_t Segment::pid_of(int r) const { return peer(r).pid.load(std::memory_order_acquire); }
// Peers in another PID namespace (containers sharing /dev/shm) or threads
// of this process are not watched: only the deadline catches those.
bool Segment::watched(int r) const {
  return pid_of(r) != 0 && pid_of(r) != ::getpid() && pid_ns_ != 0 && peer(r).pid_ns == pid_ns_;
}

// --- synchronisation ---

void Segment::abort() {
  aborted_.store(true);
  if (base()) publish_abort(kUserAbort);
}

void Segment::set_outside(bool outside) {
  if (base()) ctl(rank()).outside.store(outside ? 1 : 0, std::memory_order_release);
}

void Segment::begin(const char* what, const CallSignature& call) {
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
void Segment::sync(const char* what) {
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
void Segment::wait_all(uint64_t e, const char* what) {
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
      check_peers(e, waiting_for, now, what);
      next_check = now + std::chrono::milliseconds(2);
    }
    if (now - start < yield_) {
      ::sched_yield();
      continue;
    }
    futex_wait(e, waiting_for);
  }
}

// Fails when a rank that has not reached epoch e died, or when the deadline
// passed (blaming `waiting_for` unless it is busy outside on purpose).
void Segment::check_peers(uint64_t e, int waiting_for, TimePoint now, const char* what) {
  for (int r = 0; r < size(); ++r) {
    if (ctl(r).epoch.load(std::memory_order_acquire) >= e) continue;
    pid_t pid = pid_of(r);
    // Its epoch is read again once it is gone: a rank may announce e, leave
    // the barrier (every other rank had arrived) and exit between the load
    // above and the look at its process, and then it did arrive.
    if (watched(r) && process_dead(pid) && ctl(r).epoch.load(std::memory_order_acquire) < e) {
      fail_peer(what, r, "died (process " + std::to_string(pid) + " is gone)", PeerFate::kDead);
    }
  }
  if (now <= deadline_) return;
  if (ctl(waiting_for).outside.load(std::memory_order_acquire) != 0) {
    // Busy elsewhere on purpose: whatever holds it up is not this
    // rank, and it reports that itself; blame nobody.
    fail(what,
         "rank " + std::to_string(waiting_for) + " did not arrive within the timeout: it is busy in " +
             options_.outside_work,
         true, -1, PeerFate::kUnknown);
  }
  // A rank whose outside work failed aborts before it clears its mark (see
  // OutsideMark): seeing the mark cleared, look for that abort again, since
  // it may have come after the look at the top of the wait loop.
  check_aborted(what);
  fail_peer(what, waiting_for,
            "did not arrive within the timeout (process " + std::to_string(pid_of(waiting_for)) +
                " is alive but stopped, hung or slow)",
            PeerFate::kAlive);
}

// Sleeps until an arrival bumps the futex word (or 2 ms pass, for the
// waiter's checks). Announcing ourselves before the last look at the
// counters pairs with the poster's store-then-load of `sleepers`.
void Segment::futex_wait(uint64_t e, int waiting_for) {
  Header* h = header();
  const uint32_t seen = h->futex_word.load(std::memory_order_seq_cst);
  h->sleepers.fetch_add(1, std::memory_order_seq_cst);
  if (pending(e, waiting_for) >= 0 && h->aborted_by.load(std::memory_order_seq_cst) == 0) {
    struct timespec ts {0, 2'000'000};
    ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&h->futex_word), FUTEX_WAIT, seen, &ts, nullptr, 0);
  }
  h->sleepers.fetch_sub(1, std::memory_order_seq_cst);
}

void Segment::wake_all() {
  Header* h = header();
  h->futex_word.fetch_add(1, std::memory_order_seq_cst);
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&h->futex_word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

// The first rank (from `from`, wrapping) that has not reached epoch e, or -1.
int Segment::pending(uint64_t e, int from) const {
  const int n = size();
  for (int k = 0; k < n; ++k) {
    int r = (from + k) % n;
    if (ctl(r).epoch.load(std::memory_order_acquire) < e) return r;
  }
  return -1;
}

void Segment::check_aborted(const char* what) {
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

void Segment::publish_abort(AbortKind kind, const std::string& reason, int peer, PeerFate fate) {
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
void Segment::mismatch(uint64_t e, const char* what) {
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

void Segment::fail_peer(const char* what, int peer, const std::string& cause, PeerFate fate) {
  fail(what, "rank " + std::to_string(peer) + " " + cause, true, peer, fate);
}

// Marks the communicator broken (telling the peers through the segment when
// `tell_peers`) and throws.
void Segment::fail(const char* what, const std::string& cause, bool tell_peers, int peer, PeerFate fate) {
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

}  // namespace erun::shm
