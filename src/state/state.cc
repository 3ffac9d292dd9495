#include "erun/state.hpp"

#include <fmt/format.h>

#include <filesystem>
#include <unordered_map>

#include "common/log.h"
#include "erun/erun.hpp"
#include "state/snapshot.h"

namespace erun {

namespace si = state_internal;

struct State::Impl {
  struct Entry {
    std::string name;
    SaveFn save;
    LoadFn load;
    bool may_throw = false;
    std::vector<char> committed;  // owned deep copy; its allocation is reused between commits
    bool has_committed = false;
  };
  std::vector<Entry> entries;
  std::unordered_map<std::string, size_t> by_name;
  uint64_t commit_id = 0;
  bool has_snapshot = false;  // a commit, a synced baseline, or a loaded checkpoint
  std::string checkpoint_dir;
  bool launcher_checkpoint_checked = false;
  std::vector<std::function<void(int, int)>> reset_callbacks;

  std::vector<si::EntryRef> refs() const {
    std::vector<si::EntryRef> r;
    r.reserve(entries.size());
    for (const Entry& e : entries) {
      if (e.has_committed) r.push_back({&e.name, &e.committed});
    }
    return r;
  }

  // Entries registered after the last snapshot join it with their current value.
  void fill_uncommitted() {
    for (Entry& e : entries) {
      if (!e.has_committed) {
        e.save(e.committed);
        e.has_committed = true;
      }
    }
  }

  // Loads `snap` into the registered values and makes it the committed snapshot.
  void apply(si::Snapshot&& snap, const std::string& source, bool allow_missing) {
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
      try {
        targets[i]->load(bytes);
      } catch (const Error& e) {
        throw Error(fmt::format("{} (loading {})", e.what(), source));
      }
      targets[i]->committed = std::move(bytes);
      targets[i]->has_committed = true;
    }
    commit_id = snap.commit_id;
    has_snapshot = true;
  }

  void load_values() {
    for (Entry& e : entries) {
      if (e.has_committed) e.load(e.committed);
    }
  }
};

State::State(Context& ctx) : ctx_(ctx), impl_(std::make_unique<Impl>()) {}
State::~State() = default;

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
}

void State::commit() {
  // User serializers may throw: run them before touching the snapshot.
  std::vector<std::vector<char>> staged(impl_->entries.size());
  for (size_t i = 0; i < impl_->entries.size(); ++i) {
    if (impl_->entries[i].may_throw) impl_->entries[i].save(staged[i]);
  }
  for (size_t i = 0; i < impl_->entries.size(); ++i) {
    Impl::Entry& e = impl_->entries[i];
    if (e.may_throw) {
      e.committed.swap(staged[i]);
    } else {
      e.save(e.committed);
    }
    e.has_committed = true;
  }
  impl_->commit_id += 1;
  impl_->has_snapshot = true;
  if (!impl_->checkpoint_dir.empty() && ctx_.rank() == 0) {
    si::write_file_atomically(impl_->checkpoint_dir, si::kStateFile, impl_->commit_id,
                              impl_->refs());
  }
  check_host_updates();
}

void State::restore() {
  if (impl_->has_snapshot) impl_->load_values();
}

void State::sync() {
  if (!impl_->launcher_checkpoint_checked) {
    impl_->launcher_checkpoint_checked = true;
    if (impl_->checkpoint_dir.empty() && !ctx_.checkpoint_dir().empty()) set_checkpoint_dir(ctx_.checkpoint_dir());
  }
  Communicator& comm = ctx_.comm();
  const int size = comm.size();
  const int rank = comm.rank();
  if (size == 1) {
    impl_->fill_uncommitted();
    if (impl_->commit_id > 0) impl_->load_values();
    impl_->has_snapshot = true;
    return;
  }
  std::vector<uint64_t> ids(static_cast<size_t>(size));
  uint64_t mine = impl_->commit_id;
  comm.allgather(&mine, ids.data(), sizeof(uint64_t));
  int root = 0;
  for (int r = 1; r < size; ++r) {
    if (ids[static_cast<size_t>(r)] > ids[static_cast<size_t>(root)]) root = r;
  }
  const uint64_t newest = ids[static_cast<size_t>(root)];

  std::vector<char> blob;
  if (rank == root) {
    if (newest == 0) {
      // Nobody committed: the root's current values are everyone's baseline.
      for (Impl::Entry& e : impl_->entries) {
        e.save(e.committed);
        e.has_committed = true;
      }
      impl_->has_snapshot = true;
    } else {
      impl_->fill_uncommitted();
      impl_->load_values();
    }
    blob = si::encode(impl_->commit_id, impl_->refs());
  }
  int64_t bytes = static_cast<int64_t>(blob.size());
  comm.broadcast(&bytes, sizeof(bytes), root);
  if (rank != root) blob.resize(static_cast<size_t>(bytes));
  comm.broadcast(blob.data(), blob.size(), root);
  if (rank != root) {
    std::string source = fmt::format("the state broadcast by rank {}", root);
    impl_->apply(si::decode(blob.data(), blob.size(), source), source, /*allow_missing=*/false);
  }
}

void State::check_host_updates() {
  Communicator& comm = ctx_.comm();
  int32_t pending = ctx_.host_update_pending() ? 1 : 0;
  if (comm.size() > 1) pending = comm.allreduce_value<int32_t>(pending, ReduceOp::kMax);
  if (pending != 0) throw HostsUpdated();
}

uint64_t State::commit_id() const { return impl_->commit_id; }

void State::set_checkpoint_dir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    throw Error(fmt::format("erun: cannot create checkpoint directory {}: {}", dir,
                            ec.message()));
  }
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
  ERUN_LOG_INFO("resumed from commit {} in {}", id, path);
}

void State::on_reset(std::function<void(int, int)> callback) {
  impl_->reset_callbacks.push_back(std::move(callback));
}

void State::notify_reset(int old_size, int new_size) {
  for (auto& cb : impl_->reset_callbacks) cb(old_size, new_size);
}

namespace detail {

int rejoin(State& state, bool comm_error, const char* what, int failed_rank, PeerFate fate) {
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
  return before.size;
}

void reset(State& state, int old_size) { state.notify_reset(old_size, state.context().size()); }

}  // namespace detail

}  // namespace erun
