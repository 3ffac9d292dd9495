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
#include <set>
#include <thread>
#include <unordered_map>

#include "common/log.h"
#include "common/no_retry.h"
#include "common/private_files.h"
#include "erun/erun.hpp"
#include "state/device_state.h"
#include "state/entry_kinds.h"
#include "state/reshard_plan.h"
#include "state/shard_exchange.h"
#include "state/shard_sync.h"
#include "commits/host_commits.h"
#include "commits/snapshot.h"

namespace erun {

namespace si = state_internal;

namespace state_internal {
// Collective: `blob` from `root` to every rank (its size first), resized
// on the others.
void broadcast_blob(Communicator& comm, std::vector<char>& blob, int root);
}  // namespace state_internal

struct State::Impl {
  // One registered entry: what every kind has here, the rest in `kind`
  // (state/entry_kinds.h).
  struct Entry {
    std::string name;
    SaveFn save;
    LoadFn load;
    std::vector<char> committed;  // owned deep copy; its allocation is reused between commits
    bool has_committed = false;
    si::EntryKind kind = si::ValueKind{};

    template <class K>
    bool is() const {
      return std::holds_alternative<K>(kind);
    }
    template <class K>
    K* as() {
      return std::get_if<K>(&kind);
    }
    template <class K>
    const K* as() const {
      return std::get_if<K>(&kind);
    }
    // A sharded entry's shard (erun knows it is one).
    si::ShardKind& shard() { return std::get<si::ShardKind>(kind); }
    // A pieces entry's ranges, a sharded one's included (null for other kinds).
    si::PiecesKind* pieces();
    // register_pieces entries, sharded ones included: their bytes are
    // ranges gathered anew at each commit.
    bool gathers() const { return is<si::PiecesKind>() || is<si::ShardKind>(); }
    // A direct entry's copy in the host file: buffers and pieces (sharded
    // ones too), which commits copy straight there from their own memory
    // (null for the other kinds).
    si::HostCopy* host_copy();
    const si::HostCopy* host_copy() const { return const_cast<Entry*>(this)->host_copy(); }
    // Whether the entry travels in sync()'s blob and the durable file (not
    // a sharded piece, nor their table).
    bool whole() const { return !is<si::ShardKind>() && !is<si::ShardTableKind>(); }
    // Its commit now worker memory only (not the host file's copy).
    void drop_host_copy();
    // save() into `committed`, which becomes the commit.
    void save_committed();
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
  // The generation spans several hosts (known alike on every rank after a
  // sharded sync): a commit then waits, with every rank, for every rank's
  // push of the commit before (State::commit).
  bool many_hosts = false;
  bool buddy_failing = false;  // the last push failed (logged once per streak)
  uint64_t pushed = 0;          // the last commit that reached this generation's buddy (0: none yet)
  // The last commit this worker's own files hold in this generation's
  // layout (0: none yet): a sync's rewrite of the commit it goes on from
  // may fail (a full /dev/shm) while the file still holds that commit in
  // the old layout.
  uint64_t laid_out = 0;
  // Set by a sharded sync: the file pairs (no .a/.b) this host's commit
  // directory keeps for the generation (si::pairs_to_keep). At each commit,
  // once every rank's commit before it is in its own pair and its buddy's
  // (one allreduce, in place of the commit's barrier), the directory's other
  // pairs of this State are stale: the host's lowest rank removes them and
  // every keeper lets go of its mappings of them (prune_stale_pairs). Until
  // then they may hold the only other copy of some rows.
  struct Prune {
    std::string dir;
    std::set<std::string> keep;
    bool remover = false;  // this rank is its host's lowest
  };
  std::optional<Prune> prune;
  bool rows_in_kept_pairs() const;
  void prune_stale_pairs(int rank);
  // After a commit written to host memory: its pieces to the buddy, from a
  // thread of their own while training goes on. The push reads the commit
  // where it lies in this worker's own file, which nothing rewrites before
  // finish_push() has joined the push: the next commit, a sync and the
  // State's end wait for it first. So the buddy is at most one commit
  // behind, and a worker that leaves (a drain) leaves its last commit on
  // the next host.
  void push_to_buddy(const Context& ctx, uint64_t keep);
  // Sharded entries with a checkpoint directory: each rank writes its
  // pieces of every commit (with their table) to a file pair of
  // CHECKPOINT_DIR/erun-shards named after its rank, and rank 0 writes the
  // whole entries to CHECKPOINT_DIR/erun-state.bin once every rank's pieces
  // are there. A sync that finds no whole commit in the hosts' memory newer
  // than that file's goes on from it (take_durable, state_shards.cc).
  std::unique_ptr<si::HostCommits> durable;
  int durable_rank = -1;  // the rank `durable`'s files are named after
  // The commit erun-state.bin names (read at each sharded sync, then each
  // commit every rank wrote the pieces of): no rank writes over its pieces.
  uint64_t durable_agreed = 0;
  bool durable_failing = false;
  std::string durable_dir() const { return checkpoint_dir + "/erun-shards"; }
  // This rank's pieces of the commit just made; false when they were not
  // written (said once a streak).
  bool write_durable_pieces(int rank);
  // What the checkpoint directory holds, read by rank 0 and agreed on by
  // every rank: the commit erun-state.bin names (0: none, or unreadable), and
  // the newest commit any pieces file of this State claims, agreed on or not
  // (a crash between the pieces and erun-state.bin leaves one). A commit id is
  // never used again while a file claims it, or that file's pieces would pass
  // for the new commit's.
  struct DurableIds {
    uint64_t agreed = 0;
    uint64_t newest = 0;
  };
  DurableIds durable_ids(Communicator& comm) const;
  // Every rank's rows of commit `id` from the durable files, the whole
  // entries from erun-state.bin. Throws StateLost naming rows no file holds.
  void take_durable(Communicator& comm, uint64_t id);
  // When erun-state.bin names a newer commit than `choice` (the newest the
  // hosts' memory holds whole), the sync goes on from it: taken, kept in host
  // memory in the new layout and pushed to the buddy. False otherwise.
  bool go_on_from_durable(const Context& ctx, Communicator& comm, const si::CommitChoice& choice);
  // take_durable()'s steps: the whole entries, read by rank 0 and broadcast
  // (checked to be commit `id`); one entry's rows `want` of commit `id` from
  // the pieces `files`, into its new storage: 0, or 2 with the rows no file
  // holds added to `lost`, or 1 with why a read failed in `failure`.
  si::Snapshot read_durable_whole(Communicator& comm, uint64_t id) const;
  int64_t read_durable_rows(Entry& e, si::RowRange want, uint64_t id, const std::vector<si::FilePiece>& files,
                            std::string* lost, std::string* failure);
  // After a sync that rewrote the commit in a new layout (a reshard): that
  // commit to the buddy, as after a commit.
  void push_rewritten(const Context& ctx);
  // Joins the push in flight and says how it ended (a failure once a streak).
  void finish_push();
  struct Push {
    std::thread thread;
    Status result = Status::ok();
    uint64_t id = 0;
    std::string who;  // the pusher, for messages
  };
  std::unique_ptr<Push> push;

  // A sharded State's sync() in steps (state_shards.cc, state/shard_sync.h).
  // Where this worker serves its host's files and pushes, and the job's credentials.
  struct Link {
    std::string address;
    std::string job_id;
    std::string secret;
    int replicas = 1;  // 0: no buddy (--commit-replicas 0)
  };
  // What this rank holds, with the server of its host's files started in
  // `server` when other ranks may read them.
  si::Offer offer(const WorkerInfo& info, const Link& link, const std::string& dir, int rejoined_from, int size,
                  Duration timeout, std::unique_ptr<si::ShardServer>* server);
  // Chooses this rank's buddy for the generation.
  void pair_buddy(const si::Holdings& held, int rank, const std::string& stem, const Link& link);
  // The sharded entries' shapes (their rows held: this rank's last).
  std::vector<si::ShardPiece> shard_shapes() const;
  // Each sharded entry's split, in shard_shapes()'s order.
  std::vector<si::SplitRule> shard_rules() const;
  // The committed sharded pieces and their table (the buddy's push, the
  // durable pieces files).
  std::vector<si::EntryRef> shard_refs() const;
  // A sharded entry's new storage, read for rows `want` of commit `id`, installed as its commit.
  void install_rows(Entry& e, si::RowRange want, uint64_t id);
  // The sync goes on from `choice`: StateLost when nothing is whole (on
  // every rank); ids written since are skipped from now on, so that an id
  // never names two commits. `copies_elsewhere`: the job keeps buddy
  // copies (--commit-replicas not 0), which StateLost's advice depends on;
  // `host_files`: the worker has host-memory commit files (ERUN_COMMIT_DIR),
  // without which rows cannot move between ranks (`size`: the new world's).
  void go_on_from(const si::CommitChoice& choice, int rank, int size, bool copies_elsewhere, bool host_files);
  // Every rank takes commit `target`'s whole entries from one root.
  void take_whole(Communicator& comm, const WorkerInfo& info, const si::Holdings& held, uint64_t target);
  // Whether this rank holds exactly its rows of `target` for the world.
  bool holds_its_rows(const si::Holdings& held, uint64_t target, int rank, int size) const;
  // One sharded entry's new rows and where each comes from.
  struct RowsPlan {
    Entry* entry;
    std::vector<si::RowSource> sources;
    std::vector<std::string> files;  // per source, its file (empty: memory)
    si::RowPlan plan;
    si::RowRange want;
  };
  std::vector<RowsPlan> plan_reshard(const si::Holdings& held, uint64_t target, int rank, int size, uint64_t* moved);
  // Reads an entry's new rows into new storage (the old one left as it is).
  void read_rows(RowsPlan& m, const si::Holdings& held, uint64_t target, int my_host, const std::string& dir,
                 const Link& link, Duration timeout);
  // Gives every rank its rows of `target` (collective); whether this one's
  // pieces changed. `moved` adds the bytes read from other hosts.
  // `phase(name)` ends each of its phases (the reading, the agreement).
  bool reshard(Communicator& comm, const si::Holdings& held, uint64_t target, const std::string& dir,
               const Link& link, Duration timeout, std::unique_ptr<si::ShardServer> server, uint64_t* moved,
               const std::function<void(const char*)>& phase);
  std::vector<std::function<void(int, int)>> reset_callbacks;
  // World size before this worker's last re-join, until the next sync (0: none).
  int rejoined_from = 0;
  // World size when the held snapshot was taken (0: unknown, e.g. read from a file).
  int snapshot_size = 0;
  // Set by sync() when some rank re-joined since the last sync: (old size, new size).
  std::optional<std::pair<int, int>> pending_reset;

  // sync() in a world of one: the newest commit this worker or its host holds.
  void sync_alone(const WorkerInfo& info, int rejoined_from);

  // commit() in two steps. stage(): what may throw, before anything changes:
  // user serializers into side buffers (`bytes`, which reuse the commit
  // before the last's allocation) and pieces entries' ranges (`pieces`,
  // alive through `keep`). take_staged(): commit `id` of the world
  // (rank, size) made of them.
  struct Staged {
    std::vector<std::vector<char>> bytes;
    std::vector<std::vector<si::Piece>> pieces;
    std::vector<std::shared_ptr<void>> keep;
  };
  Staged stage();
  // A serializer that may throw, into `out`: staged in `spare` (the commit
  // before the last's allocation) when given, given back should it throw.
  static void save_staged(Entry& e, std::vector<char>& out, std::vector<char>* spare);
  void take_staged(Staged& st, bool direct, uint64_t id, int rank, int size);

  // The ranges, one after another, into `out` (keeping its allocation).
  static void concat(const std::vector<si::Piece>& ranges, std::vector<char>& out);

  // Where an entry's committed bytes lie (its host file, or `committed`).
  static si::EntryRef ref(const Entry& e);
  // The committed whole entries (sync()'s blob, the durable file).
  std::vector<si::EntryRef> refs() const;
  // commit(): each sharded entry's pieces (`gathered`, per entry) are its
  // rows for rank `rank` of `size`; throws erun::Error naming it otherwise.
  void check_shard_sizes(const std::vector<std::vector<si::Piece>>& gathered, int rank, int size);
  // A reader's filter that leaves sharded pieces in the file (they are
  // resharded, never loaded whole); empty without sharded entries.
  si::HostCommits::Keep whole_only() const;
  bool has_shards() const;

  // Entries registered after the last snapshot join it with their current value.
  void fill_uncommitted();

  // Loads `snap` into the registered values and makes it the committed
  // snapshot. `devices_done`: the device entries already hold it (received
  // over NCCL and committed); their bytes in `snap` are size marks.
  void apply(si::Snapshot&& snap, const std::string& source, bool allow_missing, bool devices_done = false);

  // restore(): the committed snapshot back into the registered values.
  void load_values();

  // sync() on its root: the snapshot every rank takes. Nobody committed
  // (newest 0): the root's current values become everyone's baseline.
  // Device entries travel over NCCL (`devices_over_nccl`: their bytes are
  // size marks) or through pinned host memory in the blob.
  // `loaded`: the values hold the commit already (adopt() loaded it).
  std::vector<char> root_blob(uint64_t newest, bool devices_over_nccl, bool loaded);

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
                         bool devices_later = false);
  // write_host_commit()'s steps: what it writes of entry `i` (a committed
  // one); then, each committed entry in turn (`out`, `placed`: theirs), the
  // direct ones' commits as the file's copies (`written`) or, where the
  // write was to copy them, into worker memory (it failed).
  si::EntryRef host_ref(size_t i, bool direct, const std::vector<std::vector<si::Piece>>* gathered,
                        bool devices_later) const;
  void settle_host_copies(bool written, const std::vector<const char*>& placed, const std::vector<si::EntryRef>& out,
                          bool direct, const std::vector<std::vector<si::Piece>>* gathered);

  // In sync(), on the rank whose commit every rank takes: loads the newest
  // whole commit of the directory where adopt_host_commits() found one (the
  // same file, unless it was overwritten or torn since), into the values
  // too. Whether it loaded one.
  bool adopt(const WorkerInfo& info);

  // After sync(): the commit this worker now holds goes into its host's
  // memory too, unless its files hold it already. A worker new to the job
  // (or to this host) so keeps the commit it received before it commits
  // itself: its host holds a copy of the newest commit from the moment it
  // joined, should every other host be lost.
  void keep_in_host_memory(const WorkerInfo& info, bool resharded = false);
  // A reshard without host memory: the new pieces are the commit.
  void keep_shards_in_worker_memory();
  // A sync that found no commit: each rank's pieces are those it made for this world.
  void keep_own_pieces(int rank, int size);

  // A commit's device entries: copied straight into their places in the
  // host file (`placed`, one per committed entry), which is whole once every
  // copy landed; or, when the host-memory write failed (null), into their
  // own pinned memory.
  void land_devices(const std::vector<const char*>* placed, const std::shared_ptr<si::Completion>& landed);
  void fence_devices();
  // Whether every copy finished.
  bool fence_devices_quietly() noexcept;
  // Device copies land in host-memory commit files: those files' mappings
  // are registered with CUDA.
  void pin_for_devices();

  // Brings device entries' `committed` up to their pinned commit before refs() is encoded.
  void mirror_device();
  // After encoding or loading: the pinned commit is the only host copy kept.
  void drop_device_mirrors();

  // Sync over NCCL. The root's blob carries, for each device entry, its size
  // (8 bytes) instead of its bytes; the buffers themselves go device to
  // device, in the blob's order, on each buffer's stream.
  void mark_device_sizes();
  void send_devices(GpuCommunicator& gpu, int root);
  // A receiver: every device entry of `snap` checked against this worker's,
  // received, and committed only when all arrived (a failure leaves the last
  // commit as it was, for restore()).
  void receive_devices(const si::Snapshot& snap, const std::string& source, GpuCommunicator& gpu, int root);
  bool has_device_entries() const;
};

}  // namespace erun
