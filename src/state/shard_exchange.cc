#include "state/shard_exchange.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

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
constexpr uint32_t kMaxRanges = 1u << 20;
constexpr size_t kChunk = 4u << 20;  // bytes per send or receive, each within the I/O bound
constexpr Duration kHandshakeTime = std::chrono::seconds(5);

handshake::Proofs proofs(const std::string& job_id, const std::string& secret) {
  return handshake::Proofs(std::make_shared<handshake::Key>(secret), kScheme, job_id);
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
  for (const ClaimedCommit& c : claimed_commits(dir)) {
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
  const auto p = proofs(job_id, secret);
  const std::string mine = handshake::random_bytes(handshake::kNonceBytes);
  if (auto o = net::send_all(fd, std::string(kShardMagic, sizeof(kShardMagic)) + mine, step()); !o.ok()) return fail(o.text());
  std::string reply(handshake::kNonceBytes + handshake::kMacBytes, '\0');
  if (auto o = net::recv_exact(fd, reply.data(), reply.size(), step()); !o.ok()) return fail(o.text());
  const std::string theirs = reply.substr(0, handshake::kNonceBytes);
  if (!handshake::equal_ct(reply.substr(handshake::kNonceBytes), p.responder(mine, theirs))) {
    return fail("the server failed the job secret's proof");
  }
  PayloadWriter w;
  w.fixed(p.initiator(mine, theirs)).bytes(file).u64(id).u32(static_cast<uint32_t>(ranges.size()));
  for (const ByteRange& r : ranges) w.u64(r.offset).u64(r.bytes);
  if (auto o = net::send_all(fd, w.str(), step()); !o.ok()) return fail(o.text());
  char ok = 0;
  if (auto o = net::recv_exact(fd, &ok, 1, step()); !o.ok()) return fail(o.text());
  if (ok != 1) {
    char len[4];
    std::string why = "refused";
    if (net::recv_exact(fd, len, 4, step()).ok()) {
      why.assign(std::min<uint64_t>(get_le(len, 4), 4096), '\0');
      if (!net::recv_exact(fd, why.data(), why.size(), step()).ok()) why = "refused";
    }
    return fail(why);
  }
  for (const ByteRange& r : ranges) {
    for (uint64_t at = 0; at < r.bytes;) {
      const auto n = static_cast<size_t>(std::min<uint64_t>(kChunk, r.bytes - at));
      if (auto o = net::recv_exact(fd, r.out + at, n, step()); !o.ok()) return fail(o.text());
      at += n;
    }
  }
  if (auto o = net::recv_exact(fd, &ok, 1, step()); !o.ok()) return fail(o.text());
  if (ok != 1) return fail(fmt::format("the file was overwritten while read (commit {})", id));
  return Status::ok();
}

struct ShardServer::Impl {
  std::string dir;
  handshake::Proofs proofs;
  Duration io_timeout;
  std::vector<char> buffer;
  Impl(std::string d, const std::string& job_id, const std::string& secret, Duration t)
      : dir(std::move(d)), proofs(state_internal::proofs(job_id, secret)), io_timeout(t) {}

  TimePoint step() const { return std::chrono::steady_clock::now() + io_timeout; }

  // Answers one reader on `fd`; an error that says why when it is refused or fails.
  Status answer(int fd, const net::Interrupt& interrupt) {
    const net::Interrupt* const stop = &interrupt;
    // The handshake within kHandshakeTime: a stranger that connects and
    // says nothing holds the server that long, not an I/O bound.
    const TimePoint shake = std::chrono::steady_clock::now() + std::min<Duration>(io_timeout, kHandshakeTime);
    char hello[sizeof(kShardMagic) + handshake::kNonceBytes];
    if (auto o = net::recv_exact(fd, hello, sizeof(hello), shake, stop); !o.ok()) return Status::error(o.text());
    if (std::memcmp(hello, kShardMagic, sizeof(kShardMagic)) != 0) return Status::error("not a shard reader");
    const std::string theirs(hello + sizeof(kShardMagic), handshake::kNonceBytes);
    const std::string mine = handshake::random_bytes(handshake::kNonceBytes);
    if (auto o = net::send_all(fd, mine + proofs.responder(theirs, mine), shake, stop); !o.ok()) {
      return Status::error(o.text());
    }
    std::string proof(handshake::kMacBytes, '\0');
    if (auto o = net::recv_exact(fd, proof.data(), proof.size(), shake, stop); !o.ok()) {
      return Status::error(o.text());
    }
    if (!handshake::equal_ct(proof, proofs.initiator(theirs, mine))) return Status::error("failed the job secret's proof");
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
    if (count > kMaxRanges) return refuse(fd, fmt::format("{} ranges, more than {}", count, kMaxRanges), stop);
    std::string table(size_t{count} * 16, '\0');
    if (auto o = net::recv_exact(fd, table.data(), table.size(), step(), stop); !o.ok()) {
      return Status::error(o.text());
    }
    if (!plain_name(name)) return refuse(fd, "not a file of the commit directory", stop);
    Fd file = HostCommits::open_own(dir + "/" + name);
    struct stat st {};
    if (!file || ::fstat(file.get(), &st) != 0) return refuse(fd, fmt::format("no file {} here", name), stop);
    if (!HostCommits::held(file.get(), id)) return refuse(fd, fmt::format("{} does not hold commit {}", name, id), stop);
    const auto size = static_cast<uint64_t>(st.st_size);
    for (uint32_t i = 0; i < count; ++i) {
      const uint64_t off = get_le(table.data() + i * 16, 8);
      const uint64_t n = get_le(table.data() + i * 16 + 8, 8);
      if (off > size || n > size - off) return refuse(fd, fmt::format("bytes {}..{} lie outside {}", off, off + n, name), stop);
    }
    if (auto o = net::send_all(fd, std::string(1, '\1'), step(), stop); !o.ok()) return Status::error(o.text());
    buffer.resize(kChunk);
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

  Status refuse(int fd, const std::string& why, const net::Interrupt* stop) {
    char len[4];
    put_le(len, why.size(), 4);
    (void)net::send_all(fd, std::string(1, '\0') + std::string(len, 4) + why, step(), stop);
    return Status::error(why);
  }
};

ShardServer::ShardServer(const std::string& address, std::string dir, const std::string& job_id,
                         const std::string& secret, Duration io_timeout)
    : impl_(std::make_unique<Impl>(std::move(dir), job_id, secret, io_timeout)) {
  server_ = std::make_unique<net::SerialServer>(
      address, 64, [this](int fd, const net::Address& peer, const net::Interrupt& stop) {
        Status s = impl_->answer(fd, stop);
        if (!s.is_ok()) ERUN_LOG_WARN("erun: shard reader from {} refused: {}", peer.name(), s.message());
      });
}

ShardServer::~ShardServer() = default;

}  // namespace erun::state_internal
