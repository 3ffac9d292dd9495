// A torchrun-style worker for erun's restart mode. It links nothing of erun:
// like an unmodified PyTorch script it reads RANK, WORLD_SIZE, LOCAL_RANK,
// MASTER_ADDR, MASTER_PORT and TORCHELASTIC_RESTART_COUNT, forms a star of TCP
// connections around rank 0, runs "steps" that are a real sum-allreduce over
// those sockets, and resumes from its own checkpoint after a restart.
//
//   restart_worker --checkpoint DIR [--epochs N] [--steps-per-epoch K] [--step-ms M]
//
// Every step, rank r contributes the sum of the sample ids it owns in that
// step's global batch (ids i with i % WORLD_SIZE == r); rank 0 adds them up and
// sends the total back. The total does not depend on the world size, so the
// final checksum of a run restarted at a different size matches an
// uninterrupted one. Rank 0 checks each total, which catches wrong RANK or
// WORLD_SIZE values.
//
// Exit codes: 0 done; 2 bad arguments or environment; 3 could not form the
// group (connect/accept deadline, inconsistent peers); 4 a peer connection
// broke or timed out mid-run (the launcher should restart the job); 5 the
// checkpoint could not be read or written. SIGTERM ends it (default action).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr int64_t kMagic = 0x65727573746172LL;  // "erustar"
constexpr auto kFormDeadline = std::chrono::seconds(60);
constexpr auto kHelloDeadline = std::chrono::seconds(5);
constexpr auto kStepDeadline = std::chrono::seconds(60);
constexpr int64_t kBatch = 64;  // sample ids per global step

enum ExitCode { kOk = 0, kUsage = 2, kFormFailed = 3, kPeerLost = 4, kCheckpointFailed = 5 };

[[noreturn]] void die(int code, const std::string& msg) {
  std::fprintf(stderr, "restart_worker: %s\n", msg.c_str());
  std::fflush(stdout);
  std::_Exit(code);
}

struct Env {
  int rank = 0, world = 1, local_rank = 0, restart = 0;
  std::string master_addr;
  int master_port = 0;
};

struct Args {
  std::string checkpoint;
  int64_t epochs = 5, steps_per_epoch = 10, step_ms = 100;
};

int64_t parse_int(const std::string& what, const char* text, int64_t lo, int64_t hi) {
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v < lo || v > hi)
    die(kUsage, what + "='" + text + "' is not an integer in [" + std::to_string(lo) + ", " +
                    std::to_string(hi) + "]");
  return v;
}

int env_int(const char* name, bool required, int lo, int hi, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') {
    if (required)
      die(kUsage, std::string(name) + " is not set; run this under erun or torchrun, or set " +
                      "RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT yourself");
    return fallback;
  }
  return static_cast<int>(parse_int(name, v, lo, hi));
}

Env read_env() {
  Env e;
  e.world = env_int("WORLD_SIZE", true, 1, 1 << 20, 1);
  e.rank = env_int("RANK", true, 0, e.world - 1, 0);
  e.local_rank = env_int("LOCAL_RANK", false, 0, 1 << 20, 0);
  e.restart = env_int("TORCHELASTIC_RESTART_COUNT", false, 0, 1 << 30, 0);
  const char* addr = std::getenv("MASTER_ADDR");
  e.master_addr = addr != nullptr && *addr != '\0' ? addr : "";
  if (e.world > 1 && e.master_addr.empty()) die(kUsage, "MASTER_ADDR is not set");
  e.master_port = env_int("MASTER_PORT", e.world > 1, 1, 65535, 0);
  return e;
}

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) die(kUsage, flag + " needs a value");
      return argv[++i];
    };
    if (flag == "--checkpoint") a.checkpoint = value();
    else if (flag == "--epochs") a.epochs = parse_int(flag, value(), 1, 1 << 30);
    else if (flag == "--steps-per-epoch") a.steps_per_epoch = parse_int(flag, value(), 1, 1 << 30);
    else if (flag == "--step-ms") a.step_ms = parse_int(flag, value(), 0, 3600000);
    else if (flag == "-h" || flag == "--help") {
      std::printf("usage: restart_worker --checkpoint DIR [--epochs N] [--steps-per-epoch K] "
                  "[--step-ms M]\n");
      std::exit(0);
    } else {
      die(kUsage, "unknown argument '" + flag + "' (see --help)");
    }
  }
  if (a.checkpoint.empty()) die(kUsage, "--checkpoint DIR is required");
  return a;
}

// ---- sockets -------------------------------------------------------------

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) { reset(); fd_ = o.fd_; o.fd_ = -1; }
    return *this;
  }
  int get() const { return fd_; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

int remaining_ms(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(left);
}

// Waits for `events` on fd until the deadline. False on timeout.
bool wait_fd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int n = ::poll(&p, 1, remaining_ms(deadline));
    if (n > 0) return true;
    if (n == 0) return false;
    if (errno != EINTR) return false;
  }
}

// Sends/receives exactly `bytes` or returns an error text ("" on success).
std::string send_all(int fd, const void* data, size_t bytes, Clock::time_point deadline) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    if (!wait_fd(fd, POLLOUT, deadline)) return "send timed out";
    ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return std::strerror(errno);
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return "";
}

std::string recv_all(int fd, void* data, size_t bytes, Clock::time_point deadline) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    if (!wait_fd(fd, POLLIN, deadline)) return "timed out waiting for data";
    ssize_t n = ::recv(fd, p, bytes, 0);
    if (n == 0) return "connection closed by peer";
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return std::strerror(errno);
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return "";
}

struct Msg {
  int64_t magic = kMagic;
  int64_t a = 0, b = 0, c = 0, d = 0;
};

sockaddr_in resolve(const Env& env) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(env.master_addr.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr)
    die(kFormFailed, "cannot resolve MASTER_ADDR='" + env.master_addr + "': " + gai_strerror(rc));
  sockaddr_in sa{};
  std::memcpy(&sa, res->ai_addr, sizeof(sa));
  ::freeaddrinfo(res);
  sa.sin_port = htons(static_cast<uint16_t>(env.master_port));
  return sa;
}

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

std::string where(const Env& env) {
  return env.master_addr + ":" + std::to_string(env.master_port);
}

// Rank 0: accepts one connection per other rank. A connection that sends no
// valid hello in time, or one from another restart round, is dropped.
std::vector<Fd> accept_peers(const Env& env) {
  Fd lfd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (lfd.get() < 0) die(kFormFailed, std::string("socket: ") + std::strerror(errno));
  int one = 1;
  ::setsockopt(lfd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in sa = resolve(env);
  if (::bind(lfd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0)
    die(kFormFailed, "rank 0 cannot listen on MASTER_ADDR:MASTER_PORT=" + where(env) + ": " +
                         std::strerror(errno) + " (is another job using this port?)");
  if (::listen(lfd.get(), 128) != 0) die(kFormFailed, std::string("listen: ") + std::strerror(errno));

  std::vector<Fd> peers(env.world);
  int missing = env.world - 1;
  auto deadline = Clock::now() + kFormDeadline;
  while (missing > 0) {
    if (!wait_fd(lfd.get(), POLLIN, deadline))
      die(kFormFailed, "rank 0: only " + std::to_string(env.world - 1 - missing) + " of " +
                           std::to_string(env.world - 1) + " peers connected to " + where(env) +
                           " within 60 s; check WORLD_SIZE and that every rank was started");
    Fd c(::accept4(lfd.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (c.get() < 0) continue;
    Msg hello;
    auto err = recv_all(c.get(), &hello, sizeof(hello), std::min(deadline, Clock::now() + kHelloDeadline));
    if (!err.empty() || hello.magic != kMagic) continue;  // not one of ours
    int r = static_cast<int>(hello.a);
    if (hello.b != env.world || hello.c != env.restart) {
      std::fprintf(stderr, "restart_worker: rank 0 dropped a connection from rank %d with "
                   "WORLD_SIZE=%lld restart=%lld (mine: %d, %d)\n", r,
                   static_cast<long long>(hello.b), static_cast<long long>(hello.c), env.world, env.restart);
      continue;
    }
    if (r <= 0 || r >= env.world) continue;
    if (peers[r].get() >= 0)
      die(kFormFailed, "two workers claim RANK=" + std::to_string(r) + "; check the launcher");
    set_nodelay(c.get());
    peers[r] = std::move(c);
    --missing;
  }
  return peers;
}

// Ranks > 0: connects to rank 0, retrying until the deadline, and says hello.
Fd connect_master(const Env& env) {
  sockaddr_in sa = resolve(env);
  auto deadline = Clock::now() + kFormDeadline;
  std::string last = "no attempt";
  while (Clock::now() < deadline) {
    Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (fd.get() < 0) die(kFormFailed, std::string("socket: ") + std::strerror(errno));
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0) {
      set_nodelay(fd.get());
      Msg hello{kMagic, env.rank, env.world, env.restart, 0};
      auto err = send_all(fd.get(), &hello, sizeof(hello), deadline);
      if (err.empty()) return fd;
      last = err;
    } else {
      last = std::strerror(errno);
    }
    std::this_thread::sleep_for(milliseconds(100));
  }
  die(kFormFailed, "rank " + std::to_string(env.rank) + " could not connect to rank 0 at " +
                       "MASTER_ADDR:MASTER_PORT=" + where(env) + " within 60 s (last error: " + last +
                       "); check MASTER_ADDR/MASTER_PORT and that rank 0 is running");
}

// ---- checkpoint ----------------------------------------------------------

struct Checkpoint {
  int64_t next_epoch = 0;
  uint64_t checksum = 0;
};

Checkpoint load_checkpoint(const std::string& dir) {
  std::string path = dir + "/ckpt";
  std::ifstream in(path);
  if (!in) return {};
  Checkpoint c;
  std::string key1, key2;
  if (!(in >> key1 >> c.next_epoch >> key2 >> c.checksum) || key1 != "epoch" || key2 != "checksum")
    die(kCheckpointFailed, "checkpoint " + path + " is corrupt; delete it to start over");
  return c;
}

void fsync_path(const std::string& path, int flags) {
  int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) die(kCheckpointFailed, "cannot open " + path + ": " + std::strerror(errno));
  if (::fsync(fd) != 0) die(kCheckpointFailed, "fsync " + path + ": " + std::strerror(errno));
  ::close(fd);
}

// tmp + fsync + rename + fsync(dir): a crash leaves the old or the new file.
void save_checkpoint(const std::string& dir, const Checkpoint& c) {
  ::mkdir(dir.c_str(), 0755);
  std::string path = dir + "/ckpt", tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << "epoch " << c.next_epoch << "\nchecksum " << c.checksum << "\n";
    out.flush();
    if (!out) die(kCheckpointFailed, "cannot write " + tmp + "; check that --checkpoint " + dir + " is writable");
  }
  fsync_path(tmp, O_RDONLY);
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    die(kCheckpointFailed, "rename " + tmp + " -> " + path + ": " + std::strerror(errno));
  fsync_path(dir, O_RDONLY | O_DIRECTORY);
}

uint64_t mix(uint64_t h, int64_t v) {
  h ^= static_cast<uint64_t>(v) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdULL;
}

// Sum of the sample ids this rank owns in the global batch of step `global_step`.
int64_t my_share(const Env& env, int64_t global_step) {
  int64_t first = global_step * kBatch, sum = 0;
  for (int64_t i = first; i < first + kBatch; ++i)
    if (i % env.world == env.rank) sum += i;
  return sum;
}

int64_t expected_total(int64_t global_step) {
  int64_t first = global_step * kBatch;
  return kBatch * first + kBatch * (kBatch - 1) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  Args args = parse_args(argc, argv);
  Env env = read_env();

  // Rank 0 owns the checkpoint and hands the resume point to the others, so the
  // directory need not be shared between hosts.
  std::vector<Fd> peers;
  Fd master;
  Checkpoint ck;
  if (env.rank == 0) {
    ck = load_checkpoint(args.checkpoint);
    if (env.world > 1) peers = accept_peers(env);
    auto deadline = Clock::now() + kStepDeadline;
    for (int r = 1; r < env.world; ++r) {
      Msg welcome{kMagic, ck.next_epoch, static_cast<int64_t>(ck.checksum), 0, 0};
      auto err = send_all(peers[r].get(), &welcome, sizeof(welcome), deadline);
      if (!err.empty()) die(kPeerLost, "rank 0: lost rank " + std::to_string(r) + " at start: " + err);
    }
    if (ck.next_epoch > 0)
      std::printf("rank 0/%d resuming at epoch %lld from %s/ckpt (restart %d)\n", env.world,
                  static_cast<long long>(ck.next_epoch), args.checkpoint.c_str(), env.restart);
  } else {
    master = connect_master(env);
    Msg welcome;
    auto err = recv_all(master.get(), &welcome, sizeof(welcome), Clock::now() + kFormDeadline);
    if (!err.empty() || welcome.magic != kMagic)
      die(kFormFailed, "rank " + std::to_string(env.rank) + ": no start message from rank 0 at " +
                           where(env) + ": " + (err.empty() ? "bad magic" : err));
    ck.next_epoch = welcome.a;
    ck.checksum = static_cast<uint64_t>(welcome.b);
  }

  for (int64_t epoch = ck.next_epoch; epoch < args.epochs; ++epoch) {
    for (int64_t step = 0; step < args.steps_per_epoch; ++step) {
      if (args.step_ms > 0) std::this_thread::sleep_for(milliseconds(args.step_ms));
      int64_t gstep = epoch * args.steps_per_epoch + step;
      int64_t total = my_share(env, gstep);
      auto deadline = Clock::now() + kStepDeadline;
      if (env.rank == 0) {
        for (int r = 1; r < env.world; ++r) {
          Msg m;
          auto err = recv_all(peers[r].get(), &m, sizeof(m), deadline);
          if (err.empty() && (m.magic != kMagic || m.a != epoch || m.b != step)) err = "out-of-step message";
          if (!err.empty())
            die(kPeerLost, "rank 0: lost rank " + std::to_string(r) + " at epoch " + std::to_string(epoch) +
                               " step " + std::to_string(step) + ": " + err);
          total += m.c;
        }
        if (total != expected_total(gstep))
          die(kFormFailed, "allreduce total " + std::to_string(total) + " != expected " +
                               std::to_string(expected_total(gstep)) + "; RANK/WORLD_SIZE are inconsistent");
        for (int r = 1; r < env.world; ++r) {
          Msg reply{kMagic, epoch, step, total, 0};
          auto err = send_all(peers[r].get(), &reply, sizeof(reply), deadline);
          if (!err.empty())
            die(kPeerLost, "rank 0: lost rank " + std::to_string(r) + " at epoch " + std::to_string(epoch) + ": " + err);
        }
      } else {
        Msg m{kMagic, epoch, step, total, 0};
        auto err = send_all(master.get(), &m, sizeof(m), deadline);
        Msg reply;
        if (err.empty()) err = recv_all(master.get(), &reply, sizeof(reply), deadline);
        if (err.empty() && (reply.magic != kMagic || reply.a != epoch || reply.b != step))
          err = "out-of-step message";
        if (!err.empty())
          die(kPeerLost, "rank " + std::to_string(env.rank) + ": lost rank 0 at epoch " +
                             std::to_string(epoch) + " step " + std::to_string(step) + ": " + err);
        total = reply.c;
      }
      ck.checksum = mix(ck.checksum, total);
      std::printf("rank %d/%d epoch %lld step %lld restart %d\n", env.rank, env.world,
                  static_cast<long long>(epoch), static_cast<long long>(step), env.restart);
    }
    ck.next_epoch = epoch + 1;
    if (env.rank == 0) save_checkpoint(args.checkpoint, ck);
  }

  if (env.rank == 0)
    std::printf("done epochs=%lld checksum=%016llx\n", static_cast<long long>(args.epochs),
                static_cast<unsigned long long>(ck.checksum));
  return kOk;
}
