// The kinds of a State's entries (State::Impl::Entry::kind): what only one
// kind of entry has lives in its alternative, what every entry has (its
// name, save and load, its commit in worker memory) in the Entry. Code that
// behaves per kind visits the variant or asks Entry's named predicates.
// Not for other libraries.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <variant>
#include <vector>

#include "erun/state.hpp"
#include "state/device_state.h"
#include "state/reshard_plan.h"

namespace erun::state_internal {

// std::visit with one lambda per kind.
template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;

// Where a direct entry's commit lies in its host-memory commit file; none
// (null): in the entry's `committed`.
struct HostCopy {
  const char* data = nullptr;
  size_t bytes = 0;
  bool in_file() const { return data != nullptr; }
};

// register_value, register_vector, register_string: a save() that cannot
// throw, run when the commit is taken.
struct ValueKind {};

// register_object (a user serializer): save() may throw, so commit() runs it
// first, into a side buffer that becomes the commit.
struct ObjectKind {};

// register_bytes: as ObjectKind, staged into the previous commit's
// allocation (`spare`, one more copy of memory, fewer page faults).
struct BytesKind {
  std::vector<char> spare;
};

// register_buffer: its own memory. With host-memory commits a commit copies
// it straight into the host file, and `held` points at the copy there (one
// copy per commit).
struct BufferKind {
  char* data = nullptr;
  size_t bytes = 0;
  HostCopy held;
};

// register_pieces: the ranges of its bytes, named anew at each commit, which
// copies them straight into the host file too.
struct PiecesKind {
  std::function<State::Pieces()> gather;
  std::function<void(const char*, size_t)> load_range;
  HostCopy held;
};

// register_shard_bytes: a pieces entry whose bytes are this rank's rows of a
// global array. Its commits go to host memory, and sync() reshards them
// (state_shards.cc), never to the broadcast blob or the durable file.
struct ShardKind {
  PiecesKind pieces;
  uint64_t rows = 0;
  uint64_t row_bytes = 0;
  SplitRule rule = SplitRule::kChunk;
  RowRange held;        // the rows of the piece committed last (and of the storage since a reshard)
  uint64_t commit = 0;  // that commit's id (0: none)
  std::function<void*(uint64_t rows)> prepare;
  std::function<void()> install;
};

// register_device_buffer: its commit lives in the slot's pinned memory (or
// the host file), and the entry's `committed` is a copy made only when the
// bytes are encoded (or a size mark, for a sync over NCCL).
struct DeviceKind {
  std::shared_ptr<DeviceSlot> slot;
};

// The table of the sharded pieces (kShardTable), written with them.
struct ShardTableKind {};

using EntryKind =
    std::variant<ValueKind, ObjectKind, BytesKind, BufferKind, PiecesKind, ShardKind, DeviceKind, ShardTableKind>;

}  // namespace erun::state_internal
