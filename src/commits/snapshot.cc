#include "commits/snapshot.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <fmt/format.h>
#include <unordered_set>

#include "common/fd.h"
#include "common/private_files.h"
#include "erun/errors.hpp"

namespace erun::state_internal {
namespace {

constexpr size_t kHeaderBytes = 8 + 4 + 4 + 8 + 8;
constexpr size_t kCrcBytes = 4;

// CRC-32C (Castagnoli), reflected polynomial 0x82F63B78: SSE4.2 when the CPU
// has it, a byte table otherwise; both give the same value.
std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}

uint32_t crc32c_table(uint32_t crc, const unsigned char* p, size_t n) {
  static const std::array<uint32_t, 256> table = make_table();
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc32c_hw(uint32_t crc, const unsigned char* p,
                                                      size_t n) {
  uint64_t c = crc;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = __builtin_ia32_crc32di(c, v);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n > 0) {
    c32 = __builtin_ia32_crc32qi(c32, *p++);
    --n;
  }
  return c32;
}
bool have_hw_crc() {
  static const bool have = __builtin_cpu_supports("sse4.2");
  return have;
}
#endif

void put_u32(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
void put_u64(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
uint32_t get_u32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}
uint64_t get_u64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

// Forwards to a sink while keeping the running CRC.
class CrcSink {
 public:
  explicit CrcSink(ByteSink& out) : out_(out) {}
  void write(const void* data, size_t n) {
    crc_ = crc32c(crc_, data, n);
    out_.write(data, n);
  }
  void u64(uint64_t v) {
    unsigned char b[8];
    put_u64(b, v);
    write(b, 8);
  }
  uint32_t crc() const { return crc_; }
  ByteSink& raw() { return out_; }

 private:
  ByteSink& out_;
  uint32_t crc_ = 0;
};

class VectorSink : public ByteSink {
 public:
  explicit VectorSink(std::vector<char>* v) : v_(v) {}
  void write(const void* data, size_t n) override {
    const char* p = static_cast<const char*>(data);
    v_->insert(v_->end(), p, p + n);
  }

 private:
  std::vector<char>* v_;
};

std::string errno_text(int err) { return std::strerror(err); }

// Buffered writes to a file descriptor.
class FdSink final : public BufferedSink {
 public:
  FdSink(int fd, std::string path) : BufferedSink(1 << 20), fd_(fd), path_(std::move(path)) {}

 private:
  void put(const char* p, size_t n) override {
    while (n > 0) {
      ssize_t w = ::write(fd_, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        throw Error(fmt::format("erun: cannot write checkpoint file {}: {}; check disk space and "
                                "permissions", path_, errno_text(errno)));
      }
      p += w;
      n -= static_cast<size_t>(w);
    }
  }
  int fd_;
  std::string path_;
};

std::string temp_prefix(const std::string& name) { return "." + name + ".tmp."; }
// This process's temp files: the prefix, the pid, a dot, random hex digits.
std::string own_temp_prefix(const std::string& name) {
  return temp_prefix(name) + std::to_string(::getpid()) + ".";
}

}  // namespace

uint32_t crc32c(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
#if defined(__x86_64__)
  if (have_hw_crc()) return ~crc32c_hw(crc, p, n);
#endif
  return ~crc32c_table(crc, p, n);
}

void BufferedSink::write(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  if (buf_.size() + n <= cap_) {
    buf_.insert(buf_.end(), p, p + n);
    return;
  }
  flush();
  if (n >= cap_) {
    put(p, n);
  } else {
    buf_.insert(buf_.end(), p, p + n);
  }
}

void BufferedSink::flush() {
  if (!buf_.empty()) put(buf_.data(), buf_.size());
  buf_.clear();
}

void encode(uint64_t commit_id, const std::vector<EntryRef>& entries, ByteSink& sink) {
  CrcSink out(sink);
  unsigned char header[kHeaderBytes];
  std::memcpy(header, kMagic, 8);
  put_u32(header + 8, kVersion);
  put_u32(header + 12, 0);
  put_u64(header + 16, commit_id);
  put_u64(header + 24, entries.size());
  out.write(header, sizeof(header));
  for (const EntryRef& e : entries) {
    out.u64(e.name->size());
    out.write(e.name->data(), e.name->size());
    out.u64(e.size);
    e.each_range([&](const char* p, size_t n) { out.write(p, n); });
  }
  unsigned char crc[4];
  put_u32(crc, out.crc());
  sink.write(crc, 4);
}

std::vector<char> encode(uint64_t commit_id, const std::vector<EntryRef>& entries) {
  size_t total = kHeaderBytes + kCrcBytes;
  for (const EntryRef& e : entries) total += 16 + e.name->size() + e.size;
  std::vector<char> out;
  out.reserve(total);
  VectorSink sink(&out);
  encode(commit_id, entries, sink);
  return out;
}

Snapshot decode(const char* data, size_t size, const std::string& source) {
  auto fail = [&](const std::string& why) {
    return Error(fmt::format("erun: {} is not a valid erun state: {}", source, why));
  };
  if (size < kHeaderBytes + kCrcBytes) {
    throw fail(fmt::format("only {} bytes (truncated)", size));
  }
  if (std::memcmp(data, kMagic, 8) != 0) throw fail("bad magic (not an erun state file)");
  uint32_t version = get_u32(data + 8);
  if (version != kVersion) {
    throw fail(fmt::format("format version {} (this erun reads version {})", version, kVersion));
  }
  size_t body = size - kCrcBytes;
  uint32_t want = get_u32(data + body);
  uint32_t got = crc32c(0, data, body);
  if (want != got) {
    throw fail(fmt::format("checksum mismatch (stored {:08x}, computed {:08x}): truncated or "
                           "corrupted", want, got));
  }
  Snapshot snap;
  snap.commit_id = get_u64(data + 16);
  uint64_t count = get_u64(data + 24);
  size_t pos = kHeaderBytes;
  auto take_len = [&](const char* what) -> uint64_t {
    if (body - pos < 8) throw fail(fmt::format("{} runs past the end", what));
    uint64_t v = get_u64(data + pos);
    pos += 8;
    if (v > body - pos) throw fail(fmt::format("{} of {} bytes runs past the end", what, v));
    return v;
  };
  if (count > (body - pos) / 16) throw fail(fmt::format("entry count {} is too large", count));
  std::unordered_set<std::string> seen;
  snap.entries.reserve(count);
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t nlen = take_len("an entry name");
    std::string name(data + pos, nlen);
    pos += nlen;
    uint64_t dlen = take_len(fmt::format("the data of entry '{}'", name).c_str());
    if (!seen.insert(name).second) throw fail(fmt::format("entry '{}' appears twice", name));
    snap.entries.emplace_back(std::move(name), std::vector<char>(data + pos, data + pos + dlen));
    pos += dlen;
  }
  if (pos != body) throw fail(fmt::format("{} unexpected bytes after the last entry", body - pos));
  return snap;
}

void write_file_atomically(const std::string& dir, const std::string& name, uint64_t commit_id,
                           const std::vector<EntryRef>& entries) {
  const std::string target = dir + "/" + name;
  Fd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd.get() < 0) {
    throw Error(fmt::format("erun: cannot open checkpoint directory {}: {}", dir, errno_text(errno)));
  }
  if (Status ok = check_private_dir(dfd.get(), dir, "checkpoint directory"); !ok) {
    throw Error("erun: " + ok.message());
  }
  std::string tmp_name;
  Result<int> created = create_private_temp(dfd.get(), dir, own_temp_prefix(name), &tmp_name);
  if (!created) {
    throw Error(fmt::format("erun: cannot create a checkpoint file: {}; check that the checkpoint directory is "
                            "writable", created.message()));
  }
  Fd fd(created.value());
  // Errors name the file the write was for (its temporary copy, which has a
  // new name at every try, is removed), so a failure that repeats reads the same.
  const std::string tmp = target + " (its temporary copy)";
  try {
    FdSink sink(fd.get(), tmp);
    encode(commit_id, entries, sink);
    sink.flush();
    if (::fsync(fd.get()) != 0) {
      throw Error(fmt::format("erun: fsync of checkpoint file {} failed: {}", tmp,
                              errno_text(errno)));
    }
    if (::close(fd.release()) != 0) {
      throw Error(fmt::format("erun: closing checkpoint file {} failed: {}", tmp,
                              errno_text(errno)));
    }
    // rename(2) replaces whatever is at the target, a symbolic link
    // included, and never follows it.
    if (::renameat(dfd.get(), tmp_name.c_str(), dfd.get(), name.c_str()) != 0) {
      throw Error(fmt::format("erun: cannot rename {} into place: {}", tmp, errno_text(errno)));
    }
  } catch (...) {
    ::unlinkat(dfd.get(), tmp_name.c_str(), 0);
    throw;
  }
  if (::fsync(dfd.get()) != 0) {
    throw Error(fmt::format("erun: fsync of checkpoint directory {} failed: {}", dir,
                            errno_text(errno)));
  }
}

uint64_t file_commit_id(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  char header[kHeaderBytes];
  if (fd.get() < 0 || ::pread(fd.get(), header, sizeof header, 0) != static_cast<ssize_t>(sizeof header) ||
      std::memcmp(header, kMagic, 8) != 0 || get_u32(header + 8) != kVersion) {
    return 0;
  }
  return get_u64(header + 16);
}

bool read_file(const std::string& path, std::vector<char>* out) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (fd.get() < 0) {
    if (errno == ENOENT) return false;
    if (errno == ELOOP) {
      throw Error(fmt::format("erun: checkpoint file {} is a symbolic link; erun reads only a regular file it "
                              "wrote itself: remove the link", path));
    }
    throw Error(fmt::format("erun: cannot open checkpoint file {}: {}", path, errno_text(errno)));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    throw Error(fmt::format("erun: cannot stat checkpoint file {}: {}", path, errno_text(errno)));
  }
  if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) {
    throw Error(fmt::format("erun: checkpoint file {} is not a regular file owned by this user (uid {}); erun "
                            "reads only a file it wrote itself: remove it", path,
                            static_cast<unsigned>(::geteuid())));
  }
  out->resize(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (got < out->size()) {
    ssize_t r = ::read(fd.get(), out->data() + got, out->size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      throw Error(fmt::format("erun: cannot read checkpoint file {}: {}", path,
                              errno_text(errno)));
    }
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  out->resize(got);
  return true;
}

void remove_stale_temp_files(const std::string& dir, const std::string& name) {
  const std::string prefix = temp_prefix(name);
  const std::string mine = own_temp_prefix(name);
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return;
  while (dirent* e = ::readdir(d)) {
    std::string f = e->d_name;
    // unlinkat removes a link itself, never what it points to.
    if (f.rfind(prefix, 0) == 0 && f.rfind(mine, 0) != 0) ::unlinkat(::dirfd(d), f.c_str(), 0);
  }
  ::closedir(d);
}

}  // namespace erun::state_internal
