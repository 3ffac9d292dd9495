// Sharded entries (docs/state.md, "Sharded entries"): registering them, and
// the reshard that sync() runs once the ranks agree on the commit, which
// gives each rank of the new generation exactly its rows of each entry from
// the pieces the job's hosts hold (state/reshard_plan.h for the choice,
// state/shard_exchange.h for the bytes).
#include "state/state_impl.h"

#include <map>
#include <set>

#include "commits/commit_files.h"
#include "common/codec.h"

namespace erun {

namespace {

si::SplitRule rule_of(State::ShardSplit s) {
  return s == State::ShardSplit::kChunk ? si::SplitRule::kChunk : si::SplitRule::kEven;
}

// What one rank tells the others at a sharded State's sync().
struct Offer {
  std::string host;
  std::string address;
  int port = 0;                        // its shard server (0: none)
  int buddy_port = 0;                  // its BuddyKeeper (0: none)
  uint64_t memory_id = 0;              // the commit in its memory (0: none)
  uint64_t snapshot_size = 0;          // the world size that commit was made at (0: unknown)
  uint64_t rejoined_from = 0;          // the world size it re-joined from since the last sync (0: none)
  std::vector<uint64_t> whole;         // commits whose whole entries it can give (its memory, its files)
  std::vector<si::ShardPiece> memory;  // the pieces of its memory commit
  std::vector<si::FilePiece> files;    // the pieces its host's files hold
};

std::string encode_offer(const Offer& o) {
  PayloadWriter w;
  w.bytes(o.host).bytes(o.address).u32(static_cast<uint32_t>(o.port)).u32(static_cast<uint32_t>(o.buddy_port));
  w.u64(o.memory_id).u64(o.snapshot_size).u64(o.rejoined_from);
  w.u32(static_cast<uint32_t>(o.whole.size()));
  for (uint64_t id : o.whole) w.u64(id);
  w.bytes(si::encode_shard_table(o.memory));
  w.u32(static_cast<uint32_t>(o.files.size()));
  for (const si::FilePiece& f : o.files) {
    w.bytes(f.file).u64(f.id).u64(f.offset).bytes(si::encode_shard_table({f.piece}));
  }
  return w.str();
}

Offer decode_offer(const std::vector<char>& bytes, int rank) {
  const std::string source = fmt::format("rank {}'s offer of sharded pieces", rank);
  PayloadReader r(std::string_view(bytes.data(), bytes.size()));
  Offer o;
  o.host = r.bytes();
  o.address = r.bytes();
  o.port = static_cast<int>(r.u32());
  o.buddy_port = static_cast<int>(r.u32());
  o.memory_id = r.u64();
  o.snapshot_size = r.u64();
  o.rejoined_from = r.u64();
  const uint32_t ids = r.u32();
  for (uint32_t i = 0; i < ids && !r.failed() && i < (1u << 16); ++i) o.whole.push_back(r.u64());
  const std::string memory = r.bytes();
  o.memory = si::decode_shard_table(memory.data(), memory.size(), source);
  const uint32_t n = r.u32();
  for (uint32_t i = 0; i < n && !r.failed(); ++i) {
    si::FilePiece f;
    f.file = r.bytes();
    f.id = r.u64();
    f.offset = r.u64();
    const std::string table = r.bytes();
    auto pieces = si::decode_shard_table(table.data(), table.size(), source);
    if (pieces.size() != 1) break;
    f.piece = std::move(pieces.front());
    o.files.push_back(std::move(f));
  }
  if (!r.done() || o.files.size() != n || o.whole.size() != ids) {
    throw Error(fmt::format("erun: {} is malformed", source));
  }
  return o;
}

// Every rank's offer, and where each row of each commit can be read.
struct Holdings {
  std::vector<Offer> offers;
  std::vector<int> host_of;     // per rank, its host's number (hosts numbered in rank order)
  std::vector<bool> publishes;  // per rank: it serves its host's files (the host's lowest rank that found some)

  explicit Holdings(std::vector<Offer> all) : offers(std::move(all)) {
    std::map<std::string, int> index;
    std::vector<bool> published;
    for (const Offer& o : offers) {
      auto [it, fresh] = index.emplace(o.host, static_cast<int>(index.size()));
      if (fresh) published.push_back(false);
      const auto h = static_cast<size_t>(it->second);
      host_of.push_back(it->second);
      publishes.push_back(!published[h] && !o.files.empty());
      if (publishes.back()) published[h] = true;
    }
  }

  // The copies of entry `name`'s rows at commit `id`, and per copy its file
  // (empty: a rank's memory).
  void sources(const std::string& name, uint64_t rows, uint64_t row_bytes, uint64_t id,
               std::vector<si::RowSource>* out, std::vector<std::string>* files) const {
    auto check = [&](const si::ShardPiece& p, const std::string& where) {
      if (p.rows == rows && p.row_bytes == row_bytes) return;
      throw Error(fmt::format("erun: sharded entry '{}' has {} rows of {} bytes here, but {} holds a piece of {} "
                              "rows of {} bytes; register it with the same shape on every worker",
                              name, rows, row_bytes, where, p.rows, p.row_bytes));
    };
    for (size_t r = 0; r < offers.size(); ++r) {
      const Offer& o = offers[r];
      if (o.memory_id == id) {
        for (const si::ShardPiece& p : o.memory) {
          if (p.name != name) continue;
          check(p, fmt::format("rank {}'s commit {}", r, id));
          si::RowSource s;
          s.rows = p.held;
          s.host = host_of[r];
          s.server = static_cast<int>(r);
          s.memory = true;
          out->push_back(s);
          files->emplace_back();
        }
      }
      if (!publishes[r]) continue;
      for (const si::FilePiece& f : o.files) {
        if (f.id != id || f.piece.name != name) continue;
        check(f.piece, fmt::format("file {} of host {}", f.file, o.host));
        si::RowSource s;
        s.rows = f.piece.held;
        s.host = host_of[r];
        s.server = static_cast<int>(r);
        s.offset = f.offset;
        out->push_back(s);
        files->push_back(f.file);
      }
    }
  }

  // The rows of [0, rows) that no copy of commit `id` holds.
  std::vector<si::RowRange> holes(const std::string& name, uint64_t rows, uint64_t row_bytes, uint64_t id) const {
    std::vector<si::RowSource> s;
    std::vector<std::string> files;
    sources(name, rows, row_bytes, id, &s, &files);
    std::sort(s.begin(), s.end(), [](const auto& a, const auto& b) { return a.rows.begin < b.rows.begin; });
    std::vector<si::RowRange> out;
    uint64_t at = 0;
    for (const si::RowSource& c : s) {
      if (c.rows.size() == 0) continue;
      if (c.rows.begin > at) out.push_back({at, c.rows.begin});
      at = std::max(at, c.rows.end);
    }
    if (at < rows) out.push_back({at, rows});
    return out;
  }
};

std::string rows_text(const std::vector<si::RowRange>& ranges) {
  std::string out;
  for (const si::RowRange& r : ranges) {
    out += fmt::format("{}{}", out.empty() ? "" : ", ",
                       r.size() == 1 ? fmt::format("row {}", r.begin) : fmt::format("rows {}..{}", r.begin, r.end - 1));
  }
  return out;
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
    throw Error(fmt::format("erun: sharded entry '{}': sharded entries are not written to durable checkpoints "
                            "yet, and this State has the checkpoint directory {}",
                            name, impl_->checkpoint_dir));
  }
  if (!impl_->has_shards()) {
    // The table of this State's pieces, written with them to host memory.
    Impl* impl = impl_.get();
    register_entry(si::kShardTable, [impl](std::vector<char>& out) {
      std::vector<si::ShardPiece> pieces;
      for (const Impl::Entry& e : impl->entries) {
        if (e.shard) pieces.push_back({e.name, e.shard->rows, e.shard->row_bytes, e.shard->held});
      }
      const std::string table = si::encode_shard_table(pieces);
      out.assign(table.begin(), table.end());
    }, [](const std::vector<char>&) {});
    impl_->entries.back().shard_table = true;
  }
  auto save = storage.save;
  auto load = storage.load;
  register_pieces(name, std::move(save), std::move(load));
  auto shard = std::make_shared<Impl::Entry::Shard>();
  shard->rows = spec.rows;
  shard->row_bytes = spec.row_elems;
  shard->rule = rule_of(spec.split);
  shard->held = si::split_rows(spec.rows, shard->rule, ctx_.rank(), ctx_.size());
  shard->prepare = std::move(storage.prepare);
  shard->install = std::move(storage.install);
  impl_->entries.back().shard = std::move(shard);
}

void State::Impl::check_shard_sizes(const std::vector<std::vector<si::Piece>>& gathered, int rank, int size) {
  for (size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    if (!e.shard) continue;
    const si::RowRange want = si::split_rows(e.shard->rows, e.shard->rule, rank, size);
    size_t bytes = 0;
    for (const si::Piece& p : gathered[i]) bytes += p.second;
    if (bytes != want.size() * e.shard->row_bytes) {
      throw Error(fmt::format("erun: sharded entry '{}' holds {} bytes on rank {} of {}, but its rows {}..{} of {} "
                              "are {} bytes; keep each rank's piece at the rows State::shard_rows() gives",
                              e.name, bytes, rank, size, want.begin, want.end, e.shard->rows,
                              want.size() * e.shard->row_bytes));
    }
  }
}

namespace {

// This rank's buddy for the generation: a worker of the next host (in rank
// order, around) that keeps copies, the one at this rank's place among its
// host's ranks (modulo their number). -1: none (one host).
int choose_buddy(const Holdings& held, int rank) {
  const int hosts = 1 + *std::max_element(held.host_of.begin(), held.host_of.end());
  const int mine = held.host_of[static_cast<size_t>(rank)];
  int place = 0;
  for (int r = 0; r < rank; ++r) place += held.host_of[static_cast<size_t>(r)] == mine;
  for (int step = 1; step < hosts; ++step) {
    const int next = (mine + step) % hosts;
    std::vector<int> keepers;
    for (size_t r = 0; r < held.offers.size(); ++r) {
      if (held.host_of[r] == next && held.offers[r].buddy_port != 0) keepers.push_back(static_cast<int>(r));
    }
    if (!keepers.empty()) return keepers[static_cast<size_t>(place) % keepers.size()];
  }
  return -1;
}

}  // namespace

void State::Impl::push_to_buddy(const Context& ctx) {
  finish_push();
  std::vector<si::EntryRef> out;
  for (const Entry& e : entries) {
    if ((e.shard || e.shard_table) && e.has_committed) out.push_back(ref(e));
  }
  const WorkerInfo& info = ctx.info();
  push = std::make_unique<Push>();
  push->id = commit_id;
  push->who = who(info.generation, info.host, info.rank);
  Push* p = push.get();
  p->thread = std::thread([p, b = *buddy, out = std::move(out), timeout = ctx.collective_timeout()] {
    p->result = si::push_to_buddy(b.address, b.port, b.job_id, b.secret, b.name, p->id, out, timeout);
  });
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
  push.reset();
}

void State::sync_sharded(int rejoined_from) {
  const auto started = std::chrono::steady_clock::now();
  Impl& im = *impl_;
  // The push of the last commit ends first: the buddy then holds it (or
  // the push failed and says so), whatever this sync rewrites.
  im.finish_push();
  Communicator& comm = ctx_.comm();
  const int rank = comm.rank();
  const int size = comm.size();
  const WorkerInfo& info = ctx_.info();
  const std::string stem = ctx_.host_commit_stem();
  const std::string dir = stem.empty() ? std::string() : stem.substr(0, stem.rfind('/'));
  const Context::PeerLink link = ctx_.peer_link();
  std::vector<Impl::Entry*> shards;
  for (Impl::Entry& e : im.entries) {
    if (e.shard) shards.push_back(&e);
  }
  auto want_of = [&](const Impl::Entry& e, int r) { return si::split_rows(e.shard->rows, e.shard->rule, r, size); };

  // 1. What each rank holds: its memory's commit, its files' commits, the
  // pieces its host's files hold (a dead worker's too).
  Offer mine;
  mine.host = info.host;
  mine.address = link.address;
  mine.rejoined_from = static_cast<uint64_t>(rejoined_from);
  if (im.has_snapshot && im.commit_id > 0) {
    mine.memory_id = im.commit_id;
    mine.snapshot_size = static_cast<uint64_t>(im.snapshot_size);
    mine.whole.push_back(im.commit_id);
    for (Impl::Entry* e : shards) {
      if (e->has_committed && e->shard->commit == im.commit_id) {
        mine.memory.push_back({e->name, e->shard->rows, e->shard->row_bytes, e->shard->held});
      }
    }
  }
  std::unique_ptr<si::ShardServer> server;
  if (im.host != nullptr) {
    try {
      auto [a, b] = im.host->held_ids();
      for (uint64_t id : {a, b}) {
        if (id != 0) mine.whole.push_back(id);
      }
    } catch (const Error&) {
      // no host-memory files: the first commit says why
    }
    if (im.adoptable) mine.whole.push_back(im.adoptable->id);
    if (!im.keeper && !link.address.empty()) {
      im.keeper = std::make_unique<si::BuddyKeeper>(link.address, dir, link.job_id, link.secret,
                                                    ctx_.collective_timeout());
      if (im.keeper->port() == 0) ERUN_LOG_WARN("erun: rank {} keeps no buddy copies: {}", rank, im.keeper->error());
    }
    if (im.keeper) mine.buddy_port = im.keeper->port();
    mine.files = si::list_pieces(dir, im.ordinal);
    if (!mine.files.empty() && !link.address.empty() && size > 1) {
      server = std::make_unique<si::ShardServer>(link.address, dir, link.job_id, link.secret,
                                                 ctx_.collective_timeout());
      if (server->port() == 0) ERUN_LOG_WARN("erun: rank {} serves no sharded pieces: {}", rank, server->error());
      mine.port = server->port();
    }
  }
  const std::string offer = encode_offer(mine);
  std::vector<Offer> offers;
  for (const auto& bytes : comm.allgatherv(offer.data(), offer.size())) {
    offers.push_back(decode_offer(bytes, static_cast<int>(offers.size())));
  }
  const Holdings held(std::move(offers));
  im.buddy.reset();
  if (const int b = choose_buddy(held, rank); b >= 0 && im.host != nullptr) {
    const Offer& k = held.offers[static_cast<size_t>(b)];
    const std::string own = si::HostCommits::stem_of(stem, im.ordinal);
    im.buddy = Impl::Buddy{k.host,          k.address,  k.buddy_port, kBuddyPrefix + own.substr(own.rfind('/') + 1),
                           link.job_id,     link.secret};
  }

  // 2. The commit: the newest that some rank can give whole and whose
  // sharded rows the job holds in full. Ids written since are skipped from
  // now on: an id never names two commits.
  std::set<uint64_t, std::greater<>> ids;
  uint64_t seen = 0;
  uint64_t any_rejoin = 0;
  for (const Offer& o : held.offers) {
    ids.insert(o.whole.begin(), o.whole.end());
    for (const si::FilePiece& f : o.files) seen = std::max(seen, f.id);
    any_rejoin = std::max(any_rejoin, o.rejoined_from);
  }
  if (!ids.empty()) seen = std::max(seen, *ids.begin());
  auto lost_at = [&](uint64_t id) {
    std::vector<std::string> lost;
    for (Impl::Entry* e : shards) {
      auto holes = held.holes(e->name, e->shard->rows, e->shard->row_bytes, id);
      if (!holes.empty()) lost.push_back(fmt::format("'{}' {} of {}", e->name, rows_text(holes), e->shard->rows));
    }
    return lost;
  };
  uint64_t target = 0;
  for (uint64_t id : ids) {
    if (lost_at(id).empty()) {
      target = id;
      break;
    }
  }
  if (!ids.empty() && target == 0) {
    throw StateLost(fmt::format(
        "erun: commit {} of the sharded entries cannot be put back together: no living host holds {}; every copy "
        "of those rows was lost (their workers' hosts failed), and no older commit is whole either. Restart from a "
        "durable checkpoint",
        *ids.begin(), fmt::join(lost_at(*ids.begin()), "; ")));
  }
  if (!ids.empty() && target < *ids.begin() && rank == 0) {
    ERUN_LOG_WARN("erun: commit {} of the sharded entries is not whole ({} missing: a worker died before it "
                  "committed); the job goes on from commit {}",
                  *ids.begin(), fmt::join(lost_at(*ids.begin()), "; "), target);
  }
  im.next_id = std::max(im.next_id, seen + 1);

  // 3. The whole entries, from the lowest rank that holds the commit in
  // memory, else from the lowest that has it in a file.
  int root = 0;
  if (target != 0) {
    root = -1;
    for (size_t r = 0; r < held.offers.size() && root < 0; ++r) {
      if (held.offers[r].memory_id == target) root = static_cast<int>(r);
    }
    for (size_t r = 0; r < held.offers.size() && root < 0; ++r) {
      const auto& w = held.offers[r].whole;
      if (std::find(w.begin(), w.end(), target) != w.end()) root = static_cast<int>(r);
    }
  }
  std::vector<char> blob;
  if (rank == root) {
    bool loaded = false;
    if (target != 0 && !(im.has_snapshot && im.commit_id == target)) {
      if (im.adoptable && im.adoptable->id == target) {
        loaded = im.adopt(info);
      } else if (auto snap = im.host ? im.host->read_held(target, im.whole_only()) : std::nullopt) {
        im.apply(std::move(*snap), fmt::format("host-memory commit {} of {}", target, im.host->stem()),
                 /*allow_missing=*/true);
        im.snapshot_size = 0;
        loaded = true;
      }
      if (!loaded) throw CommError(fmt::format("erun: rank {} could not read commit {} it offered", rank, target));
    }
    im.adoptable.reset();
    blob = im.root_blob(target, /*devices_over_nccl=*/false, loaded);
  } else {
    im.adoptable.reset();
  }
  if (size > 1) {
    int64_t bytes = static_cast<int64_t>(blob.size());
    comm.broadcast(&bytes, sizeof(bytes), root);
    if (rank != root) blob.resize(static_cast<size_t>(bytes));
    comm.broadcast(blob.data(), blob.size(), root);
    if (rank != root) {
      std::string source = fmt::format("the state broadcast by rank {}", root);
      si::Snapshot snap = si::decode(blob.data(), blob.size(), source);
      blob = {};
      im.apply(std::move(snap), source, /*allow_missing=*/false);
    }
  }
  const Offer& from = held.offers[static_cast<size_t>(root)];
  im.snapshot_size = target == 0 ? size : from.memory_id == target ? static_cast<int>(from.snapshot_size) : 0;
  if (any_rejoin > 0) {
    im.pending_reset.emplace(im.snapshot_size > 0 ? im.snapshot_size : static_cast<int>(any_rejoin), size);
  }

  // 4. The sharded entries.
  if (target == 0) {
    // Nobody committed: each rank keeps the piece it made for this world.
    for (Impl::Entry* e : shards) e->shard->held = want_of(*e, rank);
    return;
  }
  bool mine_ok = true;
  for (Impl::Entry* e : shards) {
    mine_ok = mine_ok && e->has_committed && e->shard->commit == target && held.offers[static_cast<size_t>(rank)].memory_id == target &&
              e->shard->held == want_of(*e, rank);
  }
  if (comm.allreduce_value<int64_t>(mine_ok ? 0 : 1, ReduceOp::kMax) == 0) {
    // Every rank holds its rows of this commit: back to them (a plain host
    // update leaves the steps since the commit in the storage).
    for (Impl::Entry* e : shards) {
      const si::EntryRef r = Impl::ref(*e);
      e->load_range(r.data, r.size);
    }
    im.keep_in_host_memory(info);
    return;
  }
  struct EntryPlan {
    Impl::Entry* entry;
    std::vector<si::RowSource> sources;
    std::vector<std::string> files;  // per source, its file (empty: memory)
    si::RowPlan plan;
    si::RowRange want;
  };
  std::vector<EntryPlan> plans;
  const int my_host = held.host_of[static_cast<size_t>(rank)];
  uint64_t moved = 0;
  for (Impl::Entry* e : shards) {
    EntryPlan m{e, {}, {}, {}, want_of(*e, rank)};
    held.sources(e->name, e->shard->rows, e->shard->row_bytes, target, &m.sources, &m.files);
    m.plan = si::plan_rows(m.want, rank, my_host, m.sources);
    moved += si::remote_rows(m.plan, my_host, m.sources) * e->shard->row_bytes;
    plans.push_back(std::move(m));
  }
  // Rows that only another rank's memory holds (no host-memory files)
  // cannot reach this rank.
  std::string failure;
  int64_t code = 0;  // 1: a read failed (try again); 2: rows cannot reach a rank
  for (const EntryPlan& m : plans) {
    if (!m.plan.missing.empty()) {
      failure = fmt::format("'{}' {} of commit {} lie only in another rank's memory: sharded entries move between "
                            "ranks through host-memory commit files (ERUN_COMMIT_DIR), which this worker has not",
                            m.entry->name, rows_text(m.plan.missing), target);
      code = 2;
    }
  }

  // 5. The bytes: into new storage, the old one (and the commit) left as they are.
  try {
    for (EntryPlan& m : plans) {
      if (code != 0) break;
      const uint64_t row = m.entry->shard->row_bytes;
      char* fresh = static_cast<char*>(m.entry->shard->prepare(m.want.size()));
      std::map<size_t, std::vector<si::ByteRange>> by_source;
      for (const si::RowTransfer& t : m.plan.transfers) {
        const si::RowSource& s = m.sources[t.source];
        char* out = fresh + (t.rows.begin - m.want.begin) * row;
        const uint64_t bytes = t.rows.size() * row;
        if (s.memory) {
          const si::EntryRef r = Impl::ref(*m.entry);
          std::memcpy(out, r.data + (t.rows.begin - s.rows.begin) * row, bytes);
        } else {
          by_source[t.source].push_back({s.offset + (t.rows.begin - s.rows.begin) * row, bytes, out});
        }
      }
      for (auto& [k, ranges] : by_source) {
        const si::RowSource& s = m.sources[k];
        const Offer& o = held.offers[static_cast<size_t>(s.server)];
        Status st = s.host == my_host ? si::read_ranges(dir + "/" + m.files[k], target, ranges)
                                      : si::fetch_ranges(o.address, o.port, link.job_id, link.secret, m.files[k],
                                                         target, ranges, ctx_.collective_timeout());
        if (!st.is_ok()) throw Error(st.message());
      }
    }
  } catch (const Error& e) {
    failure = e.what();
    code = 1;
  }
  // Nobody installs until every rank has read what it needs: the servers
  // and the files stay as they are until then.
  const int64_t failed = comm.allreduce_value<int64_t>(code, ReduceOp::kMax);
  server.reset();
  if (failed == 2) {
    throw StateLost(fmt::format("erun: resharding commit {} failed{}", target,
                                failure.empty() ? " on another rank" : ": " + failure));
  }
  if (failed != 0) {
    throw CommError(fmt::format("erun: resharding commit {} failed{}", target,
                                failure.empty() ? " on another rank" : ": " + failure));
  }
  for (EntryPlan& m : plans) {
    m.entry->shard->install();
    m.entry->shard->held = m.want;
    m.entry->shard->commit = target;
    m.entry->has_committed = true;
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
  ERUN_LOG_INFO("{}: resharded commit {} for {} ranks ({} bytes from other hosts, {:.1f} ms)",
                who(info.generation, info.host, rank), target, size, moved, ms);
  im.keep_in_host_memory(info, /*resharded=*/true);
}

}  // namespace erun
