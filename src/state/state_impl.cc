// State::Impl's functions (state_impl.h): the entries' commits and their
// copies in worker memory, host memory and device memory.
#include "state/state_impl.h"

namespace erun {

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
  return e.held != nullptr ? si::EntryRef{&e.name, e.held, e.held_bytes} : si::EntryRef::of(e.name, e.committed);
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
  return std::any_of(entries.begin(), entries.end(), [](const Entry& e) { return e.shard != nullptr; });
}

void State::Impl::fill_uncommitted() {
  for (Entry& e : entries) {
    if (!e.has_committed && e.whole()) {
      e.save(e.committed);
      e.held = nullptr;
      e.has_committed = true;
      if (e.device) std::vector<char>().swap(e.committed);  // the commit is in pinned memory
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

void State::Impl::load_values() {
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

std::vector<char> State::Impl::root_blob(uint64_t newest, bool devices_over_nccl, bool loaded) {
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

bool State::Impl::write_host_commit(const WorkerInfo& info, bool direct, const std::vector<std::vector<si::Piece>>* gathered,
                         bool devices_later) {
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
    // The host side persists rank 0's commits of a State without sharded
    // entries; with them, every rank writes its pieces and rank 0 the rest
    // (State::commit).
    const uint32_t flags = info.rank == 0 && !has_shards() ? si::kRankZeroCommit : 0;
    err = host->write(commit_id, out, &placed, flags, &landed);
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

void State::Impl::keep_shards_in_worker_memory() {
  for (Entry& e : entries) {
    if (e.shard && e.has_committed) {
      e.save(e.committed);
      e.held = nullptr;
    } else if (e.shard_table && e.has_committed) {
      e.save(e.committed);
    }
  }
}

void State::Impl::land_devices(const std::vector<const char*>* placed, const std::shared_ptr<si::Completion>& landed) {
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

void State::Impl::fence_devices() {
  for (Entry& e : entries) {
    if (e.device) e.device->fence();
  }
}

bool State::Impl::fence_devices_quietly() noexcept {
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

void State::Impl::pin_for_devices() {
  if (host && has_device_entries()) host->set_pinner(si::DeviceSlot::pinner());
}

void State::Impl::mirror_device() {
  for (Entry& e : entries) {
    if (e.device && e.has_committed) e.device->mirror(e.committed);
  }
}

void State::Impl::drop_device_mirrors() {
  for (Entry& e : entries) {
    if (e.device) std::vector<char>().swap(e.committed);
  }
}

void State::Impl::mark_device_sizes() {
  for (Entry& e : entries) {
    if (!e.device) continue;
    const uint64_t n = e.device->bytes();
    e.committed.resize(sizeof(n));
    std::memcpy(e.committed.data(), &n, sizeof(n));
  }
}

void State::Impl::send_devices(GpuCommunicator& gpu, int root) {
  for (Entry& e : entries) {
    if (e.device) gpu.broadcast(e.device->buffer(), e.device->bytes(), root, e.device->stream());
  }
}

void State::Impl::receive_devices(const si::Snapshot& snap, const std::string& source, GpuCommunicator& gpu, int root) {
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

bool State::Impl::has_device_entries() const {
  return std::any_of(entries.begin(), entries.end(), [](const Entry& e) { return e.device != nullptr; });
}

}  // namespace erun
