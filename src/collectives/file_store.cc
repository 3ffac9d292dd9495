#include "collectives/file_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <thread>

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
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
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
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec || ::access(dir_.c_str(), W_OK) != 0) {
    throw CommError("file store: directory '" + dir_ + "' cannot be created or written (" +
                    (ec ? ec.message() : errno_text()) + "); give a writable directory shared by all ranks");
  }
}

std::string FileKvStore::path_of(const std::string& key) const { return dir_ + "/" + escape_key(key); }

void FileKvStore::set(const std::string& key, const std::vector<char>& value) {
  static std::atomic<unsigned> counter{0};
  const std::string target = path_of(key);
  const std::string tmp = dir_ + "/.tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw CommError("file store: cannot create '" + tmp + "': " + errno_text());
  size_t done = 0;
  while (done < value.size()) {
    ssize_t n = ::write(fd, value.data() + done, value.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      std::string err = errno_text();
      ::close(fd);
      ::unlink(tmp.c_str());
      throw CommError("file store: cannot write '" + tmp + "': " + err);
    }
    done += static_cast<size_t>(n);
  }
  ::fsync(fd);
  ::close(fd);
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    std::string err = errno_text();
    ::unlink(tmp.c_str());
    throw CommError("file store: cannot publish key '" + key + "' as '" + target + "': " + err);
  }
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
