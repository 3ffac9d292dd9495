#include "store/file_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <thread>

#include "common/private_files.h"
#include "erun/errors.hpp"

namespace erun {
namespace {

std::string errno_text() { return std::strerror(errno); }

// Keys may hold '/', spaces or anything else; file names get [A-Za-z0-9._-]
// and %XX for every other byte.
std::string escape_key(const std::string& key) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : key) {
    if (std::isalnum(c) || c == '.' || c == '_' || c == '-') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  if (out.empty() || out[0] == '.') out = "%" + out;  // never hidden, never "." or ".."
  return out;
}

bool read_file(const std::string& path, std::vector<char>& out) {
  int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return false;
  out.clear();
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.insert(out.end(), buf, buf + n);
  }
  ::close(fd);
  return true;
}

}  // namespace

FileKvStore::FileKvStore(std::string dir) : dir_(std::move(dir)) {
  if (Status ok = ensure_private_dir(dir_, "file store directory"); !ok) {
    throw CommError("file store: " + ok.message() + "; give a directory of this user shared by all ranks");
  }
  if (::access(dir_.c_str(), W_OK) != 0) {
    throw CommError("file store: directory '" + dir_ + "' cannot be written (" + errno_text() +
                    "); give a writable directory shared by all ranks");
  }
}

std::string FileKvStore::path_of(const std::string& key) const { return dir_ + "/" + escape_key(key); }

void FileKvStore::set(const std::string& key, const std::vector<char>& value) {
  const std::string target = path_of(key);
  int dfd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) throw CommError("file store: cannot open directory '" + dir_ + "': " + errno_text());
  // A new private file under a random name, never one planted there (nor a link).
  std::string tmp_name;
  Result<int> created = create_private_temp(dfd, dir_, ".tmp.", &tmp_name);
  if (!created) {
    ::close(dfd);
    throw CommError("file store: " + created.message());
  }
  const int fd = created.value();
  const std::string tmp = dir_ + "/" + tmp_name;
  size_t done = 0;
  while (done < value.size()) {
    ssize_t n = ::write(fd, value.data() + done, value.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      std::string err = errno_text();
      ::close(fd);
      ::unlinkat(dfd, tmp_name.c_str(), 0);
      ::close(dfd);
      throw CommError("file store: cannot write '" + tmp + "': " + err);
    }
    done += static_cast<size_t>(n);
  }
  ::fsync(fd);
  ::close(fd);
  // rename replaces a link planted at the key's name instead of following it.
  if (::renameat(dfd, tmp_name.c_str(), dfd, escape_key(key).c_str()) != 0) {
    std::string err = errno_text();
    ::unlinkat(dfd, tmp_name.c_str(), 0);
    ::close(dfd);
    throw CommError("file store: cannot publish key '" + key + "' as '" + target + "': " + err);
  }
  ::close(dfd);
}

std::vector<char> FileKvStore::get(const std::string& key, Duration timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const std::string path = path_of(key);
  auto pause = std::chrono::microseconds(200);
  std::vector<char> value;
  for (;;) {
    if (read_file(path, value)) return value;
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      throw CommError("file store: timed out after " + std::to_string(seconds(timeout)) + " s waiting for key '" +
                      key + "' in '" + dir_ + "'; is every rank running and using the same directory?");
    }
    std::this_thread::sleep_for(std::min<Duration>(pause, deadline - now));
    pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(20));
  }
}

bool FileKvStore::check(const std::vector<std::string>& keys) {
  struct stat st;
  for (auto& k : keys) {
    if (::stat(path_of(k).c_str(), &st) != 0) return false;
  }
  return true;
}

}  // namespace erun
