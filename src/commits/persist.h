// Background persistence: the host side (agent/persister.h) copies the newest
// commit that the job's rank 0 left in this host's memory into
// --checkpoint-dir, so that no worker writes to disk while it trains
// (docs/state.md, "Durable commits"). Any thread; no state.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace erun::state_internal {

struct Persisted {
  uint64_t id = 0;     // the commit written; 0: none
  std::string from;    // the host-memory file it came from
  bool raced = false;  // its writer began to overwrite it meanwhile: try again
};

// Writes the newest commit that a file of `commit_dir` holds whole, made by
// rank 0 for the worker's first State, to `checkpoint_dir`/erun-state.bin (the
// durable format, atomically, as State::commit() does) when it is newer than
// `after` and than what that file already holds. The commit is copied into
// `scratch` (kept by the caller between calls) and checked to be still whole
// before a byte goes to disk: a copy that its worker began to overwrite is
// dropped (raced). Throws erun::Error naming the file on I/O failure.
Persisted persist_newest(const std::string& commit_dir, const std::string& checkpoint_dir, uint64_t after,
                         std::vector<char>* scratch);

}  // namespace erun::state_internal
