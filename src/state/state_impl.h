// State's insides, shared by state.cc (the entries: registering them,
// commit, restore) and state_sync.cc (a State among the ranks of a
// generation: sync, the host-update check, host-memory and durable commits
// it adopts, re-joining). Not for other libraries.
#pragma once

#include "erun/state.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <optional>
#include <thread>
#include <unordered_map>

#include "common/log.h"
#include "common/no_retry.h"
#include "common/private_files.h"
#include "erun/erun.hpp"
#include "state/device_state.h"
#include "state/reshard_plan.h"
#include "state/shard_exchange.h"
#include "commits/host_commits.h"
#include "commits/snapshot.h"

namespace erun {

namespace si = state_internal;

struct State::Impl {
  struct Entry {
    std::string name;
    SaveFn save;
    LoadFn load;
    bool may_throw = false;
    std::vector<char> committed;  // owned deep copy; its allocation is reused between commits
    std::vector<char> spare;      // register_bytes entries: the previous commit's allocation, staged into
                                  // by the next commit (costs one more copy of memory, saves page faults)
    bool keep_spare = false;
    bool has_committed = false;
    // A device buffer: its commit lives in the slot's pinned memory and
    // `committed` is a copy made only when the bytes are encoded.
    std::shared_ptr<si::DeviceSlot> device;
    // A registered buffer (register_buffer): its own memory. With host-memory
    // commits, a commit copies it straight into the host file, and `held`
    // points at the copy there instead of `committed` (one copy per commit).
    char* raw = nullptr;
    size_t raw_bytes = 0;
    // register_pieces: the ranges of its bytes, named anew at each commit,
    // which copies them straight into the host file too.
    std::function<Pieces()> gather;
    std::function<void(const char*, size_t)> load_range;
    const char* held = nullptr;
    size_t held_bytes = 0;
    bool direct() const { return raw != nullptr || gather != nullptr; }
    // A sharded entry (register_shard_bytes): a pieces entry whose bytes are
    // this rank's rows of a global array. Its commits go to host memory, and
    // sync() reshards them (state_shards.cc), never to the broadcast blob
    // or the durable file.
    struct Shard {
      uint64_t rows = 0;
      uint64_t row_bytes = 0;
      si::SplitRule rule = si::SplitRule::kChunk;
      si::RowRange held;    // the rows of the piece committed last (and of the storage since a reshard)
      uint64_t commit = 0;  // that commit's id (0: none)
      std::function<void*(uint64_t rows)> prepare;
      std::function<void()> install;
    };
    std::shared_ptr<Shard> shard;
    // The table of the sharded pieces (si::kShardTable), written with them.
    bool shard_table = false;
    // Whether the entry travels in sync()'s blob and the durable file.
    bool whole() const { return shard == nullptr && !shard_table; }
  };
  std::vector<Entry> entries;
  std::unordered_map<std::string, size_t> by_name;
  uint64_t commit_id = 0;
  // With sharded entries: the next commit's id at least. A sync that goes
  // back to an older commit than some rank wrote skips the ids written
  // since, so that one id never names two commits (state_shards.cc).
  uint64_t next_id = 0;
  bool has_snapshot = false;  // a commit, a synced baseline, or a loaded checkpoint
  bool committing = false;    // commit() runs its check_host_updates()
  std::string checkpoint_dir;
  bool launcher_checkpoint_checked = false;
  // This worker's host-memory commit files (null outside erun, or when the
  // host has no room for them).
  std::unique_ptr<si::HostCommits> host;
  int ordinal = -1;  // this State's number among the worker's (host-memory commit files)
  std::shared_ptr<std::vector<unsigned char>> numbers;  // the worker's, where `ordinal` is marked held
  bool host_failing = false;  // the last host-memory write failed (logged once per streak)
  // Found at the first sync(): a commit newer than this worker's that its
  // host kept. Read only if the sync makes this rank the root.
  std::optional<si::HostCommits::Claim> adoptable;
  // The launcher's --checkpoint-dir, whose durable files the host side
  // writes from rank 0's host-memory commits (commits/persist.h): rank 0
  // writes one itself only when its host-memory commit failed.
  bool host_persists = false;
  bool host_room_checked = false;
  // Sharded entries: this worker keeps other hosts' pieces (its buddies')
  // in its host's commit directory, and pushes its own after each commit to
  // `buddy`, a worker of another host chosen at each sync (state_shards.cc).
  struct Buddy {
    std::string host;     // its host's name, for messages
    std::string address;  // its keeper
    int port = 0;
    std::string name;     // the file pair it keeps this worker's pieces in
    std::string job_id;   // the credentials of the push
    std::string secret;
  };
  std::unique_ptr<si::BuddyKeeper> keeper;
  std::optional<Buddy> buddy;
  bool buddy_failing = false;  // the last push failed (logged once per streak)
  // After a commit written to host memory: its pieces to the buddy, from a
  // thread of their own while training goes on. The push reads the commit
  // where it lies in this worker's own file, which nothing rewrites before
  // finish_push() has joined the push: the next commit, a sync and the
  // State's end wait for it first. So the buddy is at most one commit
  // behind, and a worker that leaves (a drain) leaves its last commit on
  // the next host.
  void push_to_buddy(const Context& ctx);
  // Joins the push in flight and says how it ended (a failure once a streak).
  void finish_push();
  struct Push {
    std::thread thread;
    Status result = Status::ok();
    uint64_t id = 0;
    std::string who;  // the pusher, for messages
  };
  std::unique_ptr<Push> push;
  std::vector<std::function<void(int, int)>> reset_callbacks;
  // World size before this worker's last re-join, until the next sync (0: none).
  int rejoined_from = 0;
  // World size when the held snapshot was taken (0: unknown, e.g. read from a file).
  int snapshot_size = 0;
  // Set by sync() when some rank re-joined since the last sync: (old size, new size).
  std::optional<std::pair<int, int>> pending_reset;

  // The ranges, one after another, into `out` (keeping its allocation).
  static void concat(const std::vector<si::Piece>& ranges, std::vector<char>& out) {
    size_t total = 0;
    for (const si::Piece& r : ranges) total += r.second;
    out.resize(total);
    size_t at = 0;
    for (const auto& [p, n] : ranges) {
      if (n != 0) std::memcpy(out.data() + at, p, n);
      at += n;
    }
  }

  static si::EntryRef ref(const Entry& e) {
    return e.held != nullptr ? si::EntryRef{&e.name, e.held, e.held_bytes} : si::EntryRef::of(e.name, e.committed);
  }
  // The committed whole entries (sync()'s blob, the durable file).
  std::vector<si::EntryRef> refs() const {
    std::vector<si::EntryRef> r;
    r.reserve(entries.size());
    for (const Entry& e : entries) {
      if (e.has_committed && e.whole()) r.push_back(ref(e));
    }
    return r;
  }
  // commit(): each sharded entry's pieces (`gathered`, per entry) are its
  // rows for rank `rank` of `size`; throws erun::Error naming it otherwise.
  void check_shard_sizes(const std::vector<std::vector<si::Piece>>& gathered, int rank, int size);
  // A reader's filter that leaves sharded pieces in the file (they are
  // resharded, never loaded whole); empty without sharded entries.
  si::HostCommits::Keep whole_only() const {
    if (!has_shards()) return {};
    return [this](const std::string& name) {
      auto it = by_name.find(name);
      return it == by_name.end() || entries[it->second].whole();
    };
  }
  bool has_shards() const {
    return std::any_of(entries.begin(), entries.end(), [](const Entry& e) { return e.shard != nullptr; });
  }

  // Entries registered after the last snapshot join it with their current value.
  void fill_uncommitted() {
    for (Entry& e : entries) {
      if (!e.has_committed && e.whole()) {
        e.save(e.committed);
        e.held = nullptr;
        e.has_committed = true;
        if (e.device) std::vector<char>().swap(e.committed);  // the commit is in pinned memory
      }
    }
  }

  // Loads `snap` into the registered values and makes it the committed
  // snapshot. `devices_done`: the device entries already hold it (received
  // over NCCL and committed); their bytes in `snap` are size marks.
  void apply(si::Snapshot&& snap, const std::string& source, bool allow_missing, bool devices_done = false) {
    std::vector<Entry*> targets;
    targets.reserve(snap.entries.size());
    // Sharded pieces in a file's snapshot are resharded, not loaded (state_shards.cc).
    snap.entries.erase(std::remove_if(snap.entries.begin(), snap.entries.end(),
                                      [&](const auto& entry) {
                                        auto it = by_name.find(entry.first);
                                        return it != by_name.end() && !entries[it->second].whole();
                                      }),
                       snap.entries.end());
    for (auto& [name, bytes] : snap.entries) {
      auto it = by_name.find(name);
      if (it == by_name.end()) {
        throw Error(fmt::format("erun: {} holds state entry '{}' that this worker did not "
                                "register; every worker must register the same entries",
                                source, name));
      }
      targets.push_back(&entries[it->second]);
    }
    if (targets.size() != entries.size()) {
      std::vector<bool> present(entries.size(), false);
      for (Entry* t : targets) present[static_cast<size_t>(t - entries.data())] = true;
      for (size_t i = 0; i < entries.size(); ++i) {
        if (present[i] || !entries[i].whole()) continue;
        if (!allow_missing) {
          throw Error(fmt::format("erun: {} lacks state entry '{}' that this worker registered; "
                                  "every worker must register the same entries",
                                  source, entries[i].name));
        }
        ERUN_LOG_WARN("{} has no entry '{}'; it keeps its current value", source,
                      entries[i].name);
      }
    }
    for (size_t i = 0; i < targets.size(); ++i) {
      std::vector<char>& bytes = snap.entries[i].second;
      if (devices_done && targets[i]->device) {
        targets[i]->has_committed = true;
        continue;
      }
      try {
        targets[i]->load(bytes);
      } catch (const Error& e) {
        throw Error(fmt::format("{} (loading {})", e.what(), source));
      }
      targets[i]->committed = std::move(bytes);
      targets[i]->held = nullptr;
      targets[i]->has_committed = true;
    }
    drop_device_mirrors();
    commit_id = snap.commit_id;
    has_snapshot = true;
  }

  void load_values() {
    for (Entry& e : entries) {
      if (!e.has_committed) continue;
      if (e.device) {
        e.device->restore();
      } else if (e.held != nullptr && e.raw != nullptr) {
        if (e.raw_bytes != 0) std::memcpy(e.raw, e.held, e.raw_bytes);
      } else if (e.held != nullptr) {
        e.load_range(e.held, e.held_bytes);
      } else {
        e.load(e.committed);
      }
    }
  }

  // Brings device entries' `committed` up to their pinned commit before refs() is encoded.
  // sync() on its root: the snapshot every rank takes. Nobody committed
  // (newest 0): the root's current values become everyone's baseline.
  // Device entries travel over NCCL (`devices_over_nccl`: their bytes are
  // size marks) or through pinned host memory in the blob.
  // `loaded`: the values hold the commit already (adopt() loaded it).
  std::vector<char> root_blob(uint64_t newest, bool devices_over_nccl, bool loaded) {
    if (newest == 0) {
      for (Entry& e : entries) {
        if (!e.whole()) continue;  // each rank keeps the piece it made
        e.save(e.committed);
        e.held = nullptr;
        e.has_committed = true;
      }
      has_snapshot = true;
    } else {
      fill_uncommitted();
      if (!loaded) load_values();
    }
    if (devices_over_nccl) {
      mark_device_sizes();
    } else {
      mirror_device();
    }
    std::vector<char> blob = si::encode(commit_id, refs());
    drop_device_mirrors();
    return blob;
  }

  // Writes the commit to this worker's host-memory files. `direct`: commit()
  // left the registered buffers to this write, which copies them from their
  // own memory into the file; `gathered` (when given, per entry): the pieces
  // entries' ranges, copied the same way. Registered buffers and pieces keep
  // the file's copy as their commit (`held`).
  // A failure (host memory full) is logged, not thrown: the buffers are then
  // copied into worker memory, training goes on, and the files keep the
  // previous commit.
  // Whether the commit is in host memory.
  // `devices_later` (commit(), which fenced the last commit's copies first):
  // device entries are copied from the device straight into the file
  // (land_devices), not from their last commit.
  bool write_host_commit(const WorkerInfo& info, bool direct, const std::vector<std::vector<si::Piece>>* gathered = nullptr,
                         bool devices_later = false) {
    if (!host) return false;
    if (!devices_later) mirror_device();
    std::vector<si::EntryRef> out;
    out.reserve(entries.size());
    for (size_t i = 0; i < entries.size(); ++i) {
      const Entry& e = entries[i];
      if (!e.has_committed) continue;
      if (devices_later && e.device) {
        out.push_back(si::EntryRef::filled_later(e.name, e.device->bytes()));
      } else if (direct && e.raw != nullptr) {
        out.push_back(si::EntryRef{&e.name, e.raw, e.raw_bytes});
      } else if (gathered != nullptr && e.gather) {
        out.push_back(si::EntryRef::of(e.name, (*gathered)[i]));
      } else {
        out.push_back(ref(e));
      }
    }
    if (!std::exchange(host_room_checked, true) && info.local_rank == 0) {
      if (auto warning = host->room_warning(out, info.local_size)) ERUN_LOG_WARN("{}", *warning);
    }
    std::optional<std::string> err;
    std::vector<const char*> placed;
    std::shared_ptr<si::Completion> landed;
    try {
      err = host->write(commit_id, out, &placed, info.rank == 0 ? si::kRankZeroCommit : 0, &landed);
    } catch (const Error& e) {
      err = e.what();
    }
    if (devices_later) land_devices(err ? nullptr : &placed, landed);
    size_t k = 0;
    for (size_t i = 0; i < entries.size(); ++i) {
      Entry& e = entries[i];
      if (!e.has_committed) continue;
      const bool copied_here = (direct && e.raw != nullptr) || (gathered != nullptr && e.gather);
      if (!err && e.direct()) {
        e.held = placed[k];
        e.held_bytes = out[k].size;
        std::vector<char>().swap(e.committed);
      } else if (err && copied_here) {
        if (e.raw != nullptr) {
          e.save(e.committed);
        } else {
          concat((*gathered)[i], e.committed);
        }
        e.held = nullptr;
      }
      ++k;
    }
    drop_device_mirrors();
    if (err && !host_failing) ERUN_LOG_ERROR("{}", *err);
    if (!err && host_failing) ERUN_LOG_INFO("host-memory commit {} written to {} again", commit_id, host->stem());
    host_failing = err.has_value();
    return !err;
  }

  // In sync(), on the rank whose commit every rank takes: loads the newest
  // whole commit of the directory where adopt_host_commits() found one (the
  // same file, unless it was overwritten or torn since), into the values
  // too. Whether it loaded one.
  bool adopt(const WorkerInfo& info) {
    auto claim = std::exchange(adoptable, std::nullopt);
    if (!claim) return false;
    auto found = si::HostCommits::newest(claim->path.substr(0, claim->path.rfind('/')), ordinal, whole_only());
    if (!found || found->snapshot.commit_id <= commit_id) {
      ERUN_LOG_WARN("{}: host-memory commit {} in {} was overwritten before it was read; the job goes on from "
                    "commit {}",
                    who(info.generation, info.host, info.rank), claim->id, claim->path, commit_id);
      return false;
    }
    const uint64_t id = found->snapshot.commit_id;
    apply(std::move(found->snapshot), "host-memory commit file " + found->path, /*allow_missing=*/true);
    snapshot_size = 0;  // the file does not say
    ERUN_LOG_INFO("{}: restored commit {} from host memory on {} ({})", who(info.generation, info.host, info.rank),
                  id, info.host, found->path);
    return true;
  }

  // After sync(): the commit this worker now holds goes into its host's
  // memory too, unless its files hold it already. A worker new to the job
  // (or to this host) so keeps the commit it received before it commits
  // itself: its host holds a copy of the newest commit from the moment it
  // joined, should every other host be lost.
  void keep_in_host_memory(const WorkerInfo& info, bool resharded = false) {
    if (!host || commit_id == 0) {
      if (resharded) keep_shards_in_worker_memory();
      return;
    }
    if (!resharded) {
      try {
        if (host->holds(commit_id)) return;
      } catch (const Error&) {
        return;  // said again at the first commit, which keeps to worker memory
      }
    }
    // Pieces entries' bytes: a sharded entry's from its storage (its new
    // rows), any other's from its commit.
    std::vector<std::vector<si::Piece>> gathered(entries.size());
    std::vector<std::shared_ptr<void>> keep;
    for (size_t i = 0; i < entries.size(); ++i) {
      Entry& e = entries[i];
      if (e.shard_table && e.has_committed) {
        e.save(e.committed);
        e.held = nullptr;
      }
      if (!e.gather || !e.has_committed) continue;
      if (e.shard) {
        Pieces p = e.gather();
        gathered[i] = std::move(p.ranges);
        keep.push_back(std::move(p.keep));
      } else {
        const si::EntryRef r = ref(e);
        gathered[i] = {{r.data, r.size}};
      }
    }
    write_host_commit(info, /*direct=*/true, &gathered);
  }
  // A reshard without host memory: the new pieces are the commit.
  void keep_shards_in_worker_memory() {
    for (Entry& e : entries) {
      if (e.shard && e.has_committed) {
        e.save(e.committed);
        e.held = nullptr;
      } else if (e.shard_table && e.has_committed) {
        e.save(e.committed);
      }
    }
  }

  // A commit's device entries: copied straight into their places in the
  // host file (`placed`, one per committed entry), which is whole once every
  // copy landed; or, when the host-memory write failed (null), into their
  // own pinned memory.
  void land_devices(const std::vector<const char*>* placed, const std::shared_ptr<si::Completion>& landed) {
    size_t k = 0;
    try {
      for (Entry& e : entries) {
        if (!e.has_committed) continue;
        if (e.device && placed != nullptr) {
          // The file's bytes for this entry, writable in its mapping.
          e.device->commit_into(const_cast<char*>((*placed)[k]), [landed] { landed->done(); });
        } else if (e.device) {
          e.device->commit();
        }
        ++k;
      }
    } catch (...) {
      // The file stays torn: the previous commit is its host's newest. It is
      // written again only once no copy can land in it any more.
      if (fence_devices_quietly()) host->abandon();
      throw;
    }
  }
  void fence_devices() {
    for (Entry& e : entries) {
      if (e.device) e.device->fence();
    }
  }
  // Whether every copy finished.
  bool fence_devices_quietly() noexcept {
    bool all = true;
    for (Entry& e : entries) {
      try {
        if (e.device) e.device->fence();
      } catch (const Error&) {
        all = false;
      }
    }
    return all;
  }
  // Device copies land in host-memory commit files: those files' mappings
  // are registered with CUDA.
  void pin_for_devices() {
    if (host && has_device_entries()) host->set_pinner(si::DeviceSlot::pinner());
  }

  void mirror_device() {
    for (Entry& e : entries) {
      if (e.device && e.has_committed) e.device->mirror(e.committed);
    }
  }
  // After encoding or loading: the pinned commit is the only host copy kept.
  void drop_device_mirrors() {
    for (Entry& e : entries) {
      if (e.device) std::vector<char>().swap(e.committed);
    }
  }

  // Sync over NCCL. The root's blob carries, for each device entry, its size
  // (8 bytes) instead of its bytes; the buffers themselves go device to
  // device, in the blob's order, on each buffer's stream.
  void mark_device_sizes() {
    for (Entry& e : entries) {
      if (!e.device) continue;
      const uint64_t n = e.device->bytes();
      e.committed.resize(sizeof(n));
      std::memcpy(e.committed.data(), &n, sizeof(n));
    }
  }
  void send_devices(GpuCommunicator& gpu, int root) {
    for (Entry& e : entries) {
      if (e.device) gpu.broadcast(e.device->buffer(), e.device->bytes(), root, e.device->stream());
    }
  }
  // A receiver: every device entry of `snap` checked against this worker's,
  // received, and committed only when all arrived (a failure leaves the last
  // commit as it was, for restore()).
  void receive_devices(const si::Snapshot& snap, const std::string& source, GpuCommunicator& gpu, int root) {
    std::vector<Entry*> order;
    for (const auto& [name, mark] : snap.entries) {
      auto it = by_name.find(name);
      if (it == by_name.end() || !entries[it->second].device) continue;  // apply() names a stray entry
      Entry& e = entries[it->second];
      uint64_t n = 0;
      if (mark.size() != sizeof(n)) {
        throw Error(fmt::format("erun: {} holds host bytes for '{}', a device buffer here; register it the same "
                                "way on every worker",
                                source, name));
      }
      std::memcpy(&n, mark.data(), sizeof(n));
      e.device->expect_bytes(static_cast<size_t>(n));
      order.push_back(&e);
    }
    for (Entry* e : order) gpu.broadcast(e->device->buffer(), e->device->bytes(), root, e->device->stream());
    for (Entry* e : order) e->device->take();
  }
  bool has_device_entries() const {
    return std::any_of(entries.begin(), entries.end(), [](const Entry& e) { return e.device != nullptr; });
  }
};

}  // namespace erun
