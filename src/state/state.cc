#include "erun/state.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <optional>
#include <unordered_map>

#include "common/log.h"
#include "common/no_retry.h"
#include "common/private_files.h"
#include "erun/erun.hpp"
#include "state/device_state.h"
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
  };
  std::vector<Entry> entries;
  std::unordered_map<std::string, size_t> by_name;
  uint64_t commit_id = 0;
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
  std::vector<si::EntryRef> refs() const {
    std::vector<si::EntryRef> r;
    r.reserve(entries.size());
    for (const Entry& e : entries) {
      if (e.has_committed) r.push_back(ref(e));
    }
    return r;
  }

  // Entries registered after the last snapshot join it with their current value.
  void fill_uncommitted() {
    for (Entry& e : entries) {
      if (!e.has_committed) {
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
        if (present[i]) continue;
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
    auto found = si::HostCommits::newest(claim->path.substr(0, claim->path.rfind('/')), ordinal);
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
  void keep_in_host_memory(const WorkerInfo& info) {
    if (!host || commit_id == 0) return;
    try {
      if (host->holds(commit_id)) return;
    } catch (const Error&) {
      return;  // said again at the first commit, which keeps to worker memory
    }
    write_host_commit(info, /*direct=*/true);
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

State::State(Context& ctx) : ctx_(ctx), impl_(std::make_unique<Impl>()) {}
State::~State() {
  // A device copy in flight lands in a host-memory commit file: the device
  // slots wait for their copies before the files are unmapped.
  impl_->entries.clear();
  if (impl_->numbers) (*impl_->numbers)[static_cast<size_t>(impl_->ordinal)] = 2;
}

void State::register_entry(const std::string& name, SaveFn save, LoadFn load, bool may_throw) {
  if (impl_->by_name.count(name) != 0) {
    throw Error(fmt::format("erun: state entry '{}' is registered twice; give each value its "
                            "own name", name));
  }
  impl_->by_name.emplace(name, impl_->entries.size());
  Impl::Entry e;
  e.name = name;
  e.save = std::move(save);
  e.load = std::move(load);
  e.may_throw = may_throw;
  impl_->entries.push_back(std::move(e));
}

void State::check_size(const std::string& name, size_t got, size_t want) {
  if (got != want) {
    throw Error(fmt::format("erun: state entry '{}' has {} bytes in the snapshot but the "
                            "registered value has {}; register the same types on every worker",
                            name, got, want));
  }
}

void State::check_multiple(const std::string& name, size_t got, size_t unit) {
  if (got % unit != 0) {
    throw Error(fmt::format("erun: state entry '{}' has {} bytes in the snapshot, not a multiple "
                            "of its element size {}; register the same types on every worker",
                            name, got, unit));
  }
}

void State::register_string(const std::string& name, std::string* s) {
  register_entry(name, [s](std::vector<char>& b) {
    b.resize(s->size());
    if (!b.empty()) std::memcpy(b.data(), s->data(), b.size());
  }, [s](const std::vector<char>& b) { s->assign(b.data(), b.size()); });
}

void State::register_buffer(const std::string& name, void* data, size_t bytes) {
  register_entry(name, [data, bytes](std::vector<char>& b) {
    b.resize(bytes);
    if (bytes != 0) std::memcpy(b.data(), data, bytes);
  }, [data, bytes, name](const std::vector<char>& b) {
    check_size(name, b.size(), bytes);
    if (bytes != 0) std::memcpy(data, b.data(), bytes);
  });
  impl_->entries.back().raw = static_cast<char*>(data);
  impl_->entries.back().raw_bytes = bytes;
}

void State::register_device_buffer(const std::string& name, void* device_ptr, size_t bytes,
                                   DeviceBufferOptions options) {
  if (impl_->by_name.count(name) != 0) {
    throw Error(fmt::format("erun: state entry '{}' is registered twice; give each value its own name", name));
  }
  auto slot = std::make_shared<si::DeviceSlot>(name, device_ptr, bytes, options.stream, options.async,
                                               ctx_.collective_timeout());
  register_entry(name, [slot](std::vector<char>& b) { slot->save_to(b); },
                 [slot](const std::vector<char>& b) { slot->load_from(b); });
  impl_->entries.back().device = std::move(slot);
  impl_->pin_for_devices();
}

void State::register_bytes(const std::string& name, std::function<void(std::vector<char>&)> save,
                           std::function<void(const std::vector<char>&)> load) {
  register_entry(name, std::move(save), std::move(load), /*may_throw=*/true);
  impl_->entries.back().keep_spare = true;
}

void State::register_pieces(const std::string& name, std::function<Pieces()> save,
                            std::function<void(const char*, size_t)> load) {
  register_entry(name, [save](std::vector<char>& out) { Impl::concat(save().ranges, out); },
                 [load](const std::vector<char>& b) { load(b.data(), b.size()); }, /*may_throw=*/true);
  impl_->entries.back().gather = std::move(save);
  impl_->entries.back().load_range = std::move(load);
}

void State::commit() {
  // With host-memory commits, registered buffers and pieces are copied once,
  // straight into the host file (write_host_commit).
  const bool direct = impl_->host != nullptr;
  // The last commit's device copies landed (a stuck GPU throws here, before
  // anything changed).
  if (direct) impl_->fence_devices();
  // User serializers may throw: run them before touching the snapshot.
  // Their side buffers reuse the allocation of the commit before the last.
  std::vector<std::vector<char>> staged(impl_->entries.size());
  std::vector<std::vector<si::Piece>> gathered(impl_->entries.size());
  std::vector<std::shared_ptr<void>> keep;
  for (size_t i = 0; i < impl_->entries.size(); ++i) {
    Impl::Entry& e = impl_->entries[i];
    if (e.gather) {
      Pieces p = e.gather();
      gathered[i] = std::move(p.ranges);
      keep.push_back(std::move(p.keep));
      continue;
    }
    if (!e.may_throw) continue;
    staged[i].swap(e.spare);
    try {
      e.save(staged[i]);
    } catch (...) {
      e.spare.swap(staged[i]);
      throw;
    }
  }
  for (size_t i = 0; i < impl_->entries.size(); ++i) {
    Impl::Entry& e = impl_->entries[i];
    if (e.gather) {
      if (!direct) {
        Impl::concat(gathered[i], e.committed);
        e.held = nullptr;
      }  // else copied by write_host_commit
    } else if (e.may_throw) {
      e.committed.swap(staged[i]);
      if (e.keep_spare) e.spare.swap(staged[i]);
    } else if (e.device) {
      if (!direct) e.device->commit();  // else straight into the host file (write_host_commit)
    } else if (e.raw != nullptr && direct) {
      // copied by write_host_commit, from its own memory into host memory
    } else {
      e.save(e.committed);
      e.held = nullptr;
    }
    e.has_committed = true;
  }
  impl_->commit_id += 1;
  impl_->has_snapshot = true;
  impl_->snapshot_size = ctx_.size();
  const bool in_host_memory = impl_->write_host_commit(ctx_.info(), direct, &gathered, /*devices_later=*/true);
  gathered.clear();
  keep.clear();  // the ranges were copied
  if (!impl_->checkpoint_dir.empty() && ctx_.rank() == 0 && !(impl_->host_persists && in_host_memory)) {
    impl_->mirror_device();
    si::write_file_atomically(impl_->checkpoint_dir, si::kStateFile, impl_->commit_id,
                              impl_->refs());
    impl_->drop_device_mirrors();
  }
  ctx_.committed(impl_->commit_id);
  impl_->committing = true;
  struct Done {
    bool& flag;
    ~Done() { flag = false; }
  } done{impl_->committing};
  check_host_updates();
}

void State::restore() {
  if (impl_->has_snapshot) impl_->load_values();
}

namespace {

// What the ranks of a sync() agree on from what each one holds.
struct SyncAgreement {
  int root = 0;  // the lowest rank with the newest commit
  uint64_t any_rejoin = 0;  // the largest world size a rank re-joined from since the last sync (0: none)
  int snapshot_size = 0;  // the world size at which the root's commit was made (0: unknown)
  bool devices_over_nccl = false;
};

// Collective. `mine`: this rank's commit id, the world size it re-joined
// from since the last sync, the world size its snapshot was taken at, and
// whether it has device entries and an erun built with NCCL.
SyncAgreement agree(Context& ctx, const std::array<uint64_t, 4>& mine) {
  Communicator& comm = ctx.comm();
  const int size = comm.size();
  std::vector<uint64_t> all(static_cast<size_t>(size) * mine.size());
  comm.allgather(mine.data(), all.data(), sizeof(uint64_t) * mine.size());
  auto field = [&](int r, size_t f) { return all[static_cast<size_t>(r) * mine.size() + f]; };
  SyncAgreement a;
  for (int r = 0; r < size; ++r) {
    if (field(r, 0) > field(a.root, 0)) a.root = r;
    a.any_rejoin = std::max(a.any_rejoin, field(r, 1));
  }
  a.snapshot_size = static_cast<int>(field(a.root, 2));
  if (field(a.root, 0) == 0 && a.snapshot_size == 0) a.snapshot_size = size;  // a new baseline
  // Device buffers go device to device over NCCL when every rank has some
  // and the generation's GPU backend (chosen here, collectively, if not yet)
  // is NCCL; otherwise through pinned host memory in the blob.
  a.devices_over_nccl = true;
  for (int r = 0; r < size; ++r) a.devices_over_nccl = a.devices_over_nccl && field(r, 3) != 0;
  a.devices_over_nccl = a.devices_over_nccl && ctx.gpu().backend() == GpuBackend::kNccl;
  return a;
}

}  // namespace

void State::sync() {
  if (!impl_->launcher_checkpoint_checked) {
    impl_->launcher_checkpoint_checked = true;
    const bool launcher_dir = impl_->checkpoint_dir.empty() && !ctx_.checkpoint_dir().empty();
    if (launcher_dir) set_checkpoint_dir(ctx_.checkpoint_dir());
    adopt_host_commits();
    impl_->host_persists = launcher_dir && impl_->host && impl_->ordinal == 0;
  }
  Communicator& comm = ctx_.comm();
  const int size = comm.size();
  const int rank = comm.rank();
  const int rejoined_from = std::exchange(impl_->rejoined_from, 0);
  impl_->pending_reset.reset();
  if (size == 1) {
    const bool loaded = impl_->adopt(ctx_.info());
    impl_->fill_uncommitted();
    if (impl_->commit_id > 0 && !loaded) impl_->load_values();
    impl_->has_snapshot = true;
    impl_->keep_in_host_memory(ctx_.info());
    if (impl_->snapshot_size == 0 && impl_->commit_id == 0) impl_->snapshot_size = 1;
    if (rejoined_from > 0) {
      impl_->pending_reset.emplace(impl_->snapshot_size > 0 ? impl_->snapshot_size : rejoined_from, size);
    }
    return;
  }
  const auto& adoptable = impl_->adoptable;
  const SyncAgreement a = agree(ctx_, {adoptable ? adoptable->id : impl_->commit_id,
                                       static_cast<uint64_t>(rejoined_from),
                                       static_cast<uint64_t>(adoptable ? 0 : impl_->snapshot_size),
                                       impl_->has_device_entries() && built_with_nccl() ? 1u : 0u});
  const int root = a.root;
  const bool devices_over_nccl = a.devices_over_nccl;
  std::vector<char> blob;
  if (rank == root) {
    const bool loaded = impl_->adopt(ctx_.info());
    blob = impl_->root_blob(impl_->commit_id, devices_over_nccl, loaded);
  } else {
    impl_->adoptable.reset();  // a newer or equal commit comes from the root
  }
  int64_t bytes = static_cast<int64_t>(blob.size());
  comm.broadcast(&bytes, sizeof(bytes), root);
  if (rank != root) blob.resize(static_cast<size_t>(bytes));
  comm.broadcast(blob.data(), blob.size(), root);
  if (rank == root) {
    if (devices_over_nccl) impl_->send_devices(ctx_.gpu(), root);
  } else {
    std::string source = fmt::format("the state broadcast by rank {}", root);
    si::Snapshot snap = si::decode(blob.data(), blob.size(), source);
    blob = {};
    if (devices_over_nccl) impl_->receive_devices(snap, source, ctx_.gpu(), root);
    impl_->apply(std::move(snap), source, /*allow_missing=*/false, /*devices_done=*/devices_over_nccl);
  }
  impl_->snapshot_size = a.snapshot_size;
  impl_->keep_in_host_memory(ctx_.info());
  // Every rank, a worker new to the job included, learns that a reset is due.
  if (a.any_rejoin > 0) {
    impl_->pending_reset.emplace(a.snapshot_size > 0 ? a.snapshot_size : static_cast<int>(a.any_rejoin), size);
  }
}

void State::check_host_updates() {
  Communicator& comm = ctx_.comm();
  // 0: nothing pending; 1: a change; 2: a host drains.
  int64_t pending = ctx_.host_update_pending() ? (ctx_.drain_pending() ? 2 : 1) : 0;
  if (comm.size() > 1) {
    // One allreduce (MAX) carries the host-update flag and the commit id's
    // maximum and minimum, so the check that all ranks are at the same commit
    // costs nothing extra.
    const auto id = static_cast<int64_t>(impl_->commit_id);
    int64_t v[3] = {pending, id, -id};
    comm.allreduce(v, 3, DataType::kInt64, ReduceOp::kMax);
    if (v[1] != -v[2]) commit_ids_disagree();
    pending = v[0];
  }
  // A host drains and the program checks between commits, where its state
  // is whole: commit here, so the leaving workers take no step with them.
  // (commit() ends in this check again, which then throws.)
  if (pending == 2 && !impl_->committing) commit();
  if (pending != 0) throw HostsUpdated();
}

void State::commit_ids_disagree() {
  Communicator& comm = ctx_.comm();
  std::vector<uint64_t> ids(static_cast<size_t>(comm.size()));
  const uint64_t mine = impl_->commit_id;
  comm.allgather(&mine, ids.data(), sizeof(mine));
  std::vector<std::pair<uint64_t, std::vector<int>>> groups;  // by commit id, in rank order
  for (int r = 0; r < comm.size(); ++r) {
    const uint64_t id = ids[static_cast<size_t>(r)];
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == id; });
    if (it == groups.end()) it = groups.insert(groups.end(), {id, {}});
    it->second.push_back(r);
  }
  std::string who;
  for (const auto& [id, ranks] : groups) {
    who += fmt::format("{}{} {} at commit {}", who.empty() ? "" : "; ", ranks.size() == 1 ? "rank" : "ranks",
                       fmt::join(ranks, ", "), id);
  }
  throw CollectiveMismatch(fmt::format(
      "erun: the ranks disagree on the commit id at commit(): {}; every rank must call commit() at the same "
      "steps, so a value that decides when to commit (e.g. a step counter) must be registered in the State, or "
      "a worker that joins or restores has another one (see docs/state.md, 'Values that decide the schedule')",
      who));
}

uint64_t State::commit_id() const { return impl_->commit_id; }

void State::set_checkpoint_dir(const std::string& dir) {
  if (Status ok = ensure_private_dir(dir, "checkpoint directory"); !ok) throw Error("erun: " + ok.message());
  impl_->checkpoint_dir = dir;
  if (ctx_.rank() == 0) si::remove_stale_temp_files(dir, si::kStateFile);
  std::string path = dir + "/" + si::kStateFile;
  std::vector<char> bytes;
  if (!si::read_file(path, &bytes)) return;
  std::string source = fmt::format("checkpoint file {}", path);
  si::Snapshot snap;
  try {
    snap = si::decode(bytes.data(), bytes.size(), source);
  } catch (const Error& e) {
    throw Error(fmt::format("{}; remove it to start from scratch", e.what()));
  }
  bytes = {};
  if (snap.commit_id <= impl_->commit_id) {
    ERUN_LOG_INFO("{} holds commit {}, not newer than this worker's commit {}; ignored",
                  source, snap.commit_id, impl_->commit_id);
    return;
  }
  uint64_t id = snap.commit_id;
  impl_->apply(std::move(snap), source, /*allow_missing=*/true);
  impl_->snapshot_size = 0;  // the file does not say
  ERUN_LOG_INFO("resumed from commit {} in {}", id, path);
}

void State::adopt_host_commits() {
  const std::string stem = ctx_.host_commit_stem();
  if (stem.empty()) return;
  const std::string dir = stem.substr(0, stem.rfind('/'));
  const std::string parent = dir.substr(0, dir.rfind('/'));
  struct stat st {};
  if (parent.empty() || ::stat(parent.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    ERUN_LOG_WARN("no {} on this host: commits live only in worker memory", parent.empty() ? dir : parent);
    return;
  }
  // The States a worker holds at once are numbered 0, 1, ... (the lowest
  // free number), each with its own files (HostCommits::stem_of). A number
  // held before by a State since destroyed starts from emptied files: that
  // State's commits are not this one's. Only the first State of each number
  // in a worker adopts what its host kept.
  impl_->numbers = ctx_.state_numbers_;
  auto& numbers = *impl_->numbers;
  size_t k = 0;
  while (k < numbers.size() && numbers[k] == 1) ++k;
  if (k == numbers.size()) numbers.push_back(0);
  const bool had = numbers[k] == 2;
  numbers[k] = 1;
  const int ordinal = static_cast<int>(k);
  impl_->ordinal = ordinal;
  impl_->host = std::make_unique<si::HostCommits>(si::HostCommits::stem_of(stem, ordinal), /*discard=*/had);
  impl_->pin_for_devices();
  if (had) {
    try {
      impl_->host->open();
    } catch (const Error& e) {
      ERUN_LOG_ERROR("{}", e.what());  // the first commit says it again, and keeps to worker memory
    }
    return;
  }
  // A commit that outlived the workers that made it: every worker of the
  // last generation died (or was restarted) and this host kept theirs. Its
  // header is enough for sync() to choose; the data is read when chosen.
  auto found = si::HostCommits::newest_claim(dir, ordinal);
  if (!found || found->id <= impl_->commit_id) return;
  impl_->adoptable = std::move(found);
}

void State::on_reset(std::function<void(int, int)> callback) {
  impl_->reset_callbacks.push_back(std::move(callback));
}

void State::notify_reset(int old_size, int new_size) {
  for (auto& cb : impl_->reset_callbacks) cb(old_size, new_size);
}

void State::note_rejoin(int old_size) { impl_->rejoined_from = std::max(old_size, 1); }

void State::run_pending_reset() {
  if (auto reset = std::exchange(impl_->pending_reset, std::nullopt)) notify_reset(reset->first, reset->second);
}

namespace detail {

void rejoin(State& state, bool comm_error, const char* what, int failed_rank, PeerFate fate) {
  Context& ctx = state.context();
  const WorkerInfo before = ctx.info();
  if (comm_error) {
    ERUN_LOG_WARN("{}: {}; restoring commit {} and re-joining",
                  who(before.generation, before.host, before.rank), what, state.commit_id());
    state.restore();
  } else {
    ERUN_LOG_INFO("{}: hosts updated at commit {}; re-joining",
                  who(before.generation, before.host, before.rank), state.commit_id());
  }
  RejoinCause cause;
  cause.hosts_updated = !comm_error;
  cause.failed_rank = comm_error ? failed_rank : -1;
  cause.fate = comm_error ? fate : PeerFate::kUnknown;
  ctx.rejoin_because(state.commit_id(), cause);
  const WorkerInfo& after = ctx.info();
  ERUN_LOG_INFO("{}: joined as rank {} of {} (was rank {} of {})",
                who(after.generation, after.host, after.rank), after.rank, after.size,
                before.rank, before.size);
  state.note_rejoin(before.size);
}

void no_retry(State& state, const char* what) {
  const WorkerInfo& info = state.context().info();
  ERUN_LOG_ERROR("{}{}: {}", kNoRetryMark, who(info.generation, info.host, info.rank), what);
}

}  // namespace detail

}  // namespace erun
