// State among the ranks of a generation: sync(), the host-update check and
// the commit-id agreement, the durable and host-memory commits a State
// adopts, the reset callbacks, and re-joining (erun::run's step). The
// entries themselves are state.cc's.
#include "state/state_impl.h"

namespace erun {

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
    impl_->host_persists = launcher_dir && impl_->host && impl_->ordinal == 0 && !impl_->has_shards();
  }
  Communicator& comm = ctx_.comm();
  const int size = comm.size();
  const int rank = comm.rank();
  const int rejoined_from = std::exchange(impl_->rejoined_from, 0);
  impl_->pending_reset.reset();
  if (impl_->has_shards()) {
    sync_sharded(rejoined_from);
    return;
  }
  if (size == 1) {
    impl_->sync_alone(ctx_.info(), rejoined_from);
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
  si::broadcast_blob(comm, blob, root);
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

void State::Impl::sync_alone(const WorkerInfo& info, int rejoined_from) {
  const bool loaded = adopt(info);
  fill_uncommitted();
  if (commit_id > 0 && !loaded) load_values();
  has_snapshot = true;
  keep_in_host_memory(info);
  if (snapshot_size == 0 && commit_id == 0) snapshot_size = 1;
  if (rejoined_from > 0) pending_reset.emplace(snapshot_size > 0 ? snapshot_size : rejoined_from, 1);
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


void State::set_checkpoint_dir(const std::string& dir) {
  if (Status ok = ensure_private_dir(dir, "checkpoint directory"); !ok) throw Error("erun: " + ok.message());
  impl_->checkpoint_dir = dir;
  if (ctx_.rank() == 0) si::remove_stale_temp_files(dir, si::kStateFile);
  // With sharded entries the next sync() decides, with every rank, whether
  // the file's commit is newer than what the hosts' memory holds whole.
  if (impl_->has_shards()) return;
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

