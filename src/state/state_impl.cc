// State::Impl's functions (state_impl.h): the entries' commits and their
// copies in worker memory, host memory and device memory.
#include "state/state_impl.h"

namespace erun {

void state_internal::broadcast_blob(Communicator& comm, std::vector<char>& blob, int root) {
  int64_t bytes = static_cast<int64_t>(blob.size());
  comm.broadcast(&bytes, sizeof(bytes), root);
  if (comm.rank() != root) blob.resize(static_cast<size_t>(bytes));
  comm.broadcast(blob.data(), blob.size(), root);
}

si::PiecesKind* State::Impl::Entry::pieces() {
  if (auto* s = as<si::ShardKind>()) return &s->pieces;
  return as<si::PiecesKind>();
}

si::HostCopy* State::Impl::Entry::host_copy() {
  if (auto* b = as<si::BufferKind>()) return &b->held;
  si::PiecesKind* p = pieces();
  return p != nullptr ? &p->held : nullptr;
}

void State::Impl::Entry::drop_host_copy() {
  if (si::HostCopy* h = host_copy()) *h = {};
}

void State::Impl::Entry::save_committed() {
  save(committed);
  drop_host_copy();
}

void State::Impl::concat(const std::vector<si::Piece>& ranges, std::vector<char>& out) {
  size_t total = 0;
  for (const si::Piece& r : ranges) total += r.second;
  out.resize(total);
  size_t at = 0;
  for (const auto& [p, n] : ranges) {
    if (n != 0) std::memcpy(out.data() + at, p, n);
    at += n;
  }
}

si::EntryRef State::Impl::ref(const Entry& e) {
  const si::HostCopy* h = e.host_copy();
  return h != nullptr && h->in_file() ? si::EntryRef{&e.name, h->data, h->bytes}
                                      : si::EntryRef::of(e.name, e.committed);
}

std::vector<si::EntryRef> State::Impl::refs() const {
  std::vector<si::EntryRef> r;
  r.reserve(entries.size());
  for (const Entry& e : entries) {
    if (e.has_committed && e.whole()) r.push_back(ref(e));
  }
  return r;
}

si::HostCommits::Keep State::Impl::whole_only() const {
  if (!has_shards()) return {};
  return [this](const std::string& name) {
    auto it = by_name.find(name);
    return it == by_name.end() || entries[it->second].whole();
  };
}

bool State::Impl::has_shards() const {
  return std::any_of(entries.begin(), entries.end(), [](const Entry& e) { return e.is<si::ShardKind>(); });
}

void State::Impl::fill_uncommitted() {
  for (Entry& e : entries) {
    if (!e.has_committed && e.whole()) {
      e.save_committed();
      e.has_committed = true;
      if (e.is<si::DeviceKind>()) std::vector<char>().swap(e.committed);  // the commit is in pinned memory
    }
  }
}

void State::Impl::apply(si::Snapshot&& snap, const std::string& source, bool allow_missing, bool devices_done) {
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
    if (devices_done && targets[i]->is<si::DeviceKind>()) {
      targets[i]->has_committed = true;
      continue;
    }
    try {
      targets[i]->load(bytes);
    } catch (const Error& e) {
      throw Error(fmt::format("{} (loading {})", e.what(), source));
    }
    targets[i]->committed = std::move(bytes);
    targets[i]->drop_host_copy();
    targets[i]->has_committed = true;
  }
  drop_device_mirrors();
  commit_id = snap.commit_id;
  has_snapshot = true;
}

void State::Impl::load_values() {
  for (Entry& e : entries) {
    if (!e.has_committed) continue;
    auto load_pieces = [&](si::PiecesKind& p) {
      if (p.held.in_file()) {
        p.load_range(p.held.data, p.held.bytes);
      } else {
        e.load(e.committed);
      }
    };
    std::visit(si::Overloaded{
                   [](si::DeviceKind& d) { d.slot->restore(); },
                   [&](si::BufferKind& b) {
                     if (!b.held.in_file()) {
                       e.load(e.committed);
                     } else if (b.bytes != 0) {
                       std::memcpy(b.data, b.held.data, b.bytes);
                     }
                   },
                   load_pieces,
                   [&](si::ShardKind& s) { load_pieces(s.pieces); },
                   [&](auto&) { e.load(e.committed); },
               },
               e.kind);
  }
}

std::vector<char> State::Impl::root_blob(uint64_t newest, bool devices_over_nccl, bool loaded) {
  if (newest == 0) {
    for (Entry& e : entries) {
      if (!e.whole()) continue;  // each rank keeps the piece it made
      e.save_committed();
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

si::EntryRef State::Impl::host_ref(size_t i, bool direct, const std::vector<std::vector<si::Piece>>* gathered,
                                   bool devices_later) const {
  const Entry& e = entries[i];
  if (const auto* d = e.as<si::DeviceKind>(); d != nullptr && devices_later) {
    return si::EntryRef::filled_later(e.name, d->slot->bytes());
  }
  if (const auto* b = e.as<si::BufferKind>(); b != nullptr && direct) return si::EntryRef{&e.name, b->data, b->bytes};
  if (e.gathers() && gathered != nullptr) return si::EntryRef::of(e.name, (*gathered)[i]);
  return ref(e);
}

void State::Impl::settle_host_copies(bool written, const std::vector<const char*>& placed,
                                     const std::vector<si::EntryRef>& out, bool direct,
                                     const std::vector<std::vector<si::Piece>>* gathered) {
  size_t k = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    Entry& e = entries[i];
    if (!e.has_committed) continue;
    if (si::HostCopy* h = e.host_copy(); h != nullptr && written) {
      *h = {placed[k], out[k].size};
      std::vector<char>().swap(e.committed);
    } else if (!written && direct && e.is<si::BufferKind>()) {
      e.save_committed();
    } else if (!written && gathered != nullptr && e.gathers()) {
      concat((*gathered)[i], e.committed);
      e.drop_host_copy();
    }
    ++k;
  }
}

bool State::Impl::write_host_commit(const WorkerInfo& info, bool direct, const std::vector<std::vector<si::Piece>>* gathered,
                         bool devices_later) {
  if (!host) return false;
  if (!devices_later) mirror_device();
  std::vector<si::EntryRef> out;
  out.reserve(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].has_committed) out.push_back(host_ref(i, direct, gathered, devices_later));
  }
  if (!std::exchange(host_room_checked, true) && info.local_rank == 0) {
    if (auto warning = host->room_warning(out, info.local_size)) ERUN_LOG_WARN("{}", *warning);
  }
  std::optional<std::string> err;
  std::vector<const char*> placed;
  std::shared_ptr<si::Completion> landed;
  try {
    // The host side persists rank 0's commits of a State without sharded
    // entries; with them, every rank writes its pieces and rank 0 the rest
    // (State::commit).
    const uint32_t flags = info.rank == 0 && !has_shards() ? si::kRankZeroCommit : 0;
    err = host->write(commit_id, out, &placed, flags, &landed);
  } catch (const Error& e) {
    err = e.what();
  }
  if (devices_later) land_devices(err ? nullptr : &placed, landed);
  settle_host_copies(!err, placed, out, direct, gathered);
  drop_device_mirrors();
  if (err && !host_failing) ERUN_LOG_ERROR("{}", *err);
  if (!err && host_failing) ERUN_LOG_INFO("host-memory commit {} written to {} again", commit_id, host->stem());
  host_failing = err.has_value();
  if (!err) laid_out = commit_id;
  return !err;
}

bool State::Impl::adopt(const WorkerInfo& info) {
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

void State::Impl::keep_in_host_memory(const WorkerInfo& info, bool resharded) {
  if (!host || commit_id == 0) {
    if (resharded) keep_shards_in_worker_memory();
    return;
  }
  if (!resharded) {
    try {
      if (host->holds(commit_id)) {  // and its rows stayed where they were
        laid_out = commit_id;
        return;
      }
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
    if (!e.has_committed) continue;
    std::visit(si::Overloaded{
                   [&](si::ShardTableKind&) { e.save_committed(); },
                   [&](si::ShardKind& s) {
                     Pieces p = s.pieces.gather();
                     gathered[i] = std::move(p.ranges);
                     keep.push_back(std::move(p.keep));
                   },
                   [&](si::PiecesKind&) {
                     const si::EntryRef r = ref(e);
                     gathered[i] = {{r.data, r.size}};
                   },
                   [](auto&) {},
               },
               e.kind);
  }
  write_host_commit(info, /*direct=*/true, &gathered);
}

void State::Impl::keep_shards_in_worker_memory() {
  for (Entry& e : entries) {
    if (e.has_committed && !e.whole()) e.save_committed();  // the pieces and their table
  }
}

void State::Impl::land_devices(const std::vector<const char*>* placed, const std::shared_ptr<si::Completion>& landed) {
  size_t k = 0;
  try {
    for (Entry& e : entries) {
      if (!e.has_committed) continue;
      if (auto* d = e.as<si::DeviceKind>(); d != nullptr && placed != nullptr) {
        // The file's bytes for this entry, writable in its mapping.
        d->slot->commit_into(const_cast<char*>((*placed)[k]), [landed] { landed->done(); });
      } else if (d != nullptr) {
        d->slot->commit();
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

void State::Impl::fence_devices() {
  for (Entry& e : entries) {
    if (auto* d = e.as<si::DeviceKind>()) d->slot->fence();
  }
}

bool State::Impl::fence_devices_quietly() noexcept {
  bool all = true;
  for (Entry& e : entries) {
    try {
      if (auto* d = e.as<si::DeviceKind>()) d->slot->fence();
    } catch (const Error&) {
      all = false;
    }
  }
  return all;
}

void State::Impl::pin_for_devices() {
  if (host && has_device_entries()) host->set_pinner(si::DeviceSlot::pinner());
}

void State::Impl::mirror_device() {
  for (Entry& e : entries) {
    auto* d = e.as<si::DeviceKind>();
    if (d != nullptr && e.has_committed) d->slot->mirror(e.committed);
  }
}

void State::Impl::drop_device_mirrors() {
  for (Entry& e : entries) {
    if (e.is<si::DeviceKind>()) std::vector<char>().swap(e.committed);
  }
}

void State::Impl::mark_device_sizes() {
  for (Entry& e : entries) {
    auto* d = e.as<si::DeviceKind>();
    if (d == nullptr) continue;
    const uint64_t n = d->slot->bytes();
    e.committed.resize(sizeof(n));
    std::memcpy(e.committed.data(), &n, sizeof(n));
  }
}

void State::Impl::send_devices(GpuCommunicator& gpu, int root) {
  for (Entry& e : entries) {
    if (auto* d = e.as<si::DeviceKind>()) gpu.broadcast(d->slot->buffer(), d->slot->bytes(), root, d->slot->stream());
  }
}

void State::Impl::receive_devices(const si::Snapshot& snap, const std::string& source, GpuCommunicator& gpu, int root) {
  std::vector<si::DeviceSlot*> order;
  for (const auto& [name, mark] : snap.entries) {
    auto it = by_name.find(name);
    if (it == by_name.end() || !entries[it->second].is<si::DeviceKind>()) continue;  // apply() names a stray entry
    si::DeviceSlot& slot = *entries[it->second].as<si::DeviceKind>()->slot;
    uint64_t n = 0;
    if (mark.size() != sizeof(n)) {
      throw Error(fmt::format("erun: {} holds host bytes for '{}', a device buffer here; register it the same "
                              "way on every worker",
                              source, name));
    }
    std::memcpy(&n, mark.data(), sizeof(n));
    slot.expect_bytes(static_cast<size_t>(n));
    order.push_back(&slot);
  }
  for (si::DeviceSlot* d : order) gpu.broadcast(d->buffer(), d->bytes(), root, d->stream());
  for (si::DeviceSlot* d : order) d->take();
}

bool State::Impl::has_device_entries() const {
  return std::any_of(entries.begin(), entries.end(), [](const Entry& e) { return e.is<si::DeviceKind>(); });
}

}  // namespace erun
