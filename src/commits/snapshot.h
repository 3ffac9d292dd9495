// The byte form of a committed snapshot, shared by sync() (broadcast from the
// root) and durable commits (DIR/erun-state.bin). Layout, little-endian:
//   "ERUNSTAT" | u32 version | u32 flags (0) | u64 commit id | u64 entry count |
//   per entry: u64 name length, name, u64 data length, data | u32 CRC-32C of all before.
// decode() throws erun::Error naming `source` on any malformed input; it never
// reads outside the given bytes. Pure functions, callable from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace erun::state_internal {

inline constexpr char kMagic[8] = {'E', 'R', 'U', 'N', 'S', 'T', 'A', 'T'};
inline constexpr uint32_t kVersion = 1;
inline constexpr const char* kStateFile = "erun-state.bin";
// The entry of a commit that lists its sharded pieces (state/shard_exchange.h):
// a file with it holds some rows of a sharded State, not all.
inline constexpr const char* kShardTable = "erun.shards";

uint32_t crc32c(uint32_t crc, const void* data, size_t n);

class ByteSink {
 public:
  virtual ~ByteSink() = default;
  virtual void write(const void* data, size_t n) = 0;
};

// Gathers small writes (names, lengths) into one buffer and passes large
// pieces straight to put(): file sinks write each byte once, without an
// intermediate copy of the data. Call flush() at the end.
class BufferedSink : public ByteSink {
 public:
  explicit BufferedSink(size_t buffer) : cap_(buffer) { buf_.reserve(buffer); }
  void write(const void* data, size_t n) final;
  void flush();

 protected:
  virtual void put(const char* p, size_t n) = 0;

 private:
  size_t cap_;
  std::vector<char> buf_;
};

// An entry's name and bytes, wherever the bytes lie (a vector, a registered
// buffer, a host-memory commit file's mapping), in one range or, with
// `pieces`, in several that follow each other (`data` unused, `size` their sum).
using Piece = std::pair<const void*, size_t>;
struct EntryRef {
  const std::string* name;
  const char* data;
  size_t size;
  const std::vector<Piece>* pieces = nullptr;
  // Filled after the write by someone else (a device copy): HostCommits
  // lays out its `size` bytes but copies nothing (encode() never gets one).
  bool later = false;
  static EntryRef of(const std::string& name, const std::vector<char>& bytes) {
    return {&name, bytes.data(), bytes.size()};
  }
  static EntryRef of(const std::string& name, const std::vector<Piece>& pieces) {
    size_t n = 0;
    for (const Piece& p : pieces) n += p.second;
    return {&name, nullptr, n, &pieces};
  }
  static EntryRef filled_later(const std::string& name, size_t size) {
    return {&name, nullptr, size, nullptr, true};
  }
  // Calls fn(data, size) for each non-empty range, in order.
  template <typename Fn>
  void each_range(Fn&& fn) const {
    if (pieces == nullptr) {
      if (size != 0) fn(data, size);
      return;
    }
    for (const Piece& p : *pieces) {
      if (p.second != 0) fn(static_cast<const char*>(p.first), p.second);
    }
  }
};

// Streams the encoding into `sink` without an intermediate copy of the data.
void encode(uint64_t commit_id, const std::vector<EntryRef>& entries, ByteSink& sink);
std::vector<char> encode(uint64_t commit_id, const std::vector<EntryRef>& entries);

struct Snapshot {
  uint64_t commit_id = 0;
  std::vector<std::pair<std::string, std::vector<char>>> entries;
};
Snapshot decode(const char* data, size_t size, const std::string& source);

// Writes DIR/name atomically: a new DIR/.name.tmp.<pid>.<random> (O_EXCL,
// O_NOFOLLOW, 0600), fsync, rename (which replaces a link at DIR/name rather
// than following it), fsync DIR. Throws erun::Error naming the path on any I/O
// failure (the old file stays) and when DIR is not a private directory (see
// common/private_files.h).
void write_file_atomically(const std::string& dir, const std::string& name, uint64_t commit_id,
                           const std::vector<EntryRef>& entries);
// The commit id the header of the durable file at `path` claims (its data
// unread and unchecked); 0 when there is none, it is a link or not erun's.
uint64_t file_commit_id(const std::string& path);
// The whole file; false when it does not exist. Throws erun::Error on other
// failures, and when the path is a symbolic link or not a regular file owned
// by this user.
bool read_file(const std::string& path, std::vector<char>* out);
// Removes DIR/.name.tmp.* left by crashed writers other than this process.
void remove_stale_temp_files(const std::string& dir, const std::string& name);

}  // namespace erun::state_internal
