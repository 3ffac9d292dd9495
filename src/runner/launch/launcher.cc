#include "runner/launch/launcher.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <random>
#include <set>
#include <sstream>

namespace erun {
namespace {

// Listening TCP ports in /proc/net/tcp{,6} text.
std::set<int> listening_ports(const std::string& proc_net_tcp) {
  std::set<int> ports;
  std::istringstream in(proc_net_tcp);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string sl, local, remote, st;
    if (!(f >> sl >> local >> remote >> st)) continue;
    auto colon = local.rfind(':');
    if (colon == std::string::npos || st != "0A") continue;
    ports.insert(static_cast<int>(std::stol(local.substr(colon + 1), nullptr, 16)));
  }
  return ports;
}

}  // namespace

int find_free_local_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 29500;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  int port = 29500;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

int Launcher::free_port(const std::string& host, const std::string& secret, Duration timeout) {
  WorkerSpec probe;
  probe.host = host;
  probe.command = {"cat", "/proc/net/tcp", "/proc/net/tcp6"};
  probe.secret = secret;
  probe.term_grace = std::chrono::seconds(1);
  std::set<int> busy;
  if (auto h = launch(probe)) {
    std::string text;
    int fd = (*h)->take_stdout();
    if (fd >= 0) {
      read_all_until(fd, text, std::chrono::steady_clock::now() + timeout);
      ::close(fd);
    }
    int efd = (*h)->take_stderr();
    if (efd >= 0) ::close(efd);
    busy = listening_ports(text);
  }
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> pick(20000, 32000);
  int port = pick(rng);
  while (busy.count(port)) port = pick(rng);
  return port;
}

}  // namespace erun
