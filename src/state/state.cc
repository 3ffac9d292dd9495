// State, its entries: registering them, commit() and restore() (the
// generation side is in state_sync.cc; the shared insides in state_impl.h).
#include "state/state_impl.h"

namespace erun {

State::State(Context& ctx) : ctx_(ctx), impl_(std::make_unique<Impl>()) {}
State::~State() {
  // A push to the buddy reads this worker's files: it ends first (a worker
  // that leaves so leaves its last commit on the next host).
  impl_->finish_push();
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
  if (may_throw) e.kind = si::ObjectKind{};
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
  // A null buffer (of 0 bytes) stays a plain value, as it always was.
  if (data != nullptr) impl_->entries.back().kind = si::BufferKind{static_cast<char*>(data), bytes, {}};
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
  impl_->entries.back().kind = si::DeviceKind{std::move(slot)};
  impl_->pin_for_devices();
}

void State::register_bytes(const std::string& name, std::function<void(std::vector<char>&)> save,
                           std::function<void(const std::vector<char>&)> load) {
  register_entry(name, std::move(save), std::move(load), /*may_throw=*/true);
  impl_->entries.back().kind = si::BytesKind{};
}

void State::register_pieces(const std::string& name, std::function<Pieces()> save,
                            std::function<void(const char*, size_t)> load) {
  register_entry(name, [save](std::vector<char>& out) { Impl::concat(save().ranges, out); },
                 [load](const std::vector<char>& b) { load(b.data(), b.size()); }, /*may_throw=*/true);
  impl_->entries.back().kind = si::PiecesKind{std::move(save), std::move(load), {}};
}

void State::Impl::save_staged(Entry& e, std::vector<char>& out, std::vector<char>* spare) {
  if (spare != nullptr) out.swap(*spare);
  try {
    e.save(out);
  } catch (...) {
    if (spare != nullptr) spare->swap(out);
    throw;
  }
}

State::Impl::Staged State::Impl::stage() {
  Staged st;
  st.bytes.resize(entries.size());
  st.pieces.resize(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    Entry& e = entries[i];
    if (si::PiecesKind* p = e.pieces()) {
      Pieces got = p->gather();
      st.pieces[i] = std::move(got.ranges);
      st.keep.push_back(std::move(got.keep));
    } else if (auto* b = e.as<si::BytesKind>()) {
      save_staged(e, st.bytes[i], &b->spare);
    } else if (e.is<si::ObjectKind>()) {
      save_staged(e, st.bytes[i], nullptr);
    }
  }
  return st;
}

void State::Impl::take_staged(Staged& st, bool direct, uint64_t id, int rank, int size) {
  for (size_t i = 0; i < entries.size(); ++i) {
    Entry& e = entries[i];
    std::vector<char>& bytes = st.bytes[i];
    auto take_pieces = [&](si::PiecesKind& p) {
      if (direct) return;  // copied by write_host_commit
      concat(st.pieces[i], e.committed);
      p.held = {};
    };
    std::visit(si::Overloaded{
                   [&](si::ShardKind& s) {
                     s.held = si::split_rows(s.rows, s.rule, rank, size);
                     s.commit = id;
                     take_pieces(s.pieces);
                   },
                   take_pieces,
                   [&](si::ObjectKind&) { e.committed.swap(bytes); },
                   [&](si::BytesKind& b) {
                     e.committed.swap(bytes);
                     b.spare.swap(bytes);
                   },
                   [&](si::DeviceKind& d) {
                     if (!direct) d.slot->commit();  // else straight into the host file (write_host_commit)
                   },
                   [&](si::BufferKind&) {
                     // With host memory, copied by write_host_commit from its own memory.
                     if (!direct) e.save_committed();
                   },
                   [&](auto&) { e.save_committed(); },  // values, the shard table
               },
               e.kind);
    e.has_committed = true;
  }
  commit_id = id;
  has_snapshot = true;
  snapshot_size = size;
}

void State::commit() {
  // With host-memory commits, registered buffers and pieces are copied once,
  // straight into the host file (write_host_commit).
  const bool direct = impl_->host != nullptr;
  // The last commit's device copies landed (a stuck GPU throws here, before
  // anything changed).
  if (direct) impl_->fence_devices();
  // User serializers may throw, and a sharded piece may have the wrong
  // size: both before anything changed.
  Impl::Staged staged = impl_->stage();
  impl_->check_shard_sizes(staged.pieces, ctx_.rank(), ctx_.size());
  // The buddy has the previous commit (or its push failed) before this one
  // is written: it is never more than one commit behind. And no rank writes
  // over the commit before the previous one until every rank's buddy holds
  // the previous one: otherwise a host lost with its push in flight would
  // leave its rows at the commit before, which the others no longer keep.
  // Before anything changed: a barrier that fails leaves the previous
  // commit whole (taken first, the values were the new commit's and the
  // rows, in the host file, the previous one's).
  impl_->finish_push();
  if (impl_->prune && impl_->has_shards()) {
    const bool kept = impl_->rows_in_kept_pairs();
    if (ctx_.comm().allreduce_value<int64_t>(kept ? 1 : 0, ReduceOp::kMin) == 1) {
      impl_->prune_stale_pairs(ctx_.rank());
      impl_->prune.reset();
    }
  } else if (impl_->many_hosts && impl_->has_shards()) {
    ctx_.comm().barrier();
  }
  const uint64_t previous = impl_->commit_id;  // the buddy's copy of it stays while this one is pushed
  impl_->take_staged(staged, direct, std::max(impl_->commit_id + 1, impl_->next_id), ctx_.rank(), ctx_.size());
  const bool in_host_memory = impl_->write_host_commit(ctx_.info(), direct, &staged.pieces, /*devices_later=*/true);
  staged = {};  // the ranges were copied
  if (in_host_memory && impl_->buddy) impl_->push_to_buddy(ctx_, previous);
  // Sharded entries: every rank's pieces on disk first; the whole entries
  // then name a commit whose pieces are all there.
  const bool sharded_durable = !impl_->checkpoint_dir.empty() && impl_->has_shards();
  bool pieces_durable = false;
  if (sharded_durable) {
    const bool mine = impl_->write_durable_pieces(ctx_.rank());
    pieces_durable = ctx_.comm().allreduce_value<int64_t>(mine ? 1 : 0, ReduceOp::kMin) == 1;
    if (pieces_durable) impl_->durable_agreed = impl_->commit_id;
  }
  if (!impl_->checkpoint_dir.empty() && ctx_.rank() == 0 &&
      (sharded_durable ? pieces_durable : !(impl_->host_persists && in_host_memory))) {
    impl_->mirror_device();
    si::write_file_atomically(impl_->checkpoint_dir, si::kStateFile, impl_->commit_id, impl_->refs());
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


uint64_t State::commit_id() const { return impl_->commit_id; }

}  // namespace erun
