// Sharded entries (docs/state.md, "Sharded entries"): registering them, and
// the reshard that sync() runs once the ranks agree on the commit, which
// gives each rank of the new generation exactly its rows of each entry from
// the pieces the job's hosts hold (state/reshard_plan.h for the choice,
// state/shard_exchange.h for the bytes).
#include "state/state_impl.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <set>

#include "commits/commit_files.h"
#include "common/fd.h"
#include "state/shard_sync.h"

namespace erun {

namespace {

si::SplitRule rule_of(State::ShardSplit s) {
  return s == State::ShardSplit::kChunk ? si::SplitRule::kChunk : si::SplitRule::kEven;
}

}  // namespace

std::pair<uint64_t, uint64_t> State::shard_rows(const ShardSpec& spec, int rank, int size) {
  const si::RowRange r = si::split_rows(spec.rows, rule_of(spec.split), rank, size);
  return {r.begin, r.end};
}

void State::register_shard_bytes(const std::string& name, ShardSpec spec, ShardStorage storage) {
  if (spec.row_elems == 0) {
    throw Error(fmt::format("erun: sharded entry '{}' has rows of 0 bytes; give the bytes of a row", name));
  }
  if (!storage.save || !storage.load || !storage.prepare || !storage.install) {
    throw Error(fmt::format("erun: sharded entry '{}' lacks a save, load, prepare or install function", name));
  }
  if (!impl_->checkpoint_dir.empty()) {
    throw Error(fmt::format("erun: sharded entry '{}' registered after the checkpoint directory {} was set; "
                            "register every entry first, then call set_checkpoint_dir()",
                            name, impl_->checkpoint_dir));
  }
  if (!impl_->has_shards()) {
    // The table of this State's pieces, written with them to host memory.
    Impl* impl = impl_.get();
    register_entry(si::kShardTable, [impl](std::vector<char>& out) {
      const std::string table = si::encode_shard_table(impl->shard_shapes());
      out.assign(table.begin(), table.end());
    }, [](const std::vector<char>&) {});
    impl_->entries.back().kind = si::ShardTableKind{};
  }
  auto save = storage.save;
  auto load = storage.load;
  register_pieces(name, std::move(save), std::move(load));
  Impl::Entry& e = impl_->entries.back();
  si::ShardKind shard;
  shard.pieces = std::get<si::PiecesKind>(std::move(e.kind));
  shard.rows = spec.rows;
  shard.row_bytes = spec.row_elems;
  shard.rule = rule_of(spec.split);
  shard.held = si::split_rows(spec.rows, shard.rule, ctx_.rank(), ctx_.size());
  shard.prepare = std::move(storage.prepare);
  shard.install = std::move(storage.install);
  e.kind = std::move(shard);
}

void State::Impl::check_shard_sizes(const std::vector<std::vector<si::Piece>>& gathered, int rank, int size) {
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto* s = entries[i].as<si::ShardKind>();
    if (s == nullptr) continue;
    const si::RowRange want = si::split_rows(s->rows, s->rule, rank, size);
    size_t bytes = 0;
    for (const si::Piece& p : gathered[i]) bytes += p.second;
    if (bytes != want.size() * s->row_bytes) {
      throw Error(fmt::format("erun: sharded entry '{}' holds {} bytes on rank {} of {}, but its rows {}..{} of {} "
                              "are {} bytes; keep each rank's piece at the rows State::shard_rows() gives",
                              entries[i].name, bytes, rank, size, want.begin, want.end, s->rows,
                              want.size() * s->row_bytes));
    }
  }
}

std::vector<si::EntryRef> State::Impl::shard_refs() const {
  std::vector<si::EntryRef> out;
  for (const Entry& e : entries) {
    if (!e.whole() && e.has_committed) out.push_back(ref(e));
  }
  return out;
}

void State::Impl::install_rows(Entry& e, si::RowRange want, uint64_t id) {
  si::ShardKind& s = e.shard();
  s.install();
  s.held = want;
  s.commit = id;
  e.has_committed = true;
  // The pieces' table goes with them into the host file and the buddy's:
  // without it neither copy is readable as pieces (list_pieces skips the
  // file), and a worker that joined by a grow, whose table had never been
  // committed, was lost with its rows until its first commit was whole.
  for (Entry& t : entries) {
    if (t.is<si::ShardTableKind>()) t.has_committed = true;
  }
}

void State::Impl::push_to_buddy(const Context& ctx, uint64_t keep) {
  finish_push();
  std::vector<si::EntryRef> out = shard_refs();
  const WorkerInfo& info = ctx.info();
  push = std::make_unique<Push>();
  push->id = commit_id;
  push->who = who(info.generation, info.host, info.rank);
  Push* p = push.get();
  p->thread = std::thread([p, keep, b = *buddy, out = std::move(out), timeout = ctx.collective_timeout()] {
    p->result = si::push_to_buddy(b.address, b.port, b.job_id, b.secret, b.name, p->id, keep, out, timeout);
  });
}

void State::Impl::push_rewritten(const Context& ctx) {
  // The commit in its new layout, to the buddy too: until the next commit
  // has reached it, the old layout's copies may be all the others keep.
  try {
    // Not over the same commit in its old layout: until this push ends it
    // may be the buddy's only copy of these rows.
    if (buddy && host && commit_id != 0 && host->holds(commit_id)) push_to_buddy(ctx, commit_id);
  } catch (const Error&) {
    // no host-memory files: the commit stays in worker memory, unpushed
  }
}

void State::Impl::finish_push() {
  if (!push) return;
  push->thread.join();
  const bool failed = !push->result.is_ok();
  if (failed && !buddy_failing) {
    ERUN_LOG_WARN("{}: commit {} has no copy on another host ({}): {}; should this host be lost before a commit "
                  "reaches a buddy, the job goes back to the newest commit whose pieces it holds",
                  push->who, push->id, buddy ? buddy->host : "none", push->result.message());
  } else if (!failed && buddy_failing) {
    ERUN_LOG_INFO("{}: commit {} is on another host again", push->who, push->id);
  }
  buddy_failing = failed;
  if (!failed) pushed = push->id;
  push.reset();
}

bool State::Impl::rows_in_kept_pairs() const {
  if (prune->dir.empty() || commit_id == 0) return true;  // no host files, or nothing committed
  return host && laid_out == commit_id && (!buddy || pushed == commit_id);
}

void State::Impl::prune_stale_pairs(int rank) {
  if (keeper) keeper->forget_pairs_except(prune->keep);
  if (!prune->remover || prune->dir.empty()) return;
  Fd dir(::open(prune->dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dir) return;
  // A pair goes when no pair the host keeps is of its worker (or pusher),
  // whatever the State: should two processes number their States apart,
  // a live file of another State is never taken for a stale one of this.
  auto worker_of = [](const std::string& stem) {
    const int k = si::HostCommits::ordinal_of(stem + ".a");
    const std::string suffix = fmt::format("-s{}", k);
    return k > 0 && stem.size() > suffix.size() && stem.compare(stem.size() - suffix.size(), suffix.size(), suffix) == 0
               ? stem.substr(0, stem.size() - suffix.size())
               : stem;
  };
  std::set<std::string> kept_workers;
  for (const std::string& k : prune->keep) kept_workers.insert(worker_of(k));
  std::vector<std::string> stale;
  for (const ClaimedCommit& c : claimed_commits(prune->dir, /*buddies=*/true)) {
    const std::string stem = c.name.substr(0, c.name.size() - 2);
    if (si::HostCommits::ordinal_of(c.name) == ordinal && kept_workers.count(worker_of(stem)) == 0) {
      stale.push_back(c.name);
    }
  }
  uint64_t bytes = 0;
  size_t removed = 0;
  for (const std::string& name : stale) {
    struct stat st {};
    if (::fstatat(dir.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) continue;
    if (::unlinkat(dir.get(), name.c_str(), 0) != 0) continue;
    bytes += static_cast<uint64_t>(st.st_size);
    ++removed;
  }
  if (removed > 0) {
    ERUN_LOG_INFO("erun: rank {} removed {} commit files of this host that the job no longer needs ({:.1f} MiB): "
                  "slots no worker uses now, and copies for workers that now push elsewhere",
                  rank, removed, static_cast<double>(bytes) / (1 << 20));
  }
}

bool State::Impl::write_durable_pieces(int rank) {
  std::string err;
  try {
    if (!durable || durable_rank != rank) {
      durable.reset();
      const std::string stem = fmt::format("{}/rank-{}", durable_dir(), rank);
      durable = std::make_unique<si::HostCommits>(si::HostCommits::stem_of(stem, std::max(ordinal, 0)));
      durable_rank = rank;
    }
    const std::vector<si::EntryRef> out = shard_refs();
    durable->keep_commit(durable_agreed);
    if (auto failed = durable->write(commit_id, out)) {
      err = *failed;
    } else if (!durable->flush()) {
      err = fmt::format("erun: commit {} could not be flushed to {}: {}", commit_id, durable->stem(),
                        std::strerror(errno));
    }
  } catch (const Error& e) {
    err = e.what();
  }
  if (!err.empty() && !durable_failing) {
    ERUN_LOG_ERROR("{}; {} keeps the job's last durable commit until every rank writes its pieces again", err,
                   checkpoint_dir);
  }
  if (err.empty() && durable_failing) ERUN_LOG_INFO("rank {}: sharded pieces written to {} again", rank, durable_dir());
  durable_failing = !err.empty();
  return err.empty();
}

State::Impl::DurableIds State::Impl::durable_ids(Communicator& comm) const {
  // The headers' claims only: take_durable() reads and checks the files.
  std::vector<int64_t> ids{0, 0};
  if (comm.rank() == 0) {
    ids[0] = static_cast<int64_t>(si::file_commit_id(checkpoint_dir + "/" + si::kStateFile));
    for (const ClaimedCommit& c : claimed_commits(durable_dir())) {
      if (si::HostCommits::ordinal_of(c.name) == std::max(ordinal, 0)) {
        ids[1] = std::max(ids[1], static_cast<int64_t>(c.id));
      }
    }
  }
  comm.allreduce(ids, ReduceOp::kMax);
  return {static_cast<uint64_t>(ids[0]), static_cast<uint64_t>(ids[1])};
}

si::Snapshot State::Impl::read_durable_whole(Communicator& comm, uint64_t id) const {
  const std::string path = checkpoint_dir + "/" + si::kStateFile;
  std::vector<char> blob;
  if (comm.rank() == 0 && !si::read_file(path, &blob)) blob.clear();
  si::broadcast_blob(comm, blob, 0);
  si::Snapshot snap = si::decode(blob.data(), blob.size(), path);
  if (snap.commit_id != id) {
    throw CommError(fmt::format("erun: {} changed while the job read it (commit {}, then {})", path, id,
                                snap.commit_id));
  }
  return snap;
}

int64_t State::Impl::read_durable_rows(Entry& e, si::RowRange want, uint64_t id,
                                       const std::vector<si::FilePiece>& files, std::string* lost,
                                       std::string* failure) {
  // The pieces files as copies on this rank's host: the plan reads each row
  // once, from the piece that covers the longest run.
  const si::ShardKind& shard = e.shard();
  std::vector<si::RowSource> sources;
  std::vector<const si::FilePiece*> of_source;
  for (const si::FilePiece& f : files) {
    if (f.id != id || f.piece.name != e.name || f.piece.rows != shard.rows || f.piece.row_bytes != shard.row_bytes) {
      continue;
    }
    sources.push_back({f.piece.held, 0, 0, false, f.offset, static_cast<int>(sources.size())});
    of_source.push_back(&f);
  }
  const si::RowPlan plan = si::plan_rows(want, /*me=*/-1, /*host=*/0, sources);
  if (!plan.missing.empty()) {
    *lost += fmt::format("{}'{}' {} of {}", lost->empty() ? "" : "; ", e.name, si::rows_text(plan.missing),
                         shard.rows);
    return 2;
  }
  const uint64_t row = shard.row_bytes;
  char* fresh = static_cast<char*>(shard.prepare(want.size()));
  std::map<std::string, std::vector<si::ByteRange>> by_file;
  for (const si::RowTransfer& t : plan.transfers) {
    const si::RowSource& s = sources[t.source];
    by_file[of_source[t.source]->file].push_back(
        {s.offset + (t.rows.begin - s.rows.begin) * row, t.rows.size() * row, fresh + (t.rows.begin - want.begin) * row});
  }
  for (const auto& [file, ranges] : by_file) {
    if (Status st = si::read_ranges(durable_dir() + "/" + file, id, ranges); !st.is_ok()) {
      *failure = st.message();
      return 1;
    }
  }
  return 0;
}

void State::Impl::take_durable(Communicator& comm, uint64_t id) {
  si::Snapshot whole = read_durable_whole(comm, id);
  const std::vector<si::FilePiece> files = si::list_pieces(durable_dir(), std::max(ordinal, 0));
  int64_t code = 0;  // 1: a read failed; 2: rows no file holds
  std::string failure, lost;
  std::vector<std::pair<Entry*, si::RowRange>> installs;
  for (Entry& e : entries) {
    const auto* s = e.as<si::ShardKind>();
    if (s == nullptr) continue;
    const si::RowRange want = si::split_rows(s->rows, s->rule, comm.rank(), comm.size());
    installs.emplace_back(&e, want);
    code = std::max(code, read_durable_rows(e, want, id, files, &lost, &failure));
  }
  const int64_t failed = comm.allreduce_value<int64_t>(code, ReduceOp::kMax);
  if (failed == 2) {
    throw StateLost(fmt::format("erun: durable commit {} in {} cannot be put back together: {}{}", id,
                                checkpoint_dir, lost.empty() ? "another rank lacks rows" : "no file holds " + lost,
                                "; its pieces files were removed or overwritten"));
  }
  if (failed != 0) {
    throw CommError(fmt::format("erun: reading durable commit {} failed{}", id,
                                failure.empty() ? " on another rank" : ": " + failure));
  }
  apply(std::move(whole), checkpoint_dir + "/" + si::kStateFile, /*allow_missing=*/true);
  for (auto& [e, want] : installs) install_rows(*e, want, id);
  commit_id = id;
  has_snapshot = true;
  snapshot_size = 0;  // the file does not say
}

si::Offer State::Impl::offer(const WorkerInfo& info, const Link& link, const std::string& dir, int rejoined_from,
                             int size, Duration timeout, std::unique_ptr<si::ShardServer>* server) {
  si::Offer mine;
  mine.host = info.host;
  mine.address = link.address;
  mine.rejoined_from = static_cast<uint64_t>(rejoined_from);
  if (has_snapshot && commit_id > 0) {
    mine.memory_id = commit_id;
    mine.snapshot_size = static_cast<uint64_t>(snapshot_size);
    mine.whole.push_back(commit_id);
    for (const Entry& e : entries) {
      const auto* s = e.as<si::ShardKind>();
      if (s != nullptr && e.has_committed && s->commit == commit_id) {
        mine.memory.push_back({e.name, s->rows, s->row_bytes, s->held});
      }
    }
  }
  if (host == nullptr) return mine;
  try {
    auto [a, b] = host->held_ids();
    for (uint64_t id : {a, b}) {
      if (id != 0) mine.whole.push_back(id);
    }
  } catch (const Error&) {
    // no host-memory files: the first commit says why
  }
  if (adoptable) mine.whole.push_back(adoptable->id);
  if (!keeper && !link.address.empty() && link.replicas > 0) {
    keeper = std::make_unique<si::BuddyKeeper>(link.address, dir, link.job_id, link.secret, timeout);
    if (keeper->port() == 0) ERUN_LOG_WARN("erun: rank {} keeps no buddy copies: {}", info.rank, keeper->error());
  }
  if (keeper) {
    keeper->accept_any();  // this generation's pushers, whoever they are
    mine.buddy_port = keeper->port();
  }
  mine.stem = host->stem().substr(host->stem().rfind('/') + 1);
  mine.files = si::list_pieces(dir, ordinal);
  if (!mine.files.empty() && !link.address.empty() && size > 1) {
    *server = std::make_unique<si::ShardServer>(link.address, dir, link.job_id, link.secret, timeout);
    if ((*server)->port() == 0) {
      ERUN_LOG_WARN("erun: rank {} serves no sharded pieces: {}", info.rank, (*server)->error());
    }
    mine.port = (*server)->port();
  }
  return mine;
}

void State::Impl::pair_buddy(const si::Holdings& held, int rank, const std::string& stem, const Link& link) {
  buddy.reset();
  pushed = 0;
  // With --commit-replicas 0 no rank offers a keeper (offer()), so none is chosen.
  const int b = si::choose_buddy(held, rank);
  if (b < 0 || host == nullptr) return;
  const si::Offer& k = held.offers[static_cast<size_t>(b)];
  const std::string own = si::HostCommits::stem_of(stem, ordinal);
  buddy = Buddy{k.host, k.address, k.buddy_port, kBuddyPrefix + own.substr(own.rfind('/') + 1), link.job_id,
                link.secret};
}

std::vector<si::SplitRule> State::Impl::shard_rules() const {
  std::vector<si::SplitRule> out;
  for (const Entry& e : entries) {
    if (const auto* s = e.as<si::ShardKind>()) out.push_back(s->rule);
  }
  return out;
}

std::vector<si::ShardPiece> State::Impl::shard_shapes() const {
  std::vector<si::ShardPiece> out;
  for (const Entry& e : entries) {
    if (const auto* s = e.as<si::ShardKind>()) out.push_back({e.name, s->rows, s->row_bytes, s->held});
  }
  return out;
}

void State::Impl::take_whole(Communicator& comm, const WorkerInfo& info, const si::Holdings& held, uint64_t target) {
  // From the lowest rank that holds the commit in memory, else from the
  // lowest that has it in a file; nobody committed (0): rank 0's values.
  int root = -1;
  for (size_t r = 0; target != 0 && r < held.offers.size() && root < 0; ++r) {
    if (held.offers[r].memory_id == target) root = static_cast<int>(r);
  }
  for (size_t r = 0; target != 0 && r < held.offers.size() && root < 0; ++r) {
    const auto& w = held.offers[r].whole;
    if (std::find(w.begin(), w.end(), target) != w.end()) root = static_cast<int>(r);
  }
  if (root < 0) root = 0;
  const int rank = comm.rank();
  std::vector<char> blob;
  if (rank == root) {
    bool loaded = false;
    if (target != 0 && !(has_snapshot && commit_id == target)) {
      if (adoptable && adoptable->id == target) {
        loaded = adopt(info);
      } else if (auto snap = host ? host->read_held(target, whole_only()) : std::nullopt) {
        apply(std::move(*snap), fmt::format("host-memory commit {} of {}", target, host->stem()),
              /*allow_missing=*/true);
        snapshot_size = 0;
        loaded = true;
      }
      if (!loaded) throw CommError(fmt::format("erun: rank {} could not read commit {} it offered", rank, target));
    }
    adoptable.reset();
    blob = root_blob(target, /*devices_over_nccl=*/false, loaded);
  } else {
    adoptable.reset();
  }
  const int size = comm.size();
  if (size > 1) {
    si::broadcast_blob(comm, blob, root);
    if (rank != root) {
      std::string source = fmt::format("the state broadcast by rank {}", root);
      si::Snapshot snap = si::decode(blob.data(), blob.size(), source);
      blob = {};
      apply(std::move(snap), source, /*allow_missing=*/false);
    }
  }
  const si::Offer& from = held.offers[static_cast<size_t>(root)];
  snapshot_size = target == 0 ? size : from.memory_id == target ? static_cast<int>(from.snapshot_size) : 0;
}

bool State::Impl::holds_its_rows(const si::Holdings& held, uint64_t target, int rank, int size) const {
  if (held.offers[static_cast<size_t>(rank)].memory_id != target) return false;
  for (const Entry& e : entries) {
    const auto* s = e.as<si::ShardKind>();
    if (s != nullptr &&
        !(e.has_committed && s->commit == target && s->held == si::split_rows(s->rows, s->rule, rank, size))) {
      return false;
    }
  }
  return true;
}

std::vector<State::Impl::RowsPlan> State::Impl::plan_reshard(const si::Holdings& held, uint64_t target, int rank,
                                                            int size, uint64_t* moved) {
  std::vector<RowsPlan> plans;
  const int my_host = held.host_of[static_cast<size_t>(rank)];
  for (Entry& e : entries) {
    const auto* s = e.as<si::ShardKind>();
    if (s == nullptr) continue;
    RowsPlan m{&e, {}, {}, {}, si::split_rows(s->rows, s->rule, rank, size)};
    held.sources({e.name, s->rows, s->row_bytes, {}}, target, &m.sources, &m.files);
    m.plan = si::plan_rows(m.want, rank, my_host, m.sources);
    *moved += si::remote_rows(m.plan, my_host, m.sources) * s->row_bytes;
    plans.push_back(std::move(m));
  }
  return plans;
}

void State::Impl::read_rows(RowsPlan& m, const si::Holdings& held, uint64_t target, int my_host,
                            const std::string& dir, const Link& link, Duration timeout) {
  si::ShardKind& shard = m.entry->shard();
  const uint64_t row = shard.row_bytes;
  char* fresh = static_cast<char*>(shard.prepare(m.want.size()));
  std::map<size_t, std::vector<si::ByteRange>> by_source;  // the file reads, per source
  for (const si::RowTransfer& t : m.plan.transfers) {
    const si::RowSource& s = m.sources[t.source];
    char* out = fresh + (t.rows.begin - m.want.begin) * row;
    const uint64_t bytes = t.rows.size() * row;
    if (s.memory) {
      std::memcpy(out, ref(*m.entry).data + (t.rows.begin - s.rows.begin) * row, bytes);
    } else {
      by_source[t.source].push_back({s.offset + (t.rows.begin - s.rows.begin) * row, bytes, out});
    }
  }
  for (auto& [k, ranges] : by_source) {
    const si::RowSource& s = m.sources[k];
    const si::Offer& o = held.offers[static_cast<size_t>(s.server)];
    Status st = s.host == my_host ? si::read_ranges(dir + "/" + m.files[k], target, ranges)
                                  : si::fetch_ranges(o.address, o.port, link.job_id, link.secret, m.files[k], target,
                                                     ranges, timeout);
    if (!st.is_ok()) throw Error(st.message());
  }
}

bool State::Impl::reshard(Communicator& comm, const si::Holdings& held, uint64_t target, const std::string& dir,
                          const Link& link, Duration timeout, std::unique_ptr<si::ShardServer> server,
                          uint64_t* moved, const std::function<void(const char*)>& phase) {
  const int rank = comm.rank();
  const int size = comm.size();
  if (comm.allreduce_value<int64_t>(holds_its_rows(held, target, rank, size) ? 0 : 1, ReduceOp::kMax) == 0) {
    // Every rank holds its rows of this commit: back to them (a plain host
    // update leaves the steps since the commit in the storage).
    for (Entry& e : entries) {
      if (auto* s = e.as<si::ShardKind>()) s->pieces.load_range(ref(e).data, ref(e).size);
    }
    return false;
  }
  std::vector<RowsPlan> plans = plan_reshard(held, target, rank, size, moved);
  // Rows that only another rank's memory holds (no host-memory files)
  // cannot reach this rank.
  std::string failure;
  int64_t code = 0;  // 1: a read failed (try again); 2: rows cannot reach a rank
  for (const RowsPlan& m : plans) {
    if (m.plan.missing.empty()) continue;
    failure = fmt::format("'{}' {} of commit {} lie only in another rank's memory: sharded entries move between ranks "
                          "through host-memory commit files (ERUN_COMMIT_DIR), which this worker has not",
                          m.entry->name, si::rows_text(m.plan.missing), target);
    code = 2;
  }
  // The bytes: into new storage, the old one (and the commit) left as they are.
  try {
    for (RowsPlan& m : plans) {
      if (code == 0) read_rows(m, held, target, held.host_of[static_cast<size_t>(rank)], dir, link, timeout);
    }
  } catch (const Error& e) {
    failure = e.what();
    code = 1;
  }
  phase("the rows");
  // Nobody installs until every rank has read what it needs: the servers
  // and the files stay as they are until then.
  const int64_t failed = comm.allreduce_value<int64_t>(code, ReduceOp::kMax);
  phase("waiting for the others");
  server.reset();
  const std::string what =
      fmt::format("erun: resharding commit {} failed{}", target, failure.empty() ? " on another rank" : ": " + failure);
  if (failed == 2) throw StateLost(what);
  if (failed != 0) throw CommError(what);
  for (RowsPlan& m : plans) install_rows(*m.entry, m.want, target);
  return true;
}

void State::Impl::keep_own_pieces(int rank, int size) {
  // Nobody committed: each rank keeps the piece it made for this world.
  for (Entry& e : entries) {
    if (auto* s = e.as<si::ShardKind>()) s->held = si::split_rows(s->rows, s->rule, rank, size);
  }
}

void State::Impl::go_on_from(const si::CommitChoice& choice, int rank, int size, bool copies_elsewhere,
                             bool host_files) {
  if (choice.newest != 0 && choice.target == 0 && !host_files) {
    throw StateLost(fmt::format(
        "erun: commit {} of the sharded entries cannot be put back together for {} ranks: {} lie only in other "
        "ranks' memory, and sharded rows move between ranks through host-memory commit files (ERUN_COMMIT_DIR), "
        "which this worker has not (--no-host-commits?); give --checkpoint-dir to resume from disk",
        choice.newest, size, choice.lost));
  }
  if (choice.newest != 0 && choice.target == 0) {
    throw StateLost(fmt::format(
        "erun: commit {} of the sharded entries cannot be put back together: no living host holds {}; every copy "
        "of those rows was lost (their workers' hosts failed, or their commits stayed in worker memory: a full "
        "/dev/shm{}), and no older commit is whole either. Restart from a durable checkpoint",
        choice.newest, choice.lost,
        copies_elsewhere ? ""
                         : "; with --commit-replicas 0 no other host keeps a copy: leave it at 1 or give --checkpoint-dir"));
  }
  if (choice.target < choice.newest && rank == 0) {
    ERUN_LOG_WARN("erun: commit {} of the sharded entries is not whole ({} missing: a worker died before it "
                  "committed, or a host was lost before its copies reached another host); the job goes on from "
                  "commit {}",
                  choice.newest, choice.lost, choice.target);
  }
  next_id = std::max(next_id, choice.seen + 1);
}

bool State::Impl::go_on_from_durable(const Context& ctx, Communicator& comm, const si::CommitChoice& choice) {
  const DurableIds disk = checkpoint_dir.empty() ? DurableIds{} : durable_ids(comm);
  const uint64_t durable = disk.agreed;
  durable_agreed = durable;
  next_id = std::max(next_id, disk.newest + 1);
  if (durable <= choice.target) return false;
  next_id = std::max(next_id, choice.seen + 1);
  if (comm.rank() == 0) {
    ERUN_LOG_WARN("erun: {}; the job goes on from durable commit {} in {}",
                  choice.newest == 0  ? "no commit in the hosts' memory"
                  : choice.target == 0 ? fmt::format("commit {} of the sharded entries is lost ({} missing)",
                                                     choice.newest, choice.lost)
                                       : fmt::format("the newest whole commit in the hosts' memory is {}",
                                                     choice.target),
                  durable, checkpoint_dir);
  }
  take_durable(comm, durable);
  if (choice.any_rejoin > 0) pending_reset.emplace(static_cast<int>(choice.any_rejoin), comm.size());
  keep_in_host_memory(ctx.info(), /*resharded=*/true);
  push_rewritten(ctx);
  return true;
}

namespace {

// Where a sync's time goes, for the debug log at its end.
class SyncPhases {
 public:
  void operator()(const char* name) {
    const auto now = std::chrono::steady_clock::now();
    text_ += fmt::format("{}{} {:.1f} ms", text_.empty() ? "" : ", ", name, ms(mark_, now));
    mark_ = now;
  }
  double total_ms() const { return ms(start_, std::chrono::steady_clock::now()); }
  const std::string& text() const { return text_; }

 private:
  static double ms(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
  }
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point mark_ = start_;
  std::string text_;
};

// Every rank's offer (the sync's first step), read back.
si::Holdings gather_offers(Communicator& comm, const std::string& offer) {
  std::vector<si::Offer> offers;
  for (const auto& bytes : comm.allgatherv(offer.data(), offer.size())) {
    offers.push_back(si::decode_offer(bytes, static_cast<int>(offers.size())));
  }
  return si::Holdings(std::move(offers));
}

}  // namespace

void State::sync_sharded(int rejoined_from) {
  SyncPhases phase;
  Impl& im = *impl_;
  // The push of the last commit ends first: the buddy then holds it (or
  // the push failed and says so), whatever this sync rewrites.
  im.finish_push();
  phase("the last push");
  Communicator& comm = ctx_.comm();
  const int rank = comm.rank();
  const int size = comm.size();
  const WorkerInfo& info = ctx_.info();
  const std::string stem = ctx_.host_commit_stem();
  const std::string dir = stem.empty() ? std::string() : stem.substr(0, stem.rfind('/'));
  const Context::PeerLink peer = ctx_.peer_link();
  const Impl::Link link{peer.address, peer.job_id, peer.secret, peer.replicas};
  const Duration timeout = ctx_.collective_timeout();

  // 1. What each rank holds: its memory's commit, its files' commits, the
  // pieces its host's files hold (a dead worker's and buddy copies too).
  std::unique_ptr<si::ShardServer> server;
  const si::Holdings held =
      gather_offers(comm, si::encode_offer(im.offer(info, link, dir, rejoined_from, size, timeout, &server)));
  phase("offers");
  im.pair_buddy(held, rank, stem, link);
  im.many_hosts = !held.host_of.empty() && *std::max_element(held.host_of.begin(), held.host_of.end()) > 0;
  const int my_host = held.host_of[static_cast<size_t>(rank)];
  const auto first_here = std::find(held.host_of.begin(), held.host_of.end(), my_host) - held.host_of.begin();
  im.prune = Impl::Prune{dir, si::pairs_to_keep(held, my_host), first_here == rank};
  im.laid_out = 0;  // until this generation writes its layout

  // 2. The commit: the newest whole one. Ids written since are skipped
  // from now on: an id never names two commits. A durable commit newer
  // than it (every copy in memory lost, or a job started again) wins.
  const si::CommitChoice choice = si::choose_commit(held, im.shard_shapes(), im.shard_rules());
  if (im.go_on_from_durable(ctx_, comm, choice)) return;
  im.go_on_from(choice, rank, size, link.replicas > 0, !dir.empty());

  // 3. The whole entries, and the reset due.
  im.take_whole(comm, info, held, choice.target);
  if (choice.any_rejoin > 0) {
    im.pending_reset.emplace(im.snapshot_size > 0 ? im.snapshot_size : static_cast<int>(choice.any_rejoin), size);
  }

  // 4. The sharded entries.
  if (choice.target == 0) return im.keep_own_pieces(rank, size);
  uint64_t moved = 0;
  phase("the buddy, the commit, the whole entries");
  const bool resharded =
      im.reshard(comm, held, choice.target, dir, link, timeout, std::move(server), &moved, std::ref(phase));
  phase(resharded ? "installing" : "the rows in place");
  if (resharded) {
    ERUN_LOG_INFO("{}: resharded commit {} for {} ranks ({} bytes from other hosts, {:.1f} ms)",
                  who(info.generation, info.host, rank), choice.target, size, moved, phase.total_ms());
  }
  im.keep_in_host_memory(info, resharded);
  phase("the host's file");
  if (resharded) im.push_rewritten(ctx_);
  phase("the push's start");
  ERUN_LOG_DEBUG("{}: sync of the sharded entries: {}", who(info.generation, info.host, rank), phase.text());
}

}  // namespace erun
