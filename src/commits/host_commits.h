// HostCommits: a State's two commit files in the job's host-memory directory,
// mapped and written in place (docs/state.md, "Where a commit lives", and the
// file layout there). An object is used from its State's training thread only;
// the static readers also serve the host side's persister (commits/persist.h).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "commits/snapshot.h"
#include "common/fd.h"

namespace erun::state_internal {

// Header flags: the commit was made by the job's rank 0 (the one whose State
// the host side persists to --checkpoint-dir, commits/persist.h).
inline constexpr uint32_t kRankZeroCommit = 1;

// Reads exactly n bytes at `offset`; false on an error or an early end (a
// file truncated under the reader).
bool pread_all(int fd, char* out, uint64_t n, uint64_t offset);

// Registers a commit file's mapping with a device runtime, so that copies
// from the device land in it directly (state/device_state.cc registers it
// with CUDA). A mapping pin() refused stays usable: copies into it are then
// staged by the runtime, slower but whole.
class MappingPinner {
 public:
  virtual ~MappingPinner() = default;
  virtual bool pin(void* p, size_t n) = 0;
  virtual void unpin(void* p) = 0;
};

// A commit written but for its entries filled later (EntryRef::later): the
// file holds it whole once every filler called done(), in any order and from
// any thread (a CUDA host callback: done() only stores to memory). The
// filler must not write into the file after done().
class Completion {
 public:
  void done();
  bool complete() const { return whole_.load(std::memory_order_acquire); }

 private:
  friend class HostCommits;
  std::atomic<int> left_{0};
  std::atomic<bool> abandoned_{false};
  std::atomic<bool> whole_{false};
  char* trailer_ = nullptr;
  uint64_t id_ = 0;
  int file_ = 0;
};

class HostCommits {
 public:
  // Which entries a reader wants (empty: all).
  using Keep = std::function<bool(const std::string& name)>;
  // `stem`: DIR/NAME; DIR is created (0700) when missing. `discard`: what the
  // files hold is not this writer's to keep (an earlier State of the same
  // worker had them): they are emptied when opened.
  explicit HostCommits(std::string stem, bool discard = false);
  // Opens (and with `discard` empties) the files now rather than at the
  // first write. Throws erun::Error naming the file.
  void open() {
    if (!opened_) open_files();
  }
  ~HostCommits();
  HostCommits(const HostCommits&) = delete;
  HostCommits& operator=(const HostCommits&) = delete;

  // Writes the commit into the file that does not hold the newest valid one.
  // `placed` (when given) receives, per entry, where its bytes now lie in
  // that file's mapping: valid until the commit after the next one, which
  // overwrites this file, or until this object is destroyed. On failure
  // (e.g. /dev/shm full) returns the error, naming the file and what to do,
  // before any byte of either file changed.
  //
  // Entries made with EntryRef::filled_later are laid out and left for their
  // fillers (at `placed`, which is then required): `completion` receives
  // what each filler calls done() on, and the commit is whole once all did.
  // Until then the previous commit stays the file pair's newest, and the
  // next write() is refused: a writer waits for its fillers first (or calls
  // abandon() once none will write any more).
  std::optional<std::string> write(uint64_t commit_id, const std::vector<EntryRef>& entries,
                                   std::vector<const char*>* placed = nullptr, uint32_t flags = 0,
                                   std::shared_ptr<Completion>* completion = nullptr);
  // The commit whose fillers will not all finish stays torn; the next write
  // may reuse its file. Call only when no filler writes into it any more.
  void abandon();
  // Reads what the files hold again and writes next as a new writer would
  // (over the older commit): for a pair that other processes may have
  // written since this one's last write (a buddy file pair, whose pusher
  // may have had another keeper on this host in between). No write may be
  // in progress.
  void forget_writes();
  // A commit that write() must not write over while a file holds it (0:
  // none): a durable copy keeps the commit its job's erun-state.bin names,
  // though a newer one (not agreed on by every rank) is in the other file or
  // the files were another writer's. Not for files whose bytes a State reads
  // in place (host memory): they alternate as write() says.
  void keep_commit(uint64_t id) { keep_ = id; }
  // The commit written last, on its way to the storage under the file (msync):
  // for files on a disk (a durable copy), not for /dev/shm. False on an error.
  bool flush();
  // Registers each file's mapping through `pinner` from now on (the ones
  // already mapped at once); null stops. Whether every mapped file is pinned.
  bool set_pinner(std::shared_ptr<MappingPinner> pinner);

  // Commit `id` as one of the files holds it whole; nullopt when neither
  // does (or it cannot be read).
  std::optional<Snapshot> read_held(uint64_t id, const Keep& keep = {});
  // The commits the two files hold whole (0: none), opening them first.
  std::pair<uint64_t, uint64_t> held_ids() {
    if (!opened_) open_files();
    settle();
    return {held_[0], held_[1]};
  }
  // Whether one of the files holds commit `id` whole (opens them first).
  bool holds(uint64_t id) {
    if (!opened_) open_files();
    settle();
    return id != 0 && (held_[0] == id || held_[1] == id);
  }

  // Before the first write: whether the directory's file system has room
  // for two files of `entries` for each of `workers` workers on this host
  // (what is already allocated to this job's files counts as room). The
  // warning names the sizes and what to do; nullopt when there is room.
  std::optional<std::string> room_warning(const std::vector<EntryRef>& entries, int workers) const;

  struct Found {
    Snapshot snapshot;
    std::string path;
  };
  // The newest commit that a file in `dir` of the States numbered `ordinal`
  // holds whole (its two ids equal, its table intact); torn, foreign or
  // unreadable files are skipped. nullopt when there is none or no such
  // directory.
  static std::optional<Found> newest(const std::string& dir, int ordinal = 0, const Keep& keep = {});
  // The same choice, made from each file's header, table and trailer only
  // (its data unread): which commit, and where.
  struct Claim {
    uint64_t id = 0;
    std::string path;
  };
  static std::optional<Claim> newest_claim(const std::string& dir, int ordinal = 0);
  // The stem of the State numbered `ordinal` of a worker whose first State's
  // stem is `stem`: `stem` itself for 0, `stem`-s<ordinal> after. A process
  // numbers the States it holds at once 0, 1, ... so that each has its own
  // files.
  static std::string stem_of(const std::string& stem, int ordinal);
  // The State number a file name (STEM.a, STEM-s3.b) belongs to.
  static int ordinal_of(const std::string& file_name);
  // The commit one file holds whole; nullopt when torn, foreign or unreadable.
  static std::optional<Snapshot> read(const std::string& path);
  // The same with only the entries `keep` accepts read (the others' bytes
  // stay in the file): a State's whole entries without its sharded pieces.
  static std::optional<Snapshot> read(const std::string& path, const Keep& keep);

  // What one file holds whole, its bytes left in the file: for a reader in
  // another process that copies them piecewise while the writer may begin
  // to overwrite the file (held() says whether it has not yet).
  struct Listing {
    uint64_t id = 0;
    uint32_t flags = 0;
    uint64_t written_ns = 0;  // when its writer claimed it (CLOCK_BOOTTIME; 0: an older erun's file)
    std::vector<std::string> names;
    std::vector<uint64_t> sizes;
    std::vector<uint64_t> offsets;  // of each entry's bytes in the file
  };
  static std::optional<Listing> list(int fd);
  // `path` opened for reading when it is a regular file of this user (no
  // link followed); an invalid Fd otherwise.
  static Fd open_own(const std::string& path);
  // Whether the file still holds commit `id` whole: its writer has not
  // claimed it for another commit.
  static bool held(int fd, uint64_t id);

  const std::string& stem() const { return stem_; }

 private:
  void open_files();
  int map(int i, size_t size);  // 0 or an errno
  void unmap(int i);
  void settle();  // a completed commit's file is held from now on
  int file_to_write() const;  // 0 or 1

  std::string stem_;
  int fd_[2] = {-1, -1};
  uint64_t held_[2] = {0, 0};      // the commit id each file holds whole (0: none)
  uint64_t written_[2] = {0, 0};   // when each was claimed, as read (Listing::written_ns)
  int last_ = 1;                   // the file written last (with equal ids, the other one is written next)
  bool wrote_ = false;             // this writer wrote a whole commit: the next one goes to 1 - last_
  uint64_t keep_ = 0;              // keep_commit()
  size_t reserved_[2] = {0, 0};    // bytes of each file known to be allocated
  char* map_[2] = {nullptr, nullptr};
  size_t map_len_[2] = {0, 0};
  bool pinned_[2] = {false, false};
  bool in_memory_ = false;  // the files are on tmpfs or hugetlbfs: pinned for device copies
  std::shared_ptr<MappingPinner> pinner_;
  std::shared_ptr<Completion> pending_;  // the last write's, until it completes
  bool opened_ = false;
  bool discard_ = false;
};

}  // namespace erun::state_internal
