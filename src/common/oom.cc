#include "common/oom.h"

#include <fcntl.h>
#include <unistd.h>

#include <sstream>
#include <vector>

#include "common/fd.h"
#include "common/strings.h"

namespace erun {
namespace {

std::string read_small(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return "";
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd.get(), buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  return out;
}

std::vector<std::string> fields_of(const std::string& line) {
  std::vector<std::string> f;
  std::istringstream in(line);
  for (std::string w; in >> w;) f.push_back(w);
  return f;
}

bool has_option(const std::string& options, const std::string& name) {
  std::istringstream in(options);
  for (std::string o; std::getline(in, o, ',');) {
    if (o == name) return true;
  }
  return false;
}

}  // namespace

std::optional<uint64_t> OomWatch::parse_count(const std::string& text) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    auto f = fields_of(line);
    if (f.size() != 2 || f[0] != "oom_kill") continue;
    try {
      size_t used = 0;
      uint64_t v = std::stoull(f[1], &used);
      if (used == f[1].size()) return v;
    } catch (const std::exception&) {
    }
    return std::nullopt;
  }
  return std::nullopt;
}

OomWatch OomWatch::of(const std::string& proc_cgroup, const std::string& proc_mounts) {
  // The process's place: v1's memory hierarchy ("N:memory:/path", maybe
  // beside other controllers) first, else v2's ("0::/path").
  std::string v1_path, v2_path;
  bool have_v1 = false, have_v2 = false;
  std::istringstream cg(proc_cgroup);
  for (std::string line; std::getline(cg, line);) {
    size_t a = line.find(':');
    size_t b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (controllers.empty() && line.substr(0, a) == "0") {
      v2_path = path;
      have_v2 = true;
    } else if (has_option(controllers, "memory")) {
      v1_path = path;
      have_v1 = true;
    }
  }
  std::string v1_mount, v2_mount;
  std::istringstream mounts(proc_mounts);
  for (std::string line; std::getline(mounts, line);) {
    auto f = fields_of(line);
    if (f.size() < 4) continue;
    if (f[2] == "cgroup" && has_option(f[3], "memory") && v1_mount.empty()) v1_mount = f[1];
    if (f[2] == "cgroup2" && v2_mount.empty()) v2_mount = f[1];
  }
  OomWatch w;
  std::string file;
  if (have_v1 && !v1_mount.empty()) {
    file = v1_mount + (v1_path == "/" ? "" : v1_path) + "/memory.oom_control";
  } else if (have_v2 && !v2_mount.empty()) {
    file = v2_mount + (v2_path == "/" ? "" : v2_path) + "/memory.events";
  }
  if (file.empty()) return w;
  auto count = parse_count(read_small(file));
  if (!count) return w;  // no memory controller there (a v2 root, a hybrid's unified tree)
  w.file_ = file;
  w.at_start_ = *count;
  return w;
}

OomWatch OomWatch::of(pid_t pid) {
  const std::string cgroup = read_small("/proc/" + std::to_string(pid) + "/cgroup");
  if (cgroup.empty()) return {};
  return of(cgroup, read_small("/proc/self/mounts"));
}

bool OomWatch::fired() const {
  if (file_.empty()) return false;
  auto now = parse_count(read_small(file_));
  return now && *now > at_start_;
}

}  // namespace erun
