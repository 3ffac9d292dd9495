#include "state/shard_sync.h"

#include <algorithm>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "commits/commit_files.h"
#include "common/codec.h"
#include "erun/errors.hpp"

namespace erun::state_internal {


std::string encode_offer(const Offer& o) {
  PayloadWriter w;
  w.bytes(o.host).bytes(o.address).u32(static_cast<uint32_t>(o.port)).u32(static_cast<uint32_t>(o.buddy_port));
  w.u64(o.memory_id).u64(o.snapshot_size).u64(o.rejoined_from);
  w.u32(static_cast<uint32_t>(o.whole.size()));
  for (uint64_t id : o.whole) w.u64(id);
  w.bytes(encode_shard_table(o.memory));
  w.u32(static_cast<uint32_t>(o.files.size()));
  for (const FilePiece& f : o.files) {
    w.bytes(f.file).u64(f.id).u64(f.offset).bytes(encode_shard_table({f.piece}));
  }
  w.bytes(o.stem);
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
  o.memory = decode_shard_table(memory.data(), memory.size(), source);
  const uint32_t n = r.u32();
  for (uint32_t i = 0; i < n && !r.failed(); ++i) {
    FilePiece f;
    f.file = r.bytes();
    f.id = r.u64();
    f.offset = r.u64();
    const std::string table = r.bytes();
    auto pieces = decode_shard_table(table.data(), table.size(), source);
    if (pieces.size() != 1) break;
    f.piece = std::move(pieces.front());
    o.files.push_back(std::move(f));
  }
  o.stem = r.bytes();
  if (!r.done() || o.files.size() != n || o.whole.size() != ids) {
    throw Error(fmt::format("erun: {} is malformed", source));
  }
  return o;
}

Holdings::Holdings(std::vector<Offer> all) : offers(std::move(all)) {
  std::map<std::string, int> index;
  for (const Offer& o : offers) host_of.push_back(index.emplace(o.host, static_cast<int>(index.size())).first->second);
  // Each host's files are offered once, by its lowest rank that found some
  // and serves them to other hosts; by its lowest that found some when none
  // serves (its own host's ranks read them still).
  std::vector<int> by(index.size(), -1);
  for (size_t r = 0; r < offers.size(); ++r) {
    const Offer& o = offers[r];
    int& chosen = by[static_cast<size_t>(host_of[r])];
    if (o.files.empty()) continue;
    if (chosen < 0 || (offers[static_cast<size_t>(chosen)].port == 0 && o.port != 0)) chosen = static_cast<int>(r);
  }
  publishes.assign(offers.size(), false);
  for (int r : by) {
    if (r >= 0) publishes[static_cast<size_t>(r)] = true;
  }
}

void Holdings::sources(const ShardPiece& e, uint64_t id, std::vector<RowSource>* out,
                       std::vector<std::string>* files) const {
  // A copy of `p`'s rows on rank r (its memory when `file` is empty).
  auto add = [&](size_t r, const ShardPiece& p, const std::string& where, const std::string& file, uint64_t offset) {
    if (p.rows != e.rows || p.row_bytes != e.row_bytes) {
      throw Error(fmt::format("erun: sharded entry '{}' has {} rows of {} bytes here, but {} holds a piece of {} "
                              "rows of {} bytes; register it with the same shape on every worker",
                              e.name, e.rows, e.row_bytes, where, p.rows, p.row_bytes));
    }
    RowSource s;
    s.rows = p.held;
    s.host = host_of[r];
    s.server = static_cast<int>(r);
    s.memory = file.empty();
    s.offset = offset;
    out->push_back(s);
    files->push_back(file);
  };
  for (size_t r = 0; r < offers.size(); ++r) {
    const Offer& o = offers[r];
    for (const ShardPiece& p : o.memory) {
      if (o.memory_id == id && p.name == e.name) add(r, p, fmt::format("rank {}'s commit {}", r, id), "", 0);
    }
    if (!publishes[r]) continue;
    for (const FilePiece& f : o.files) {
      if (f.id == id && f.piece.name == e.name) {
        add(r, f.piece, fmt::format("file {} of host {}", f.file, o.host), f.file, f.offset);
      }
    }
  }
}

namespace {

// The rows of `rows` that none of `copies` holds, in order.
std::vector<RowRange> uncovered(uint64_t rows, std::vector<RowSource> copies) {
  std::sort(copies.begin(), copies.end(), [](const auto& a, const auto& b) { return a.rows.begin < b.rows.begin; });
  std::vector<RowRange> out;
  uint64_t at = 0;
  for (const RowSource& c : copies) {
    if (c.rows.size() == 0) continue;
    if (c.rows.begin > at) out.push_back({at, c.rows.begin});
    at = std::max(at, c.rows.end);
  }
  if (at < rows) out.push_back({at, rows});
  return out;
}

}  // namespace

std::vector<RowRange> Holdings::holes(const ShardPiece& e, uint64_t id, std::optional<SplitRule> rule) const {
  std::vector<RowSource> s;
  std::vector<std::string> files;
  sources(e, id, &s, &files);
  if (!rule) return uncovered(e.rows, std::move(s));
  // What the files leave out, each part then looked for in the memory of
  // the rank that keeps it in the new world.
  std::vector<RowSource> in_files, in_memory;
  for (const RowSource& c : s) (c.memory ? in_memory : in_files).push_back(c);
  const int size = static_cast<int>(offers.size());
  std::vector<RowRange> out;
  for (const RowRange& hole : uncovered(e.rows, std::move(in_files))) {
    for (int r = 0; r < size; ++r) {
      const RowRange mine = split_rows(e.rows, *rule, r, size);
      const RowRange part{std::max(mine.begin, hole.begin), std::min(mine.end, hole.end)};
      if (part.begin >= part.end) continue;
      std::vector<RowSource> own;  // rank r's memory within `part`, counted from part.begin
      for (const RowSource& c : in_memory) {
        const uint64_t b = std::max(c.rows.begin, part.begin), end = std::min(c.rows.end, part.end);
        if (c.server == r && b < end) own.push_back(RowSource{{b - part.begin, end - part.begin}});
      }
      for (const RowRange& left : uncovered(part.size(), std::move(own))) {
        out.push_back({part.begin + left.begin, part.begin + left.end});
      }
    }
  }
  // Adjacent parts as one range.
  std::vector<RowRange> merged;
  for (const RowRange& r : out) {
    if (!merged.empty() && merged.back().end == r.begin) merged.back().end = r.end;
    else merged.push_back(r);
  }
  return merged;
}
std::string rows_text(const std::vector<RowRange>& ranges) {
  std::string out;
  for (const RowRange& r : ranges) {
    out += fmt::format("{}{}", out.empty() ? "" : ", ",
                       r.size() == 1 ? fmt::format("row {}", r.begin) : fmt::format("rows {}..{}", r.begin, r.end - 1));
  }
  return out;
}

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

std::set<std::string> pairs_to_keep(const Holdings& held, int host) {
  std::set<std::string> keep;
  for (size_t r = 0; r < held.offers.size(); ++r) {
    const std::string& stem = held.offers[r].stem;
    if (stem.empty()) continue;
    if (held.host_of[r] == host) keep.insert(stem);
    const int b = choose_buddy(held, static_cast<int>(r));
    if (b >= 0 && held.host_of[static_cast<size_t>(b)] == host) keep.insert(kBuddyPrefix + stem);
  }
  return keep;
}

CommitChoice choose_commit(const Holdings& held, const std::vector<ShardPiece>& entries,
                           const std::vector<SplitRule>& rules) {
  CommitChoice c;
  std::set<uint64_t, std::greater<>> ids;
  for (const Offer& o : held.offers) {
    ids.insert(o.whole.begin(), o.whole.end());
    for (const FilePiece& f : o.files) c.seen = std::max(c.seen, f.id);
    c.any_rejoin = std::max(c.any_rejoin, o.rejoined_from);
  }
  if (ids.empty()) return c;
  c.newest = *ids.begin();
  c.seen = std::max(c.seen, c.newest);
  auto lost_at = [&](uint64_t id) {
    std::vector<std::string> lost;
    for (size_t k = 0; k < entries.size(); ++k) {
      const ShardPiece& e = entries[k];
      auto holes = held.holes(e, id, k < rules.size() ? std::optional<SplitRule>(rules[k]) : std::nullopt);
      if (!holes.empty()) lost.push_back(fmt::format("'{}' {} of {}", e.name, rows_text(holes), e.rows));
    }
    return fmt::format("{}", fmt::join(lost, "; "));
  };
  c.lost = lost_at(c.newest);
  if (c.lost.empty()) {
    c.target = c.newest;
    return c;
  }
  for (auto it = std::next(ids.begin()); it != ids.end(); ++it) {
    if (lost_at(*it).empty()) {
      c.target = *it;
      break;
    }
  }
  return c;
}

}  // namespace erun::state_internal
