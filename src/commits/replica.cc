#include "commits/replica.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "commits/commit_files.h"
#include "common/codec.h"
#include "erun/errors.hpp"

namespace erun::state_internal {
namespace {

constexpr handshake::Scheme kReplicaScheme{"erun-replica-pusher-v1", "erun-replica-keeper-v1",
                                           handshake::Scheme::Layout::kNoncesLast};
// Bounds on what a keeper accepts from an authenticated pusher: a table no
// State makes, never an allocation a stranger chose (the handshake comes first).
constexpr uint32_t kMaxEntries = 1u << 20;
constexpr uint32_t kMaxName = 4096;
constexpr uint64_t kMaxBytes = 1ull << 48;  // no layout arithmetic near 2^64
constexpr size_t kChunk = 1 << 20;
// The whole handshake, at the keeper.
constexpr auto kHelloTimeout = std::chrono::seconds(5);

// One end of an exchange: reads and writes with a deadline per operation,
// each failure an erun::Error naming the peer and the step.
class Wire {
 public:
  // Each read or write waits at most `timeout`; with `whole`, all of them
  // together do (a handshake).
  Wire(int sock, std::string peer, Duration timeout, const net::Interrupt* interrupt, bool whole = false)
      : sock_(sock), peer_(std::move(peer)), timeout_(timeout), interrupt_(interrupt) {
    if (whole) deadline_ = std::chrono::steady_clock::now() + timeout;
  }
  // n bytes, a chunk at a time, each chunk within the timeout: a large entry
  // over a slow link is not one deadline.
  void recv_chunked(char* out, size_t n, const char* what) {
    for (size_t at = 0; at < n;) {
      const size_t k = std::min(n - at, kChunk);
      recv(out + at, k, what);
      at += k;
    }
  }
  void send(std::string_view data, const char* what) {
    check(net::send_all(sock_, data, now_plus(), interrupt_), "sending", what);
  }
  void recv(char* out, size_t n, const char* what) {
    check(net::recv_exact(sock_, out, n, now_plus(), interrupt_), "reading", what);
  }
  std::string recv(size_t n, const char* what) {
    std::string s(n, '\0');
    recv(s.data(), n, what);
    return s;
  }
  // Whether the peer closed the connection before the first byte of the next message.
  bool closed_before(char* out, size_t n, const char* what) {
    net::Outcome o = net::recv_exact(sock_, out, 1, now_plus(), interrupt_);
    if (o.end == net::Outcome::kClosed) return true;
    check(o, "reading", what);
    if (n > 1) recv(out + 1, n - 1, what);
    return false;
  }
  uint8_t u8(const char* what) {
    char b = 0;
    recv(&b, 1, what);
    return static_cast<uint8_t>(b);
  }
  [[noreturn]] void fail(const std::string& why) const {
    throw Error(fmt::format("erun: commit replica exchange with {}: {}", peer_, why));
  }

 private:
  TimePoint now_plus() const { return deadline_ ? *deadline_ : std::chrono::steady_clock::now() + timeout_; }
  void check(const net::Outcome& o, const char* verb, const char* what) const {
    if (!o.ok()) fail(fmt::format("{} {}: {}", verb, what, o.text()));
  }
  int sock_;
  std::string peer_;
  Duration timeout_;
  const net::Interrupt* interrupt_;
  std::optional<TimePoint> deadline_;
};

// A commit's header: what a keeper lays out before the bytes come.
struct Header {
  uint32_t ordinal = 0, flags = 0;
  uint64_t id = 0, total = 0;
  std::vector<std::string> names;
  std::vector<uint64_t> sizes;
  std::string source;  // a sharded State's: the worker's stem
  uint64_t keep = 0;   // the commit the pair keeps (0: none)
};

// `text` with its bytes outside printable ASCII as \\xNN, for a message.
std::string printable(const std::string& text) {
  std::string out;
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    out += u >= 0x20 && u < 0x7f ? std::string(1, c) : fmt::format("\\x{:02x}", u);
  }
  return out;
}

// The longest worker stem a keeper takes.
constexpr uint32_t kMaxSource = 200;

uint64_t total_of(const HostCommits::Listing& l) {
  uint64_t total = 0;
  for (uint64_t n : l.sizes) total += n;
  return total;
}

std::string encode_header(int ordinal, const HostCommits::Listing& l, const std::string& source, uint64_t keep) {
  PayloadWriter w;
  w.u32(static_cast<uint32_t>(ordinal)).u32(l.flags).u64(l.id).u32(static_cast<uint32_t>(l.names.size()));
  w.u64(total_of(l));
  for (size_t k = 0; k < l.names.size(); ++k) w.bytes(l.names[k]).u64(l.sizes[k]);
  w.bytes(source).u64(keep);
  return w.str();
}

bool sharded(const HostCommits::Listing& l) {
  return std::find(l.names.begin(), l.names.end(), kShardTable) != l.names.end();
}

uint32_t le32(const char* p) { return static_cast<uint32_t>(get_le(p, 4)); }

// The rest of a header whose fixed part (`fixed`) came, checked against the
// keeper's bounds: an error for anything a State does not make.
Header read_header(Wire& wire, const char* fixed) {
  Header h;
  h.ordinal = le32(fixed);
  h.flags = le32(fixed + 4);
  h.id = get_le(fixed + 8, 8);
  const uint32_t count = le32(fixed + 16);
  h.total = get_le(fixed + 20, 8);
  if (count > kMaxEntries || h.ordinal > 1000000 || h.id == 0 || h.total > kMaxBytes) {
    wire.fail(fmt::format("a malformed commit header ({} entries, State {}, commit {})", count, h.ordinal, h.id));
  }
  uint64_t sum = 0;  // never above h.total
  for (uint32_t k = 0; k < count; ++k) {
    char len[4];
    wire.recv(len, 4, "an entry's name");
    if (le32(len) > kMaxName) wire.fail(fmt::format("an entry name of {} bytes", le32(len)));
    h.names.push_back(wire.recv(le32(len), "an entry's name"));
    char size[8];
    wire.recv(size, 8, "an entry's size");
    h.sizes.push_back(get_le(size, 8));
    if (h.sizes.back() > h.total - sum) wire.fail("entry sizes that exceed the commit's");
    sum += h.sizes.back();
  }
  if (sum != h.total) wire.fail("entry sizes that do not add up to the commit's");
  char len[4];
  wire.recv(len, 4, "the worker's stem");
  if (le32(len) > kMaxSource) wire.fail(fmt::format("a worker stem of {} bytes", le32(len)));
  h.source = wire.recv(le32(len), "the worker's stem");
  // A worker's stem as erun names them (letters, digits, '.', '-', '_'; no
  // leading dot), of the header's State, and no keeper pair's own name.
  const bool plain = std::all_of(h.source.begin(), h.source.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_';
  });
  if (!h.source.empty() && (!plain || h.source[0] == '.' || !commit_file_name(h.source + ".a") ||
                            HostCommits::ordinal_of(h.source + ".a") != static_cast<int>(h.ordinal) ||
                            replica_stem(h.source))) {
    wire.fail(fmt::format("'{}' is not a worker's stem of State {}", printable(h.source), h.ordinal));
  }
  char keep[8];
  wire.recv(keep, 8, "the commit to keep");
  h.keep = get_le(keep, 8);
  return h;
}

}  // namespace

std::string sharded_replica_stem(const std::string& worker_stem) {
  return std::string(kReplicaStem) + "-of-" + worker_stem;
}

bool replica_stem(const std::string& stem) {
  return stem.rfind(kReplicaStem, 0) == 0 &&
         (stem.size() == std::strlen(kReplicaStem) || stem[std::strlen(kReplicaStem)] == '-');
}

handshake::Proofs replica_proofs(std::shared_ptr<const handshake::Key> key, const std::string& keeper_dir) {
  return handshake::Proofs(std::move(key), kReplicaScheme, keeper_dir);
}

ReplicaPusher::ReplicaPusher(std::string commit_dir, std::shared_ptr<const handshake::Key> key)
    : commit_dir_(std::move(commit_dir)), key_(std::move(key)) {}

void ReplicaPusher::target(const net::Address& keeper, const std::string& keeper_dir) {
  keeper_ = keeper;
  keeper_dir_ = keeper_dir;
  has_target_ = true;
  sent_.clear();
  complete_.clear();
}

void ReplicaPusher::connect_and_prove(net::Socket& sock, Duration io_timeout) {
  sock = net::connect(keeper_, std::chrono::steady_clock::now() + io_timeout, interrupt_);
  if (!sock.ok()) {
    throw Error(fmt::format("erun: commit replica: cannot connect to the keeper at {}: {}", keeper_.name(),
                            sock.outcome.text()));
  }
  Wire wire(sock.fd.get(), keeper_.name(), io_timeout, interrupt_);
  handshake::Initiator hs;
  PayloadWriter hello;
  hello.fixed(std::string_view(kReplicaMagic, 8)).u32(kReplicaVersion).fixed(hs.nonce());
  wire.send(hello.str(), "the hello");
  if (!hs.challenged(wire.recv(handshake::kNonceBytes, "the keeper's nonce"))) wire.fail("a malformed nonce");
  const handshake::Proofs proofs = replica_proofs(key_, keeper_dir_);
  wire.send(hs.proof(proofs), "the proof");
  if (!hs.verify(proofs, wire.recv(handshake::kMacBytes, "the keeper's proof"))) {
    wire.fail("the keeper could not prove the job secret: another job's keeper (or not erun) listens there");
  }
}

namespace {

// Per sharded State number (its files hold the shard table), the worker
// stems whose newest whole commit goes to the keeper now: those that hold
// the newest commit any of them holds. None while another file's newest is
// the commit before that one (or between): its worker is still writing the
// newest, and the keeper, which keeps two commits per file, could end up
// with no commit of every worker's rows. Files further behind are left out:
// a slot no worker uses now.
std::map<int, std::set<std::string>> sharded_ready(const std::string& dir) {
  std::map<int, std::map<std::string, std::vector<uint64_t>>> held;  // ordinal -> stem -> whole ids
  for (const ClaimedCommit& c : claimed_commits(dir)) {
    const std::string stem = c.name.substr(0, c.name.size() - 2);
    const int ordinal = HostCommits::ordinal_of(c.name);
    if (ordinal < 0 || replica_stem(stem)) continue;
    Fd fd = HostCommits::open_own(dir + "/" + c.name);
    if (!fd) continue;
    const auto l = HostCommits::list(fd.get());
    if (l && sharded(*l)) held[ordinal][stem].push_back(l->id);
  }
  std::map<int, std::set<std::string>> ready;
  for (auto& [ordinal, stems] : held) {
    uint64_t newest = 0, before = 0;
    for (auto& [stem, ids] : stems) {
      std::sort(ids.begin(), ids.end(), std::greater<>());
      newest = std::max(newest, ids.front());
    }
    for (const auto& [stem, ids] : stems) {
      if (ids.front() == newest && ids.size() > 1) before = std::max(before, ids[1]);
    }
    bool writing = false;
    for (const auto& [stem, ids] : stems) {
      writing = writing || (before > 0 && ids.front() < newest && ids.front() >= before);
    }
    std::set<std::string>& go = ready[ordinal];  // there even when empty: a sharded State
    for (const auto& [stem, ids] : stems) {
      if (!writing && ids.front() == newest) go.insert(stem);
    }
  }
  return ready;
}

}  // namespace

void ReplicaPusher::push(Duration io_timeout, std::vector<Pushed>* pushed) {
  if (!has_target_) return;
  net::Socket sock;
  const std::map<int, std::set<std::string>> ready = sharded_ready(commit_dir_);
  // Replicas whose newest whole commit was found: a State number, or a
  // sharded State's worker stem (each of its workers' files holds other rows).
  std::set<std::string> looked;
  auto sent = [&](const std::string& key) {
    auto it = sent_.find(key);
    return it == sent_.end() ? uint64_t{0} : it->second;
  };
  for (const ClaimedCommit& c : claimed_commits(commit_dir_)) {  // newest first
    const int ordinal = HostCommits::ordinal_of(c.name);
    const std::string stem = c.name.substr(0, c.name.size() - 2);
    if (ordinal < 0 || replica_stem(stem)) continue;
    const auto shards = ready.find(ordinal);
    const bool per_file = shards != ready.end();
    if (per_file && shards->second.count(stem) == 0) continue;
    const std::string key = per_file ? stem : fmt::format("#{}", ordinal);
    if (looked.count(key) || c.id <= sent(key)) continue;
    Fd fd = HostCommits::open_own(commit_dir_ + "/" + c.name);
    if (!fd) continue;
    auto listing = HostCommits::list(fd.get());
    // Torn, older than its header said, sent, or another State's since the look.
    if (!listing || listing->id <= sent(key) || sharded(*listing) != per_file) continue;
    looked.insert(key);
    if (!sock.fd) connect_and_prove(sock, io_timeout);
    const std::string source = per_file ? stem : std::string();
    const uint64_t keep = per_file ? complete_[ordinal] : 0;
    if (push_one(sock.fd.get(), fd.get(), *listing, ordinal, source, keep, io_timeout)) {
      sent_[key] = listing->id;
      pushed->push_back(Pushed{ordinal, listing->id, total_of(*listing), source});
    }
  }
  // A sharded State whose every ready worker file the keeper now holds at
  // the same commit: that commit is whole there, kept from now on.
  for (const auto& [ordinal, stems] : ready) {
    uint64_t id = 0;
    bool same = !stems.empty();
    for (const std::string& stem : stems) {
      const uint64_t at = sent(stem);
      same = same && at != 0 && (id == 0 || at == id);
      id = at;
    }
    if (same) complete_[ordinal] = std::max(complete_[ordinal], id);
  }
}

bool ReplicaPusher::push_one(int sock, int fd, const HostCommits::Listing& l, int ordinal, const std::string& source,
                             uint64_t keep, Duration io_timeout) {
  Wire wire(sock, keeper_.name(), io_timeout, interrupt_);
  wire.send(encode_header(ordinal, l, source, keep), "a commit's header");
  if (wire.u8("the keeper's answer") != 1) {
    char len[4];
    wire.recv(len, 4, "the keeper's reason");
    std::string why = wire.recv(std::min<uint32_t>(le32(len), 64 * 1024), "the keeper's reason");
    throw Error(fmt::format("erun: commit replica: the keeper at {} refused commit {}: {}", keeper_.name(), l.id, why));
  }
  // Straight from the holder's file to the socket, a chunk at a time.
  chunk_.resize(kChunk);
  bool whole = true;
  for (size_t k = 0; k < l.sizes.size(); ++k) {
    for (uint64_t at = 0; at < l.sizes[k];) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(kChunk, l.sizes[k] - at));
      // A file truncated under the copy (a new State of its worker) still
      // sends its bytes' count, as zeros, and is then declared torn.
      if (whole && !pread_all(fd, chunk_.data(), n, l.offsets[k] + at)) whole = false;
      if (!whole) std::fill(chunk_.begin(), chunk_.begin() + static_cast<std::ptrdiff_t>(n), 0);
      wire.send(std::string_view(chunk_.data(), n), "a commit's bytes");
      at += n;
    }
  }
  whole = whole && HostCommits::held(fd, l.id);
  wire.send(std::string_view(whole ? "\1" : "\0", 1), "the verdict");
  const bool stored = wire.u8("the keeper's receipt") == 1;
  return whole && stored;
}

ReplicaStore::ReplicaStore(std::string commit_dir, std::shared_ptr<const handshake::Key> key)
    : commit_dir_(std::move(commit_dir)), key_(std::move(key)) {}

ReplicaStore::~ReplicaStore() = default;

HostCommits& ReplicaStore::files(const std::string& stem) {
  auto& f = files_[stem];
  if (!f) f = std::make_unique<HostCommits>(commit_dir_ + "/" + stem);
  return *f;
}

namespace {

// The keeper's side of the handshake: nothing the peer sends is believed
// before its proof, and a peer that says nothing holds the keeper (which
// serves one connection at a time) for kHelloTimeout at most.
void answer_pusher(int sock, const std::string& peer, Duration io_timeout, const net::Interrupt* interrupt,
                   const handshake::Proofs& proofs) {
  Wire hs_wire(sock, peer, std::min<Duration>(io_timeout, kHelloTimeout), interrupt, /*whole=*/true);
  std::string hello = hs_wire.recv(8 + 4 + handshake::kNonceBytes, "the hello");
  if (hello.compare(0, 8, kReplicaMagic, 8) != 0) hs_wire.fail("not a commit replica hello (is something else connecting?)");
  if (le32(hello.data() + 8) != kReplicaVersion) {
    hs_wire.fail(fmt::format("replica protocol version {}, this erun speaks {}: install the same erun on every host",
                          le32(hello.data() + 8), kReplicaVersion));
  }
  handshake::Responder hs;
  if (!hs.hello(std::string_view(hello).substr(12))) hs_wire.fail("a malformed nonce");
  hs_wire.send(hs.challenge(), "the nonce");
  if (!hs.verify(proofs, hs_wire.recv(handshake::kMacBytes, "the proof"))) {
    hs_wire.fail("the peer could not prove the job secret; nothing was stored");
  }
  hs_wire.send(hs.proof(proofs), "the proof");
}

// One pushed commit, its header read, laid into `f`: the file is laid out
// first and each entry received straight into its place. Whether it is
// stored whole (a torn one is abandoned: the previous commit stays the
// keeper's newest); a refusal is sent to the pusher and thrown.
bool receive_commit(Wire& wire, const Header& h, HostCommits& f) {
  const size_t count = h.names.size();
  std::vector<EntryRef> entries;
  for (size_t k = 0; k < count; ++k) entries.push_back(EntryRef::filled_later(h.names[k], h.sizes[k]));
  std::vector<const char*> placed;
  std::shared_ptr<Completion> completion;
  std::optional<std::string> refused;
  try {
    f.keep_commit(h.keep);
    refused = f.write(h.id, entries, &placed, h.flags, &completion);
  } catch (const Error& e) {
    refused = e.what();
  }
  if (refused) {
    PayloadWriter no;
    no.u8(0).bytes(*refused);
    wire.send(no.str(), "a refusal");
    wire.fail("refused commit " + std::to_string(h.id) + ": " + *refused);
  }
  bool whole = false;
  try {
    wire.send(std::string_view("\1", 1), "the answer");
    for (size_t k = 0; k < count; ++k) {
      if (h.sizes[k] > 0) wire.recv_chunked(const_cast<char*>(placed[k]), h.sizes[k], "a commit's bytes");
    }
    whole = wire.u8("the verdict") == 1;
  } catch (...) {
    f.abandon();
    throw;
  }
  if (!whole) {
    f.abandon();
  } else if (completion) {  // none for a commit without entries: whole when written
    for (size_t k = 0; k < count; ++k) completion->done();
  }
  return whole;
}

}  // namespace

int ReplicaStore::serve(int sock, const std::string& peer, Duration io_timeout) {
  answer_pusher(sock, peer, io_timeout, interrupt_, replica_proofs(key_, commit_dir_));
  Wire wire(sock, peer, io_timeout, interrupt_);
  int stored = 0;
  while (true) {
    char fixed[4 + 4 + 8 + 4 + 8];
    if (wire.closed_before(fixed, sizeof fixed, "a commit's header")) return stored;
    const Header h = read_header(wire, fixed);
    const std::string stem = h.source.empty() ? HostCommits::stem_of(kReplicaStem, static_cast<int>(h.ordinal))
                                              : sharded_replica_stem(h.source);
    const bool whole = receive_commit(wire, h, files(stem));
    if (whole) ++stored;
    wire.send(std::string_view(whole ? "\1" : "\0", 1), "the receipt");
  }
}

RemovedReplicas remove_replicas(const std::string& dir, bool all) {
  RemovedReplicas removed;
  Fd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dfd) return removed;
  struct File {
    std::string name;
    uint64_t whole;  // the commit it holds whole; 0: none
    uint64_t size;
  };
  // Per State number: the keeper's files, and the newest whole commit of the others.
  std::map<int, std::vector<File>> kept;
  std::map<int, uint64_t> own;
  const int listed = ::dup(dfd.get());
  DIR* d = listed < 0 ? nullptr : ::fdopendir(listed);
  if (d == nullptr) {
    if (listed >= 0) ::close(listed);
    return removed;
  }
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (!commit_file_name(name)) continue;
    Fd fd = HostCommits::open_own(dir + "/" + name);
    if (!fd) continue;  // a link, or not this user's: never ours to remove
    struct stat st {};
    const uint64_t size = ::fstat(fd.get(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
    const auto listing = HostCommits::list(fd.get());
    const uint64_t whole = listing ? listing->id : 0;
    const int ordinal = HostCommits::ordinal_of(name);
    const std::string stem = name.substr(0, name.size() - 2);
    if (!all && stem.rfind(sharded_replica_stem(""), 0) == 0) {
      ++removed.left;  // the State's to remove (see replica.h)
    } else if (replica_stem(stem)) {
      kept[ordinal].push_back({name, whole, size});
    } else {
      own[ordinal] = std::max(own[ordinal], whole);
    }
  }
  ::closedir(d);
  for (auto& [ordinal, files] : kept) {
    uint64_t newest = 0;
    for (const File& f : files) newest = std::max(newest, f.whole);
    const bool go = all || (own[ordinal] > 0 && own[ordinal] >= newest);
    for (const File& f : files) {
      // unlinkat() removes a link itself, never what it points to.
      if (!go || ::unlinkat(dfd.get(), f.name.c_str(), 0) != 0) {
        ++removed.left;
        continue;
      }
      removed.names.push_back(f.name);
      removed.bytes += f.size;
    }
  }
  std::sort(removed.names.begin(), removed.names.end());
  return removed;
}

}  // namespace erun::state_internal
