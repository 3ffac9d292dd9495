#include "state/shard_exchange.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>

#include <fmt/format.h>

#include "commits/commit_files.h"
#include "commits/host_commits.h"
#include "common/codec.h"
#include "common/handshake.h"
#include "common/log.h"
#include "common/net.h"
#include "erun/errors.hpp"

namespace erun::state_internal {
namespace {

constexpr char kShardMagic[8] = {'E', 'R', 'U', 'N', 'S', 'H', 'R', 'D'};
constexpr handshake::Scheme kScheme{"erun-shard-reader", "erun-shard-server", handshake::Scheme::Layout::kNoncesLast};
// (ERUNBUDY before the commit to keep was sent: such a pusher is refused.)
constexpr char kBuddyMagic[8] = {'E', 'R', 'U', 'N', 'B', 'U', 'D', '2'};
constexpr handshake::Scheme kBuddyScheme{"erun-buddy-pusher", "erun-buddy-keeper",
                                         handshake::Scheme::Layout::kNoncesLast};
constexpr uint32_t kMaxEntries = 1u << 16;
constexpr uint32_t kMaxRanges = 1u << 20;
constexpr size_t kChunk = 4u << 20;  // bytes per send or receive, each within the I/O bound
constexpr Duration kHandshakeTime = std::chrono::seconds(5);
// The pushes a buddy keeper takes at the same time.
constexpr int kPushesAtOnce = 8;
// The readers a shard server answers at the same time.
constexpr int kReadersAtOnce = 8;

handshake::Proofs proofs(const std::string& job_id, const std::string& secret,
                         const handshake::Scheme& scheme = kScheme) {
  return handshake::Proofs(std::make_shared<handshake::Key>(secret), scheme, job_id);
}

// The initiator's half of the handshake on a connected socket: sends the
// magic and a nonce, checks the responder's proof, sends its own.
Status initiate(int fd, const char (&magic)[8], const handshake::Proofs& p, Duration timeout) {
  auto step = [&] { return std::chrono::steady_clock::now() + timeout; };
  const std::string mine = handshake::random_bytes(handshake::kNonceBytes);
  if (auto o = net::send_all(fd, std::string(magic, sizeof(magic)) + mine, step()); !o.ok()) {
    return Status::error(o.text());
  }
  std::string reply(handshake::kNonceBytes + handshake::kMacBytes, '\0');
  if (auto o = net::recv_exact(fd, reply.data(), reply.size(), step()); !o.ok()) return Status::error(o.text());
  const std::string theirs = reply.substr(0, handshake::kNonceBytes);
  if (!handshake::equal_ct(reply.substr(handshake::kNonceBytes), p.responder(mine, theirs))) {
    return Status::error("the other side failed the job secret's proof");
  }
  if (auto o = net::send_all(fd, p.initiator(mine, theirs), step()); !o.ok()) return Status::error(o.text());
  return Status::ok();
}

// The responder's half, within `shake`.
Status respond(int fd, const char (&magic)[8], const handshake::Proofs& p, TimePoint shake,
               const net::Interrupt* stop) {
  char hello[8 + handshake::kNonceBytes];
  if (auto o = net::recv_exact(fd, hello, sizeof(hello), shake, stop); !o.ok()) return Status::error(o.text());
  if (std::memcmp(hello, magic, 8) != 0) return Status::error("not erun's protocol here");
  const std::string theirs(hello + 8, handshake::kNonceBytes);
  const std::string mine = handshake::random_bytes(handshake::kNonceBytes);
  if (auto o = net::send_all(fd, mine + p.responder(theirs, mine), shake, stop); !o.ok()) {
    return Status::error(o.text());
  }
  std::string proof(handshake::kMacBytes, '\0');
  if (auto o = net::recv_exact(fd, proof.data(), proof.size(), shake, stop); !o.ok()) return Status::error(o.text());
  if (!handshake::equal_ct(proof, p.initiator(theirs, mine))) return Status::error("failed the job secret's proof");
  return Status::ok();
}

// Sends the refusal `why` (u8 0, u32 length, why) and returns it as the error.
Status refuse(int fd, const std::string& why, TimePoint deadline, const net::Interrupt* stop) {
  char len[4];
  put_le(len, why.size(), 4);
  (void)net::send_all(fd, std::string(1, '\0') + std::string(len, 4) + why, deadline, stop);
  return Status::error(why);
}

// Reads a verdict (u8 1, or u8 0 and why); the refusal as an error.
Status verdict(int fd, TimePoint deadline) {
  char ok = 0;
  if (auto o = net::recv_exact(fd, &ok, 1, deadline); !o.ok()) return Status::error(o.text());
  if (ok == 1) return Status::ok();
  char len[4];
  std::string why = "refused";
  if (net::recv_exact(fd, len, 4, deadline).ok()) {
    why.assign(std::min<uint64_t>(get_le(len, 4), 4096), '\0');
    if (!net::recv_exact(fd, why.data(), why.size(), deadline).ok()) why = "refused";
  }
  return Status::error(why);
}

// A name of the directory itself: no path, no dot files.
bool plain_name(const std::string& name) {
  return !name.empty() && name.size() <= 255 && name.find('/') == std::string::npos && name[0] != '.';
}

}  // namespace

std::string encode_shard_table(const std::vector<ShardPiece>& pieces) {
  PayloadWriter w;
  w.u32(static_cast<uint32_t>(pieces.size()));
  for (const ShardPiece& p : pieces) {
    w.bytes(p.name).u64(p.rows).u64(p.row_bytes).u64(p.held.begin).u64(p.held.end);
  }
  return w.str();
}

std::vector<ShardPiece> decode_shard_table(const char* data, size_t size, const std::string& source) {
  PayloadReader r(std::string_view(data, size));
  const uint32_t n = r.u32();
  std::vector<ShardPiece> out;
  for (uint32_t i = 0; i < n && !r.failed(); ++i) {
    ShardPiece p;
    p.name = r.bytes();
    p.rows = r.u64();
    p.row_bytes = r.u64();
    p.held.begin = r.u64();
    p.held.end = r.u64();
    if (p.held.begin > p.held.end || p.held.end > p.rows) break;
    out.push_back(std::move(p));
  }
  if (!r.done() || out.size() != n) {
    throw Error(fmt::format("erun: {} holds a malformed table of sharded pieces ('{}')", source, kShardTable));
  }
  return out;
}

std::vector<FilePiece> list_pieces(const std::string& dir, int ordinal) {
  std::vector<FilePiece> out;
  for (const ClaimedCommit& c : claimed_commits(dir, /*buddies=*/true)) {
    if (HostCommits::ordinal_of(c.name) != ordinal) continue;
    const uint64_t id = c.id;
    const std::string path = dir + "/" + c.name;
    Fd fd = HostCommits::open_own(path);
    if (!fd) continue;
    auto l = HostCommits::list(fd.get());
    if (!l || l->id != id) continue;
    auto table = std::find(l->names.begin(), l->names.end(), kShardTable);
    if (table == l->names.end()) continue;
    const auto t = static_cast<size_t>(table - l->names.begin());
    if (l->sizes[t] > (64u << 20)) continue;
    std::vector<char> bytes(l->sizes[t]);
    if (!pread_all(fd.get(), bytes.data(), bytes.size(), l->offsets[t])) continue;
    std::vector<ShardPiece> pieces;
    try {
      pieces = decode_shard_table(bytes.data(), bytes.size(), path);
    } catch (const Error& e) {
      ERUN_LOG_WARN("{}; its pieces are not used", e.what());
      continue;
    }
    if (!HostCommits::held(fd.get(), id)) continue;  // overwritten while read
    for (ShardPiece& p : pieces) {
      auto at = std::find(l->names.begin(), l->names.end(), p.name);
      if (at == l->names.end()) continue;
      const auto k = static_cast<size_t>(at - l->names.begin());
      if (l->sizes[k] != p.held.size() * p.row_bytes) continue;
      out.push_back(FilePiece{c.name, id, std::move(p), l->offsets[k]});
    }
  }
  return out;
}

Status read_ranges(const std::string& path, uint64_t id, const std::vector<ByteRange>& ranges) {
  Fd fd = HostCommits::open_own(path);
  if (!fd) return Status::error(fmt::format("cannot open {}: {}", path, std::strerror(errno)));
  if (!HostCommits::held(fd.get(), id)) return Status::error(fmt::format("{} no longer holds commit {}", path, id));
  for (const ByteRange& r : ranges) {
    if (!pread_all(fd.get(), r.out, r.bytes, r.offset)) {
      return Status::error(fmt::format("cannot read {} bytes at {} of {}", r.bytes, r.offset, path));
    }
  }
  if (!HostCommits::held(fd.get(), id)) return Status::error(fmt::format("{} was overwritten while read", path));
  return Status::ok();
}

Status fetch_ranges(const std::string& host, int port, const std::string& job_id, const std::string& secret,
                    const std::string& file, uint64_t id, const std::vector<ByteRange>& ranges, Duration timeout) {
  auto fail = [&](const std::string& what) {
    return Status::error(fmt::format("reading {} from {}:{}: {}", file, host, port, what));
  };
  auto step = [&] { return std::chrono::steady_clock::now() + timeout; };
  auto addrs = net::resolve(host, std::to_string(port));
  if (!addrs.is_ok() || addrs.value().empty()) return fail("cannot resolve the host");
  net::Socket s = net::connect(addrs.value().front(), step());
  if (!s.ok()) return fail(s.outcome.text());
  const int fd = s.fd.get();
  if (Status st = initiate(fd, kShardMagic, proofs(job_id, secret), timeout); !st.is_ok()) return fail(st.message());
  PayloadWriter w;
  w.bytes(file).u64(id).u32(static_cast<uint32_t>(ranges.size()));
  for (const ByteRange& r : ranges) w.u64(r.offset).u64(r.bytes);
  if (auto o = net::send_all(fd, w.str(), step()); !o.ok()) return fail(o.text());
  if (Status st = verdict(fd, step()); !st.is_ok()) return fail(st.message());
  for (const ByteRange& r : ranges) {
    for (uint64_t at = 0; at < r.bytes;) {
      const auto n = static_cast<size_t>(std::min<uint64_t>(kChunk, r.bytes - at));
      if (auto o = net::recv_exact(fd, r.out + at, n, step()); !o.ok()) return fail(o.text());
      at += n;
    }
  }
  char ok = 0;
  if (auto o = net::recv_exact(fd, &ok, 1, step()); !o.ok()) return fail(o.text());
  if (ok != 1) return fail(fmt::format("the file was overwritten while read (commit {})", id));
  return Status::ok();
}

Status push_to_buddy(const std::string& host, int port, const std::string& job_id, const std::string& secret,
                     const std::string& name, uint64_t id, uint64_t keep, const std::vector<EntryRef>& entries,
                     Duration timeout) {
  auto fail = [&](const std::string& what) {
    return Status::error(fmt::format("keeping commit {} on {}:{}: {}", id, host, port, what));
  };
  auto step = [&] { return std::chrono::steady_clock::now() + timeout; };
  auto addrs = net::resolve(host, std::to_string(port));
  if (!addrs.is_ok() || addrs.value().empty()) return fail("cannot resolve the host");
  net::Socket s = net::connect(addrs.value().front(), step());
  if (!s.ok()) return fail(s.outcome.text());
  const int fd = s.fd.get();
  if (Status st = initiate(fd, kBuddyMagic, proofs(job_id, secret, kBuddyScheme), timeout); !st.is_ok()) {
    return fail(st.message());
  }
  PayloadWriter w;
  w.bytes(name).u64(id).u64(keep).u32(static_cast<uint32_t>(entries.size()));
  for (const EntryRef& e : entries) w.bytes(*e.name).u64(e.size);
  if (auto o = net::send_all(fd, w.str(), step()); !o.ok()) return fail(o.text());
  for (const EntryRef& e : entries) {
    Status sent = Status::ok();
    e.each_range([&](const char* p, size_t n) {
      for (size_t at = 0; at < n && sent.is_ok();) {
        const size_t k = std::min(kChunk, n - at);
        if (auto o = net::send_all(fd, std::string_view(p + at, k), step()); !o.ok()) {
          sent = Status::error(o.text());
        }
        at += k;
      }
    });
    if (!sent.is_ok()) return fail(sent.message());
  }
  if (Status st = verdict(fd, step()); !st.is_ok()) return fail(st.message());
  return Status::ok();
}

struct BuddyKeeper::Impl {
  std::string dir;
  handshake::Proofs proofs;
  Duration io_timeout;
  // A buddy file pair, by name. Pushes of other names go on at once (the
  // server answers several); two of one name (a pusher that came back while
  // its last push hangs) take turns.
  struct Pair {
    std::mutex mu;
    std::unique_ptr<HostCommits> commits;  // under mu
  };
  std::mutex pairs_mu;
  // Shared with the push that writes into one, which may outlive its place
  // here (forget_pairs_except).
  std::map<std::string, std::shared_ptr<Pair>> pairs;  // under pairs_mu
  std::optional<std::set<std::string>> only;           // under pairs_mu: the names taken (none: any)
  Impl(std::string d, const std::string& job_id, const std::string& secret, Duration t)
      : dir(std::move(d)), proofs(state_internal::proofs(job_id, secret, kBuddyScheme)), io_timeout(t) {}
  TimePoint step() const { return std::chrono::steady_clock::now() + io_timeout; }

  // A pushed commit's header: the buddy file's name, the commit's id and its
  // entry table (`entries` name the strings of `names`).
  struct Offer {
    std::string name;
    uint64_t id = 0;
    uint64_t keep = 0;  // the commit the push must not write over
    std::vector<std::string> names;
    std::vector<EntryRef> entries;
  };

  bool read_u32(int fd, const net::Interrupt* stop, uint32_t* v) const {
    char b[4];
    if (auto o = net::recv_exact(fd, b, 4, step(), stop); !o.ok()) return false;
    *v = static_cast<uint32_t>(get_le(b, 4));
    return true;
  }

  // A u32 length, then that many bytes (at most `max`).
  bool read_string(int fd, const net::Interrupt* stop, std::string* out, uint32_t max) const {
    uint32_t n = 0;
    if (!read_u32(fd, stop, &n) || n > max) return false;
    out->assign(n, '\0');
    return net::recv_exact(fd, out->data(), n, step(), stop).ok();
  }

  // Reads the offer that follows the handshake; one this keeper does not take
  // (too large, not a buddy file's name) is refused to the pusher.
  Status read_offer(int fd, const net::Interrupt* stop, Offer& offer) const {
    if (!read_string(fd, stop, &offer.name, 255)) return Status::error("a malformed header");
    char head[20];
    if (auto o = net::recv_exact(fd, head, sizeof head, step(), stop); !o.ok()) return Status::error(o.text());
    offer.id = get_le(head, 8);
    offer.keep = get_le(head + 8, 8);
    const auto count = static_cast<uint32_t>(get_le(head + 16, 4));
    if (count > kMaxEntries) return refuse(fd, fmt::format("{} entries, more than {}", count, kMaxEntries), step(), stop);
    offer.names.resize(count);
    uint64_t total = 0;
    for (uint32_t i = 0; i < count; ++i) {
      char size[8];
      if (!read_string(fd, stop, &offer.names[i], 4096) || !net::recv_exact(fd, size, 8, step(), stop).ok()) {
        return Status::error("a malformed entry table");
      }
      const uint64_t n = get_le(size, 8);
      if (n > (uint64_t{1} << 48) || total + n > (uint64_t{1} << 48)) return refuse(fd, "more than 2^48 bytes", step(), stop);
      total += n;
      offer.entries.push_back(EntryRef::filled_later(offer.names[i], static_cast<size_t>(n)));
    }
    const std::string& name = offer.name;
    if (offer.id == 0 || !plain_name(name) || name.rfind(kBuddyPrefix, 0) != 0 ||
        HostCommits::ordinal_of(name + ".a") < 0) {
      return refuse(fd, fmt::format("'{}' is not a buddy file name", name), step(), stop);
    }
    return Status::ok();
  }

  // Lays the offered commit out in its buddy file and receives its bytes
  // straight into it; a commit cut short stays torn.
  Status receive(int fd, const net::Interrupt* stop, const Offer& offer) {
    std::shared_ptr<Pair> entry;
    {
      std::lock_guard<std::mutex> lock(pairs_mu);
      if (only && only->count(offer.name) == 0) {
        return refuse(fd, fmt::format("'{}' is no longer kept here: its pusher's generation is over", offer.name),
                      step(), stop);
      }
      auto& p = pairs[offer.name];
      if (!p) p = std::make_shared<Pair>();
      entry = p;
    }
    std::lock_guard<std::mutex> turn(entry->mu);
    auto& pair = entry->commits;
    if (!pair) pair = std::make_unique<HostCommits>(dir + "/" + offer.name);
    // Another worker of this host may have kept this pusher's copies since
    // (the pairs change at each generation): write over the older commit the
    // files hold now, never over the newest one this keeper did not write,
    // nor over the commit the pusher goes on from (after going back to an
    // older commit, the newer one it abandoned goes first).
    pair->forget_writes();
    pair->keep_commit(offer.keep);
    std::vector<const char*> placed;
    std::shared_ptr<Completion> landed;
    std::optional<std::string> err;
    try {
      err = pair->write(offer.id, offer.entries, &placed, 0, &landed);
    } catch (const Error& e) {
      err = e.what();
    }
    if (err) return refuse(fd, *err, step(), stop);
    for (size_t k = 0; k < offer.entries.size(); ++k) {
      char* to = const_cast<char*>(placed[k]);
      for (uint64_t at = 0; at < offer.entries[k].size;) {
        const auto n = static_cast<size_t>(std::min<uint64_t>(kChunk, offer.entries[k].size - at));
        if (auto o = net::recv_exact(fd, to + at, n, step(), stop); !o.ok()) {
          pair->abandon();
          return Status::error(o.text());
        }
        at += n;
      }
      landed->done();
    }
    return Status::ok();
  }

  // One buddy copy pushed to this keeper: the handshake, the offer, the bytes, the receipt.
  Status keep(int fd, const net::Interrupt& interrupt) {
    const net::Interrupt* const stop = &interrupt;
    const TimePoint shake = std::chrono::steady_clock::now() + std::min<Duration>(io_timeout, kHandshakeTime);
    if (Status st = respond(fd, kBuddyMagic, proofs, shake, stop); !st.is_ok()) return st;
    Offer offer;
    if (Status st = read_offer(fd, stop, offer); !st.is_ok()) return st;
    if (Status st = receive(fd, stop, offer); !st.is_ok()) return st;
    if (auto o = net::send_all(fd, std::string(1, '\1'), step(), stop); !o.ok()) return Status::error(o.text());
    return Status::ok();
  }
};

BuddyKeeper::BuddyKeeper(const std::string& address, std::string dir, const std::string& job_id,
                         const std::string& secret, Duration io_timeout)
    : impl_(std::make_unique<Impl>(std::move(dir), job_id, secret, io_timeout)) {
  // Several pushers may have this worker as their buddy (a host with fewer
  // workers than the one before it): their pushes go on side by side, and
  // one that hangs (a frozen pusher) holds only its own.
  server_ = std::make_unique<net::SerialServer>(
      address, 64,
      [this](int fd, const net::Address& peer, const net::Interrupt& stop) {
        Status s = impl_->keep(fd, stop);
        if (!s.is_ok()) ERUN_LOG_WARN("erun: buddy copy from {} not kept: {}", peer.name(), s.message());
      },
      kPushesAtOnce);
}

BuddyKeeper::~BuddyKeeper() = default;

void BuddyKeeper::accept_any() {
  std::lock_guard<std::mutex> lock(impl_->pairs_mu);
  impl_->only.reset();
}

void BuddyKeeper::forget_pairs_except(const std::set<std::string>& keep) {
  std::vector<std::shared_ptr<Impl::Pair>> gone;  // unmapped outside the lock, once their last push ends
  std::lock_guard<std::mutex> lock(impl_->pairs_mu);
  impl_->only = keep;
  for (auto it = impl_->pairs.begin(); it != impl_->pairs.end();) {
    if (keep.count(it->first) != 0) {
      ++it;
      continue;
    }
    gone.push_back(std::move(it->second));
    it = impl_->pairs.erase(it);
  }
}

struct ShardServer::Impl {
  std::string dir;
  handshake::Proofs proofs;
  Duration io_timeout;
  Impl(std::string d, const std::string& job_id, const std::string& secret, Duration t)
      : dir(std::move(d)), proofs(state_internal::proofs(job_id, secret)), io_timeout(t) {}

  TimePoint step() const { return std::chrono::steady_clock::now() + io_timeout; }

  // Answers one reader on `fd`; an error that says why when it is refused or fails.
  Status answer(int fd, const net::Interrupt& interrupt) {
    const net::Interrupt* const stop = &interrupt;
    // The handshake within kHandshakeTime: a stranger that connects and
    // says nothing holds the server that long, not an I/O bound.
    const TimePoint shake = std::chrono::steady_clock::now() + std::min<Duration>(io_timeout, kHandshakeTime);
    if (Status st = respond(fd, kShardMagic, proofs, shake, stop); !st.is_ok()) return st;
    char head[4];
    if (auto o = net::recv_exact(fd, head, 4, step(), stop); !o.ok()) return Status::error(o.text());
    const auto name_len = static_cast<uint32_t>(get_le(head, 4));
    if (name_len > 255) return Status::error("a file name longer than 255 bytes");
    std::string request(name_len + 12, '\0');
    if (auto o = net::recv_exact(fd, request.data(), request.size(), step(), stop); !o.ok()) {
      return Status::error(o.text());
    }
    const std::string name = request.substr(0, name_len);
    const uint64_t id = get_le(request.data() + name_len, 8);
    const auto count = static_cast<uint32_t>(get_le(request.data() + name_len + 8, 4));
    if (count > kMaxRanges) return refuse(fd, fmt::format("{} ranges, more than {}", count, kMaxRanges), step(), stop);
    std::string table(size_t{count} * 16, '\0');
    if (auto o = net::recv_exact(fd, table.data(), table.size(), step(), stop); !o.ok()) {
      return Status::error(o.text());
    }
    if (!plain_name(name)) return refuse(fd, "not a file of the commit directory", step(), stop);
    Fd file = HostCommits::open_own(dir + "/" + name);
    struct stat st {};
    if (!file || ::fstat(file.get(), &st) != 0) return refuse(fd, fmt::format("no file {} here", name), step(), stop);
    if (!HostCommits::held(file.get(), id)) {
      return refuse(fd, fmt::format("{} does not hold commit {}", name, id), step(), stop);
    }
    const auto size = static_cast<uint64_t>(st.st_size);
    for (uint32_t i = 0; i < count; ++i) {
      const uint64_t off = get_le(table.data() + i * 16, 8);
      const uint64_t n = get_le(table.data() + i * 16 + 8, 8);
      if (off > size || n > size - off) {
        return refuse(fd, fmt::format("bytes {}..{} lie outside {}", off, off + n, name), step(), stop);
      }
    }
    if (auto o = net::send_all(fd, std::string(1, '\1'), step(), stop); !o.ok()) return Status::error(o.text());
    std::vector<char> buffer(kChunk);  // this reader's: others are answered beside it
    for (uint32_t i = 0; i < count; ++i) {
      const uint64_t off = get_le(table.data() + i * 16, 8);
      const uint64_t n = get_le(table.data() + i * 16 + 8, 8);
      for (uint64_t at = 0; at < n;) {
        const auto k = static_cast<size_t>(std::min<uint64_t>(kChunk, n - at));
        if (!pread_all(file.get(), buffer.data(), k, off + at)) return Status::error("cannot read " + name);
        if (auto o = net::send_all(fd, std::string_view(buffer.data(), k), step(), stop); !o.ok()) {
          return Status::error(o.text());
        }
        at += k;
      }
    }
    const char whole = HostCommits::held(file.get(), id) ? '\1' : '\0';
    if (auto o = net::send_all(fd, std::string_view(&whole, 1), step(), stop); !o.ok()) return Status::error(o.text());
    return Status::ok();
  }
};

ShardServer::ShardServer(const std::string& address, std::string dir, const std::string& job_id,
                         const std::string& secret, Duration io_timeout)
    : impl_(std::make_unique<Impl>(std::move(dir), job_id, secret, io_timeout)) {
  // Several readers at once (every rank of a new world may read this
  // host's rows): one slow or frozen reader holds only itself, not the
  // others past their collective timeout.
  server_ = std::make_unique<net::SerialServer>(
      address, 64,
      [this](int fd, const net::Address& peer, const net::Interrupt& stop) {
        Status s = impl_->answer(fd, stop);
        if (!s.is_ok()) ERUN_LOG_WARN("erun: shard reader from {} refused: {}", peer.name(), s.message());
      },
      kReadersAtOnce);
}

ShardServer::~ShardServer() = default;

}  // namespace erun::state_internal
