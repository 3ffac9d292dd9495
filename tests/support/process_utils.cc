#include "support/process_utils.h"

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/strings.h"

namespace erun::testing {

namespace {

char process_state(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return 0;
  size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return 0;
  return stat[close + 2];
}

// Live pids in /proc (this process and zombies left out) that `match`.
template <typename Match>
std::vector<pid_t> live_pids_where(Match match) {
  std::vector<pid_t> out;
  DIR* dir = ::opendir("/proc");
  if (!dir) return out;
  pid_t self = ::getpid();
  while (dirent* e = ::readdir(dir)) {
    long pid;
    if (!parse_int(e->d_name, pid) || pid == self) continue;
    if (match(static_cast<pid_t>(pid)) && pid_alive(static_cast<pid_t>(pid))) out.push_back(static_cast<pid_t>(pid));
  }
  ::closedir(dir);
  return out;
}

}  // namespace

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::vector<pid_t> pids_with_cmdline(const std::string& marker) {
  return live_pids_where([&](pid_t pid) { return cmdline_of(pid).find(marker) != std::string::npos; });
}

std::string cmdline_of(pid_t pid) {
  std::string s = read_file("/proc/" + std::to_string(pid) + "/cmdline");
  std::replace(s.begin(), s.end(), '\0', ' ');
  return s;
}

std::string environ_of(pid_t pid) {
  std::string s = read_file("/proc/" + std::to_string(pid) + "/environ");
  std::replace(s.begin(), s.end(), '\0', '\n');
  if (s.empty() || s.back() != '\n') s.push_back('\n');
  return "\n" + s;
}

std::vector<pid_t> pids_with_environ(const std::string& text) {
  return live_pids_where([&](pid_t pid) { return environ_of(pid).find(text) != std::string::npos; });
}

bool wait_no_process(const std::string& marker, Duration timeout, std::vector<pid_t>* left) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    auto pids = pids_with_cmdline(marker);
    if (pids.empty()) return true;
    if (std::chrono::steady_clock::now() >= deadline) {
      if (left) *left = pids;
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

bool pid_alive(pid_t pid) {
  if (pid <= 0 || ::kill(pid, 0) != 0) return false;
  char state = process_state(pid);
  return state != 0 && state != 'Z' && state != 'X';
}

bool wait_pid_gone(pid_t pid, Duration timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (pid_alive(pid)) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

std::string describe_pids(const std::vector<pid_t>& pids) {
  std::string out;
  for (pid_t p : pids) out += std::to_string(p) + ": " + cmdline_of(p).substr(0, 200) + "\n";
  return out;
}

bool wait_file_lines(const std::string& path, size_t lines, Duration timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    std::string s = read_file(path);
    if (static_cast<size_t>(std::count(s.begin(), s.end(), '\n')) >= lines) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

pid_t worker_on_host(const std::string& program, const std::string& host) {
  for (pid_t pid : pids_with_cmdline(program)) {
    if (read_file("/proc/" + std::to_string(pid) + "/cmdline").rfind(program + std::string(1, '\0'), 0) != 0) continue;
    if (environ_of(pid).find("\nERUN_HOSTNAME=" + host + "\n") != std::string::npos) return pid;
  }
  return 0;
}

pid_t parent_of(pid_t pid) {
  std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(stat.substr(close + 1));
  std::string state;
  long ppid = 0;
  if (!(rest >> state >> ppid)) return 0;
  return static_cast<pid_t>(ppid);
}

std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(name));
    if (parent_of(pid) == parent && pid_alive(pid)) out.push_back(pid);
  }
  return out;
}

std::set<std::string> socket_inodes(const std::vector<pid_t>& pids) {
  std::set<std::string> out;
  for (pid_t pid : pids) {
    std::error_code ec;
    for (auto& e : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
      const std::string t = std::filesystem::read_symlink(e.path(), ec).string();
      if (!ec && t.rfind("socket:[", 0) == 0) out.insert(t.substr(8, t.size() - 9));
    }
  }
  return out;
}

std::vector<std::string> listening(const std::set<std::string>& inodes) {
  std::vector<std::string> out;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::istringstream in(read_file(table));
    std::string line;
    std::getline(in, line);  // the column names
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::string sl, local, remote, st, queues, tr, retr, uid, timeout, inode;
      f >> sl >> local >> remote >> st >> queues >> tr >> retr >> uid >> timeout >> inode;
      if (st == "0A" && inodes.count(inode)) out.push_back(local);
    }
  }
  return out;
}

}  // namespace erun::testing
