// Elastic training state. Values are registered by name and pointer; the State
// never owns them. commit() takes a deep copy of every registered value (and
// writes it durably when a checkpoint directory is set), then checks for host
// updates; restore() copies the last commit back; sync() makes every rank hold
// the newest commit of any rank (the lowest rank among those with the highest
// commit id is the root) and writes it into the registered values; when no
// rank has committed, rank 0's current values are spread instead and kept as
// everyone's baseline snapshot (restore() returns to it; commit_id stays 0).
//
// Collective calls (commit, sync, check_host_updates) must be made by all ranks
// at the same step; commit() and check_host_updates() throw CollectiveMismatch
// on every rank when the ranks are at different commit ids. Used from the
// training thread only.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "erun/export.hpp"
#include "erun/gpu.hpp"

namespace erun {

class Context;

// How a user type becomes bytes and back. Give one to register_object().
template <typename T>
struct Serializer {
  std::function<std::vector<char>(const T&)> save;
  std::function<void(T&, const std::vector<char>&)> load;
};

class ERUN_API State {
 public:
  explicit State(Context& ctx);
  ~State();
  State(const State&) = delete;
  State& operator=(const State&) = delete;

  // Trivially copyable values (int, double, a POD struct).
  template <typename T>
  void register_value(const std::string& name, T* value) {
    static_assert(std::is_trivially_copyable_v<T>, "use register_object with a Serializer");
    register_entry(name, [value](std::vector<char>& b) {
      b.resize(sizeof(T));
      std::memcpy(b.data(), value, sizeof(T));
    }, [value, name](const std::vector<char>& b) {
      check_size(name, b.size(), sizeof(T));
      std::memcpy(value, b.data(), sizeof(T));
    });
  }
  // std::vector of trivially copyable elements; restore() resizes it.
  template <typename T>
  void register_vector(const std::string& name, std::vector<T>* v) {
    static_assert(std::is_trivially_copyable_v<T>);
    register_entry(name, [v](std::vector<char>& b) {
      b.resize(v->size() * sizeof(T));
      if (!b.empty()) std::memcpy(b.data(), v->data(), b.size());
    }, [v, name](const std::vector<char>& b) {
      check_multiple(name, b.size(), sizeof(T));
      v->resize(b.size() / sizeof(T));
      if (!b.empty()) std::memcpy(v->data(), b.data(), b.size());
    });
  }
  void register_string(const std::string& name, std::string* s);
  // A fixed-size raw buffer (e.g. model parameters in one allocation).
  void register_buffer(const std::string& name, void* data, size_t bytes);
  // A CUDA device buffer (cudaMalloc'd, on any device). commit() copies it into
  // pinned host memory, never into a second device buffer; restore() copies it
  // back; sync() spreads the newest commit through host memory. The copies run
  // on `stream` (nullptr: the legacy default stream), so work enqueued there
  // before commit() is captured. With `async`, commit() returns at once: the
  // copy runs on a side stream, `stream` waits for it before its later work
  // (write the buffer only through `stream`), and the next commit, restore or
  // sync waits for it. Throws erun::Error without CUDA or when the pointer is
  // not device memory. See docs/gpu.md.
  struct DeviceBufferOptions {
    GpuStream stream = nullptr;
    bool async = false;
  };
  void register_device_buffer(const std::string& name, void* device_ptr, size_t bytes,
                              DeviceBufferOptions options);
  void register_device_buffer(const std::string& name, void* device_ptr, size_t bytes) {
    register_device_buffer(name, device_ptr, bytes, DeviceBufferOptions{});
  }
  template <typename T>
  void register_object(const std::string& name, T* obj, Serializer<T> ser) {
    register_entry(name, [obj, ser](std::vector<char>& b) { b = ser.save(*obj); },
                   [obj, ser](const std::vector<char>& b) { ser.load(*obj, b); },
                   /*may_throw=*/true);
  }

  // Bytes written by `save` into a buffer it is handed (resize + copy; the
  // buffer keeps its allocation from commit to commit, so a large entry costs
  // a copy, not a fresh allocation) and read back by `load`. Either may throw:
  // commit() runs `save` into a side buffer first, so a throwing one leaves
  // the previous commit intact. For bindings (the Python package).
  void register_bytes(const std::string& name, std::function<void(std::vector<char>&)> save,
                      std::function<void(const std::vector<char>&)> load);

  // Bytes that stay in the caller's memory: save() names the ranges that,
  // one after another, make the entry, and `keep` holds whatever keeps them
  // alive until commit() has copied them, once, straight into the commit
  // (the host's memory under erun). save() may throw: the previous commit
  // stays. load(data, size) gets the committed bytes and copies what it keeps.
  // For bindings (the Python package's callback entries).
  struct Pieces {
    std::vector<std::pair<const void*, size_t>> ranges;
    std::shared_ptr<void> keep;
  };
  void register_pieces(const std::string& name, std::function<Pieces()> save,
                       std::function<void(const char* data, size_t size)> load);

  // Sharded entries (docs/state.md, "Sharded entries"): this rank's piece of
  // a global array of `rows` rows (dimension 0) of `row_elems` elements,
  // split over the ranks by `split`: kChunk as torch.chunk and FSDP2's
  // Shard(0) split (ceil(rows / size) rows each, so the last pieces may be
  // short or empty), kEven as even as can be (the first rows % size ranks
  // one more row). A commit keeps each rank's piece (in its host's memory
  // under erun); when the world changes, sync() gives each rank of the new
  // generation exactly its new rows, read from the pieces its host holds
  // and, over erun's authenticated TCP, from the other hosts', the pieces of
  // workers that died included, so no rank ever holds the whole array. The
  // vector's size must be its rows times row_elems whenever the State
  // commits; sync() resizes it. Rows that no living host holds are an
  // erun::Error naming them.
  enum class ShardSplit { kChunk, kEven };
  struct ShardSpec {
    uint64_t rows = 0;
    uint64_t row_elems = 1;
    ShardSplit split = ShardSplit::kChunk;
  };
  // The rows [first, second) that rank `rank` of `size` holds under `spec`.
  static std::pair<uint64_t, uint64_t> shard_rows(const ShardSpec& spec, int rank, int size);
  template <typename T>
  void register_shard(const std::string& name, std::vector<T>* local, ShardSpec spec) {
    static_assert(std::is_trivially_copyable_v<T>);
    auto next = std::make_shared<std::vector<T>>();
    const uint64_t row_elems = spec.row_elems;
    ShardStorage s;
    s.save = [local] {
      Pieces p;
      p.ranges.emplace_back(local->data(), local->size() * sizeof(T));
      return p;
    };
    s.load = [local, name](const char* data, size_t bytes) {
      check_multiple(name, bytes, sizeof(T));
      local->resize(bytes / sizeof(T));
      if (bytes != 0) std::memcpy(local->data(), data, bytes);
    };
    s.prepare = [next, row_elems](uint64_t rows) -> void* {
      next->resize(static_cast<size_t>(rows * row_elems));
      return next->data();
    };
    s.install = [local, next] {
      local->swap(*next);
      std::vector<T>().swap(*next);
    };
    register_shard_bytes(name, ShardSpec{spec.rows, row_elems * sizeof(T), spec.split}, std::move(s));
  }
  // For bindings: a sharded entry kept in the caller's storage. save() names
  // the bytes of this rank's piece (as register_pieces' does); load() puts a
  // committed piece of the current layout back; a reshard calls prepare(rows)
  // for new storage of that many rows, fills it, then install() makes it the
  // piece (the old one stays readable until then). `spec.row_elems` counts
  // bytes here.
  struct ShardStorage {
    std::function<Pieces()> save;
    std::function<void(const char* data, size_t size)> load;
    std::function<void*(uint64_t rows)> prepare;
    std::function<void()> install;
  };
  void register_shard_bytes(const std::string& name, ShardSpec spec_in_bytes, ShardStorage storage);

  void commit();
  void restore();
  void sync();
  // Collective: throws HostsUpdated on every rank when any rank saw a pending update.
  void check_host_updates();

  // Monotonic id of the last commit (0: nothing committed yet).
  uint64_t commit_id() const;
  // Durable commits; call after registering every entry. Rank 0 writes each
  // commit to DIR/erun-state.bin atomically (temp file, fsync, rename, fsync
  // DIR). A valid file already there becomes the committed snapshot, with its
  // commit id, and is loaded into the values. DIR is created 0700 when
  // missing; one owned by another user or writable by others (without the
  // sticky bit) is refused. Throws erun::Error when the directory is refused,
  // the file is corrupt, a link, does not match the registered entries, or
  // cannot be written.
  void set_checkpoint_dir(const std::string& dir);
  // Called by erun::run() after the sync() that follows a re-join, on every
  // rank of the new generation (survivors and workers new to the job alike),
  // so a value set here is not overwritten by the synced one. old_size: the
  // world size at which the synced state was committed (the size before the
  // re-join when that is unknown); new_size: the current one.
  void on_reset(std::function<void(int old_size, int new_size)> callback);
  // Runs the reset callbacks.
  void notify_reset(int old_size, int new_size);
  // For erun::run(): this worker re-joined, leaving a world of old_size.
  void note_rejoin(int old_size);
  // For erun::run(), after sync(): runs the reset callbacks when that sync
  // found that some rank re-joined since the previous one.
  void run_pending_reset();

  Context& context() { return ctx_; }

 private:
  // SaveFn writes the value into `out`, reusing its allocation when the size
  // is unchanged, so that a commit of a large buffer costs one memcpy.
  using SaveFn = std::function<void(std::vector<char>& out)>;
  using LoadFn = std::function<void(const std::vector<char>&)>;
  // may_throw: a user Serializer; commit() runs those first, into a side
  // buffer, so that a throwing one leaves the previous commit intact.
  void register_entry(const std::string& name, SaveFn save, LoadFn load, bool may_throw = false);
  static void check_size(const std::string& name, size_t got, size_t want);
  static void check_multiple(const std::string& name, size_t got, size_t unit);
  // Collective, after the ranks found different commit ids: throws
  // CollectiveMismatch on every rank, naming the ranks and their ids.
  [[noreturn]] void commit_ids_disagree();
  // At the first sync(): opens this worker's host-memory commit files and
  // loads the newest commit its host holds when that is newer than its own.
  void adopt_host_commits();
  // sync() of a State with sharded entries (state_shards.cc): the ranks
  // agree on the newest commit that the job holds whole, every rank takes
  // its whole entries, and each gets its rows of the sharded ones.
  void sync_sharded(int rejoined_from);

  Context& ctx_;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Runs fn(state) to completion across membership changes: sync() first; on
// CommError restore() and re-join; on HostsUpdated re-join without restoring;
// then sync() again and call fn again. Returns what fn returns.
template <typename Fn>
auto run(State& state, Fn&& fn) -> decltype(fn(state));

// The partition of an epoch's sample indices across a changing world. It
// shuffles 0..n-1 per epoch with a seed, skips the samples already processed
// this epoch (recorded through record_batch and kept in the State when
// registered), and splits the rest evenly over the current ranks, so every
// sample of an epoch is processed exactly once across resizes and failures.
class ERUN_API ElasticSampler {
 public:
  ElasticSampler(size_t num_samples, uint64_t seed, bool shuffle = true);
  // Registers its position (epoch, processed count) in a State.
  void register_with(State& state, const std::string& name = "erun.sampler");
  // Recomputes this rank's share for the current world; call after every (re)join.
  void reset(int rank, int size);
  // Starts epoch `epoch` from its first sample. Calling it with the current
  // epoch keeps the progress, so a loop re-entered after a restore resumes
  // mid-epoch.
  void set_epoch(uint64_t epoch);
  uint64_t epoch() const { return epoch_; }
  // This rank's remaining indices for the epoch, in order.
  const std::vector<size_t>& indices() const { return mine_; }
  // This rank's share of the next `global_batch` samples of the epoch: the
  // remaining-list positions p < global_batch with p % size == rank (fewer at
  // the end of the epoch). The union over ranks is exactly the next
  // min(global_batch, remaining()) samples.
  std::vector<size_t> next_batch(size_t global_batch) const;
  // Marks the next `global_batch` samples of the epoch as processed by all ranks
  // together (each rank took its next_batch(global_batch)).
  void record_batch(size_t global_batch);
  // Samples of this epoch not yet processed (by anyone).
  size_t remaining() const;
  size_t processed() const { return processed_; }

 private:
  size_t n_;
  uint64_t seed_;
  bool shuffle_;
  uint64_t epoch_ = 0;
  size_t processed_ = 0;
  int rank_ = 0, size_ = 1;
  std::vector<size_t> perm_;  // the epoch's order of 0..n-1
  std::vector<size_t> mine_;
  void reshuffle();
  void recompute();
};

}  // namespace erun

#include "erun/run_impl.hpp"
