#include "commits/host_commits.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <string_view>

#include <fmt/format.h>

#include "commits/commit_files.h"
#include "common/check.h"
#include "common/private_files.h"
#include "erun/errors.hpp"

namespace erun::state_internal {
namespace {

static_assert(std::endian::native == std::endian::little, "host-memory commit files are little-endian");

constexpr const char* kSuffix[2] = {".a", ".b"};
constexpr uint32_t kHostVersion = 2;
constexpr size_t kHeaderBytes = 64;
constexpr size_t kAlign = 64;
constexpr size_t kTrailerBytes = 16;

std::string dir_of(const std::string& stem) {
  auto slash = stem.rfind('/');
  return slash == std::string::npos ? std::string(".") : stem.substr(0, slash);
}

size_t aligned(size_t n) { return (n + kAlign - 1) & ~(kAlign - 1); }

// What a commit of `bytes` that found no room in the directory of `stem`
// adds to its error: how much the file system has free, and what to do.
std::string no_room_advice(const std::string& stem, size_t bytes) {
  struct statvfs fs {};
  const std::string dir = dir_of(dir_of(stem));  // the file system the job's directory is on
  const std::string free_mib =
      ::statvfs(dir.c_str(), &fs) == 0
          ? fmt::format("{:.1f}", static_cast<double>(fs.f_bavail) * static_cast<double>(fs.f_frsize) / (1 << 20))
          : std::string("?");
  return fmt::format(". {} has {} MiB free and needs room for 2 copies of the state ({} bytes each) per worker of "
                     "this host: the commit is kept in worker memory only; enlarge it (e.g. docker run --shm-size) "
                     "or free space there",
                     dir, free_mib, bytes);
}

void put_u32(char* p, uint32_t v) { std::memcpy(p, &v, sizeof v); }
void put_u64(char* p, uint64_t v) { std::memcpy(p, &v, sizeof v); }
uint32_t get_u32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
uint64_t get_u64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
// When a file was claimed, on a clock every process of the host shares and
// no one sets: which of two files holding the same commit was written last.
uint64_t boot_nanoseconds() {
  timespec t{};
  ::clock_gettime(CLOCK_BOOTTIME, &t);
  return static_cast<uint64_t>(t.tv_sec) * 1000000000u + static_cast<uint64_t>(t.tv_nsec);
}
// Copies into the host file with non-temporal stores where the CPU has
// them: the file is read again only after a failure, so its lines need not
// take the cache from the state being copied (at sizes the cache holds, a
// plain copy into one of two files in turn evicted its own source). `dst` is
// 64-byte aligned (the layout's data offsets).
void copy_out(char* dst, const char* src, size_t n) {
#if defined(__SSE2__)
  if (n >= (size_t{1} << 20)) {
    // The streaming stores want 16-byte aligned destinations (an entry's
    // pieces after the first may start anywhere).
    size_t i = (16 - reinterpret_cast<uintptr_t>(dst) % 16) % 16;
    std::memcpy(dst, src, i);
    for (; i + 64 <= n; i += 64) {
      __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
      __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
      __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
      __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
    }
    _mm_sfence();
    if (i < n) std::memcpy(dst + i, src + i, n - i);
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

// Keeps the compiler from moving the stores around it: a worker killed at
// any point has made visible exactly the stores before that point.
void in_order() { std::atomic_signal_fence(std::memory_order_seq_cst); }

struct Layout {
  size_t table_end = 0;
  std::vector<size_t> offsets;  // of each entry's data
  size_t trailer = 0;
  size_t total = 0;
};

Layout layout_of(const std::vector<EntryRef>& entries) {
  Layout l;
  size_t at = kHeaderBytes;
  for (const EntryRef& e : entries) at += 8 + e.name->size() + 16;
  l.table_end = at;
  at = aligned(at);
  for (const EntryRef& e : entries) {
    l.offsets.push_back(at);
    at = aligned(at + e.size);
  }
  l.trailer = at;
  l.total = at + kTrailerBytes;
  return l;
}

// The header, then the table: the claim first, so that from here until the
// trailer the file is torn.
void claim(char* m, uint64_t commit_id, uint32_t flags, const std::vector<EntryRef>& entries, const Layout& l) {
  std::memcpy(m, "ERUNSTAT", 8);
  put_u32(m + 8, kHostVersion);
  put_u32(m + 12, flags);
  put_u64(m + 16, commit_id);
  put_u64(m + l.trailer, 0);  // whatever lay there, not this commit's id
  // A reader in another process (the host side's persister) copying the
  // previous commit out of this file sees the claim before any later store,
  // the non-temporal ones included.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  put_u64(m + 24, entries.size());
  put_u64(m + 32, l.trailer);
  put_u64(m + 40, boot_nanoseconds());
  std::memset(m + 48, 0, kHeaderBytes - 48);
  size_t at = kHeaderBytes;
  for (size_t k = 0; k < entries.size(); ++k) {
    const EntryRef& e = entries[k];
    put_u64(m + at, e.name->size());
    std::memcpy(m + at + 8, e.name->data(), e.name->size());
    at += 8 + e.name->size();
    put_u64(m + at, e.size);
    put_u64(m + at + 8, l.offsets[k]);
    at += 16;
  }
}

// The header's claims, checked against each other and the file's size; the
// table is checked by the CRC in the trailer. 0 when the file holds no
// complete commit.
struct Claims {
  uint64_t id = 0;
  uint64_t count = 0;
  uint64_t trailer = 0;
};
std::optional<Claims> claims_of(const char* header, size_t file_size) {
  if (file_size < kHeaderBytes + kTrailerBytes || std::memcmp(header, "ERUNSTAT", 8) != 0 ||
      get_u32(header + 8) != kHostVersion) {
    return std::nullopt;
  }
  Claims c{get_u64(header + 16), get_u64(header + 24), get_u64(header + 32)};
  if (c.id == 0 || c.trailer < kHeaderBytes || c.trailer > file_size - kTrailerBytes) return std::nullopt;
  return c;
}

// Walks the table in p[0, avail): calls entry(name, data length, data
// offset) for each entry (false: malformed) and returns where the table
// ends; nullopt when it does not end within `avail` bytes or is malformed.
template <typename Fn>
std::optional<size_t> walk_table(const char* p, size_t avail, uint64_t count, Fn&& entry) {
  size_t at = kHeaderBytes;
  for (uint64_t k = 0; k < count; ++k) {
    if (avail - at < 8) return std::nullopt;
    const uint64_t name_len = get_u64(p + at);
    if (name_len > avail - at - 8 || avail - at - 8 - name_len < 16) return std::nullopt;
    const char* name = p + at + 8;
    if (!entry(std::string_view(name, name_len), get_u64(name + name_len), get_u64(name + name_len + 8))) {
      return std::nullopt;
    }
    at += 8 + name_len + 16;
  }
  return at;
}

// Parses the whole file; nullopt when torn or malformed.
std::optional<Snapshot> parse(const char* p, size_t size) {
  auto c = claims_of(p, size);
  if (!c || get_u64(p + c->trailer) != c->id) return std::nullopt;
  Snapshot snap;
  snap.commit_id = c->id;
  auto end = walk_table(p, c->trailer, c->count, [&](std::string_view name, uint64_t len, uint64_t off) {
    if (off > c->trailer || len > c->trailer - off) return false;
    snap.entries.emplace_back(std::string(name), std::vector<char>(p + off, p + off + len));
    return true;
  });
  if (!end || get_u32(p + c->trailer + 8) != crc32c(0, p, *end)) return std::nullopt;
  return snap;
}

// What a file holds whole, read without its data: header, table (for the
// CRC) and trailer. nullopt when torn, foreign or unreadable.
std::optional<HostCommits::Listing> read_listing(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return std::nullopt;
  const size_t size = static_cast<size_t>(st.st_size);
  char header[kHeaderBytes];
  if (size < kHeaderBytes || !pread_all(fd, header, sizeof header, 0)) return std::nullopt;
  auto c = claims_of(header, size);
  if (!c) return std::nullopt;
  char trailer[kTrailerBytes];
  if (!pread_all(fd, trailer, sizeof trailer, c->trailer) || get_u64(trailer) != c->id) return std::nullopt;
  // The table: read in growing pieces until it is whole (it ends before the
  // first entry's data, so a small state keeps it short).
  std::vector<char> meta;
  for (size_t want = std::min<size_t>(c->trailer, 64 << 10);; want = std::min<size_t>(c->trailer, want * 2)) {
    meta.resize(want);
    if (!pread_all(fd, meta.data(), meta.size(), 0)) return std::nullopt;
    HostCommits::Listing l;
    auto end = walk_table(meta.data(), meta.size(), c->count, [&](std::string_view name, uint64_t len, uint64_t off) {
      if (off > c->trailer || len > c->trailer - off) return false;
      l.names.emplace_back(name);
      l.sizes.push_back(len);
      l.offsets.push_back(off);
      return true;
    });
    if (end) {
      if (get_u32(trailer + 8) != crc32c(0, meta.data(), *end)) return std::nullopt;
      l.id = c->id;
      l.flags = get_u32(meta.data() + 12);
      l.written_ns = get_u64(meta.data() + 40);
      return l;
    }
    if (want == c->trailer) return std::nullopt;  // the table runs into the trailer
  }
}

}  // namespace

bool pread_all(int fd, char* out, uint64_t n, uint64_t offset) {
  while (n > 0) {
    ssize_t r = ::pread(fd, out, std::min<uint64_t>(n, uint64_t{1} << 30), static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    out += r;
    n -= static_cast<uint64_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return true;
}

HostCommits::HostCommits(std::string stem, bool discard) : stem_(std::move(stem)), discard_(discard) {}

std::string HostCommits::stem_of(const std::string& stem, int ordinal) {
  return ordinal == 0 ? stem : fmt::format("{}-s{}", stem, ordinal);
}

int HostCommits::ordinal_of(const std::string& file_name) {
  // NAME.a / NAME.b, NAME ending in -s<digits> for the States after the first
  // (a worker's own stem ends in its local index, digits without the s).
  if (file_name.size() < 3) return -1;
  const std::string name = file_name.substr(0, file_name.size() - 2);
  auto dash = name.rfind("-s");
  if (dash == std::string::npos || dash + 2 == name.size()) return 0;
  int k = 0;
  for (size_t i = dash + 2; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || k > 1000000) return 0;
    k = k * 10 + (name[i] - '0');
  }
  return k;
}

void Completion::done() {
  if (left_.fetch_sub(1, std::memory_order_acq_rel) != 1 || abandoned_.load(std::memory_order_acquire)) return;
  // Every filler's bytes are in the file (each done() came after its copy).
  std::atomic_thread_fence(std::memory_order_seq_cst);
  put_u64(trailer_, id_);  // complete
  std::atomic_thread_fence(std::memory_order_seq_cst);
  whole_.store(true, std::memory_order_release);
}

HostCommits::~HostCommits() {
  for (int i = 0; i < 2; ++i) {
    // A copy that may still land (its filler never said done) keeps its
    // mapping: leaked rather than written after munmap.
    if (pending_ == nullptr || pending_->file_ != i || pending_->complete()) unmap(i);
    if (fd_[i] >= 0) ::close(fd_[i]);
  }
}

bool HostCommits::flush() {
  if (!wrote_ || map_[last_] == nullptr) return false;
  return ::msync(map_[last_], map_len_[last_], MS_SYNC) == 0;
}

void HostCommits::unmap(int i) {
  if (map_[i] == nullptr) return;
  if (pinned_[i]) pinner_->unpin(map_[i]);
  pinned_[i] = false;
  ::munmap(map_[i], map_len_[i]);
  map_[i] = nullptr;
  map_len_[i] = 0;
}

bool HostCommits::set_pinner(std::shared_ptr<MappingPinner> pinner) {
  if (pinner != pinner_) {
    for (int i = 0; i < 2; ++i) {
      if (pinned_[i]) pinner_->unpin(map_[i]);
      pinned_[i] = false;
    }
    pinner_ = std::move(pinner);
  }
  bool all = true;
  for (int i = 0; i < 2; ++i) {
    if (pinner_ != nullptr && in_memory_ && map_[i] != nullptr && !pinned_[i]) {
      pinned_[i] = pinner_->pin(map_[i], map_len_[i]);
    }
    all = all && (map_[i] == nullptr || pinned_[i]);
  }
  return all;
}

void HostCommits::settle() {
  if (pending_ != nullptr && pending_->complete()) {
    held_[pending_->file_] = pending_->id_;
    last_ = pending_->file_;
    wrote_ = true;
    pending_.reset();
  }
}

void HostCommits::forget_writes() {
  if (!opened_) return;  // open_files() reads them
  settle();
  ERUN_CHECK(pending_ == nullptr);
  for (int i = 0; i < 2; ++i) {
    auto listing = read_listing(fd_[i]);  // open_files() opened both or threw
    held_[i] = listing ? listing->id : 0;
    written_[i] = listing ? listing->written_ns : 0;
  }
  wrote_ = false;
}

void HostCommits::abandon() {
  if (pending_ == nullptr) return;
  pending_->abandoned_.store(true, std::memory_order_release);
  settle();  // it may have completed after all
  pending_.reset();
}

void HostCommits::open_files() {
  opened_ = true;
  const std::string dir = dir_of(stem_);
  DirPolicy policy;
  policy.refuse_link = true;
  if (Status ok = ensure_private_dir(dir, "host-memory commit directory", policy); !ok) {
    throw Error("erun: " + ok.message());
  }
  for (int i = 0; i < 2; ++i) {
    const std::string path = stem_ + kSuffix[i];
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
      throw Error(fmt::format("erun: cannot open host-memory commit file {}: {}{}", path, std::strerror(errno),
                              errno == ELOOP ? " (a symbolic link: erun never writes through one; remove it)" : ""));
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) {
      ::close(fd);
      throw Error(fmt::format("erun: host-memory commit file {} is not a regular file owned by this user; "
                              "remove it",
                              path));
    }
    fd_[i] = fd;
    // Pinning pages of a file on disk would let the kernel drop what a
    // device wrote into them: only memory file systems are pinned.
    struct statfs fs {};
    in_memory_ = ::fstatfs(fd, &fs) == 0 && (fs.f_type == TMPFS_MAGIC || fs.f_type == HUGETLBFS_MAGIC);
    if (discard_) {
      // An earlier State of this process wrote these: never a commit of this one.
      if (::ftruncate(fd, 0) != 0) {
        throw Error(fmt::format("erun: cannot empty host-memory commit file {}: {}", path, std::strerror(errno)));
      }
      continue;
    }
    // What a previous worker of this slot left: keep its newest commit whole.
    auto listing = read_listing(fd);
    held_[i] = listing ? listing->id : 0;
    written_[i] = listing ? listing->written_ns : 0;
  }
}

// Room for `size` bytes in file i, allocated and mapped. Pages are reserved
// first: a full /dev/shm fails here, before a byte of the file changes, never
// later with SIGBUS. The file and its mapping only grow, so from the second
// commit on (each file once) a commit touches no new page.
int HostCommits::map(int i, size_t size) {
  if (size > reserved_[i]) {
    if (int err = ::posix_fallocate(fd_[i], 0, static_cast<off_t>(size)); err != 0 && err != EOPNOTSUPP) return err;
    struct stat st {};
    if (::fstat(fd_[i], &st) != 0) return errno;
    if (static_cast<size_t>(st.st_size) < size && ::ftruncate(fd_[i], static_cast<off_t>(size)) != 0) return errno;
    reserved_[i] = std::max(size, static_cast<size_t>(st.st_size));
  }
  if (map_len_[i] < size) {
    unmap(i);
    void* p = ::mmap(nullptr, reserved_[i], PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd_[i], 0);
    if (p == MAP_FAILED) return errno;
    map_[i] = static_cast<char*>(p);
    map_len_[i] = reserved_[i];
    if (pinner_ != nullptr && in_memory_) pinned_[i] = pinner_->pin(map_[i], map_len_[i]);
  }
  return 0;
}

// The file the next commit goes to. Once this writer has written, the file
// not written last: its State's entries may read their bytes in the one
// written last, which holds the State's commit even where the other holds a
// higher id (a sharded State that went back to an older commit, the newer
// one not whole across the job, wrote that one again in its new layout). A
// new writer keeps its predecessor's newest commit: it writes the file of the
// older one; when both hold the same commit (its second layout, written by
// a sharded State's reshard or a buddy push after it), the one written
// first. Either way, never over the commit keep_commit() names.
int HostCommits::file_to_write() const {
  auto older = [](const uint64_t (&v)[2]) { return v[0] < v[1] ? 0 : 1; };
  int i = wrote_                    ? 1 - last_
          : held_[0] != held_[1]    ? older(held_)
          : written_[0] != written_[1] ? older(written_)
                                      : 1 - last_;
  if (keep_ != 0 && held_[i] == keep_ && held_[1 - i] != keep_) i = 1 - i;
  return i;
}

std::optional<std::string> HostCommits::write(uint64_t commit_id, const std::vector<EntryRef>& entries,
                                              std::vector<const char*>* placed, uint32_t flags,
                                              std::shared_ptr<Completion>* completion) {
  if (!opened_) open_files();
  settle();
  const int i = file_to_write();
  const std::string path = stem_ + kSuffix[i];
  if (pending_ != nullptr) {
    return fmt::format("erun: host-memory commit {} was not written to {}: commit {} is still being copied into {}",
                       commit_id, path, pending_->id_, stem_ + kSuffix[pending_->file_]);
  }
  const int later = static_cast<int>(std::count_if(entries.begin(), entries.end(), [](const EntryRef& e) {
    return e.later;
  }));
  ERUN_CHECK(later == 0 || (placed != nullptr && completion != nullptr));
  const Layout l = layout_of(entries);
  if (int err = map(i, l.total); err != 0) {
    return fmt::format("erun: host-memory commit {} was not written to {}: {}; the previous commit stays in {}{}",
                       commit_id, path, std::strerror(err), stem_ + kSuffix[1 - i],
                       err == ENOSPC ? no_room_advice(stem_, l.total) : "");
  }
  held_[i] = 0;
  char* m = map_[i];
  claim(m, commit_id, flags, entries, l);
  if (placed != nullptr) placed->clear();
  for (size_t k = 0; k < entries.size(); ++k) {
    char* to = m + l.offsets[k];
    if (!entries[k].later) {
      entries[k].each_range([&](const char* p, size_t n) {
        copy_out(to, p, n);
        to += n;
      });
    }
    if (placed != nullptr) placed->push_back(m + l.offsets[k]);
  }
  put_u32(m + l.trailer + 8, crc32c(0, m, l.table_end));
  if (later > 0) {
    auto c = std::make_shared<Completion>();
    c->left_.store(later, std::memory_order_relaxed);
    c->trailer_ = m + l.trailer;
    c->id_ = commit_id;
    c->file_ = i;
    pending_ = c;
    *completion = std::move(c);
    return std::nullopt;  // whole at the last filler's done()
  }
  in_order();
  put_u64(m + l.trailer, commit_id);  // complete
  in_order();
  held_[i] = commit_id;
  last_ = i;
  wrote_ = true;
  return std::nullopt;
}

std::optional<std::string> HostCommits::room_warning(const std::vector<EntryRef>& entries, int workers) const {
  const size_t bytes = layout_of(entries).total;
  const std::string dir = dir_of(stem_);
  struct statvfs fs {};
  if (::statvfs(dir.c_str(), &fs) != 0) return std::nullopt;
  const unsigned long long free_bytes = static_cast<unsigned long long>(fs.f_bavail) * fs.f_frsize;
  unsigned long long held = 0;  // this job's files count as room: they are overwritten
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      struct stat st {};
      if (::fstatat(::dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode)) {
        held += static_cast<unsigned long long>(st.st_blocks) * 512;
      }
    }
    ::closedir(d);
  }
  const unsigned long long need = 2ULL * bytes * static_cast<unsigned long long>(std::max(workers, 1));
  if (free_bytes + held >= need) return std::nullopt;
  auto mib = [](unsigned long long b) { return static_cast<double>(b) / (1 << 20); };
  return fmt::format(
      "erun: {} has {:.0f} MiB free, but host-memory commits need 2 copies of the state ({:.1f} MiB) for each "
      "of the {} worker(s) on this host, {:.0f} MiB: commits that do not fit are kept only in worker memory. "
      "Enlarge it (e.g. docker run --shm-size={}m) or pass --no-host-commits",
      dir_of(dir), mib(free_bytes + held), mib(bytes), std::max(workers, 1), mib(need),
      static_cast<unsigned long long>(mib(need)) + 64);
}

std::optional<HostCommits::Listing> HostCommits::list(int fd) { return read_listing(fd); }

Fd HostCommits::open_own(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  struct stat st {};
  if (fd && (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid())) fd.reset();
  return fd;
}

namespace {

// The commit id a file's header claims and its trailer repeats (header and
// trailer read only; the table's CRC is not checked); nullopt otherwise.
std::optional<uint64_t> claimed_whole(int fd) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  char header[kHeaderBytes];
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !pread_all(fd, header, sizeof header, 0)) return std::nullopt;
  auto c = claims_of(header, static_cast<size_t>(st.st_size));
  char trailer[8];
  if (!c || !pread_all(fd, trailer, sizeof trailer, c->trailer) || get_u64(trailer) != c->id) return std::nullopt;
  return c->id;
}

}  // namespace

bool HostCommits::held(int fd, uint64_t id) { return claimed_whole(fd) == id; }

std::optional<Snapshot> HostCommits::read(const std::string& path) {
  Fd fd = open_own(path);
  if (!fd) return std::nullopt;  // a link, or not this user's
  // Whole before its data is read (a writer's stores, device copies
  // included, come before its trailer), and not claimed again by the end.
  const auto id = claimed_whole(fd.get());
  struct stat st {};
  if (!id || ::fstat(fd.get(), &st) != 0) return std::nullopt;
  std::vector<char> bytes(static_cast<size_t>(st.st_size));
  if (!pread_all(fd.get(), bytes.data(), bytes.size(), 0)) return std::nullopt;
  auto snap = parse(bytes.data(), bytes.size());
  if (!snap || snap->commit_id != *id || !held(fd.get(), *id)) return std::nullopt;
  return snap;
}

std::optional<Snapshot> HostCommits::read_held(uint64_t id, const Keep& keep) {
  if (!opened_) open_files();
  settle();
  for (int i = 0; i < 2; ++i) {
    if (id != 0 && held_[i] == id) return keep ? read(stem_ + kSuffix[i], keep) : read(stem_ + kSuffix[i]);
  }
  return std::nullopt;
}

std::optional<Snapshot> HostCommits::read(const std::string& path, const Keep& keep) {
  Fd fd = open_own(path);
  if (!fd) return std::nullopt;
  auto l = read_listing(fd.get());
  if (!l) return std::nullopt;
  Snapshot snap;
  snap.commit_id = l->id;
  for (size_t k = 0; k < l->names.size(); ++k) {
    if (!keep(l->names[k])) continue;
    std::vector<char> bytes(static_cast<size_t>(l->sizes[k]));
    if (!pread_all(fd.get(), bytes.data(), bytes.size(), l->offsets[k])) return std::nullopt;
    snap.entries.emplace_back(l->names[k], std::move(bytes));
  }
  if (!held(fd.get(), l->id)) return std::nullopt;  // overwritten while read
  return snap;
}

std::optional<HostCommits::Found> HostCommits::newest(const std::string& dir, int ordinal, const Keep& keep) {
  for (const ClaimedCommit& c : claimed_commits(dir)) {
    if (ordinal_of(c.name) != ordinal) continue;
    const std::string path = dir + "/" + c.name;
    // Else torn by a killed worker, or not ours.
    if (auto snap = keep ? read(path, keep) : read(path)) return Found{std::move(*snap), path};
  }
  return std::nullopt;
}

std::optional<HostCommits::Claim> HostCommits::newest_claim(const std::string& dir, int ordinal) {
  for (const ClaimedCommit& c : claimed_commits(dir)) {
    if (ordinal_of(c.name) != ordinal) continue;
    const std::string path = dir + "/" + c.name;
    Fd fd = open_own(path);
    if (!fd) continue;
    auto l = read_listing(fd.get());
    if (l && l->id == c.id) return Claim{l->id, path};  // else torn by a killed worker, or not ours
  }
  return std::nullopt;
}

}  // namespace erun::state_internal
