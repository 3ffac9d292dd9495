// The kernel's OOM killer ends a worker, then an agent (issue 47, point 4).
// The job runs in a memory cgroup of its own (v1's memory controller or v2);
// the victim is made the OOM killer's choice (oom_score_adj 1000) and a hog in
// the same cgroup allocates past a limit just above
// what the job uses: the kernel, not the test, sends the SIGKILL. A worker's
// kill is recovered in place and its line says "killed by the OOM killer"
// (the agent reads its cgroup's OOM kill count); an agent's kill fails its
// host, says the same, and the job resumes at the last commit. Both end at
// the uninterrupted model with nothing left behind. An agent on another host,
// reached over ssh, is named so too: its watchdog tells erun (ENDED), where
// erun itself sees only ssh's exit 255. Skips without root or a memory
// cgroup it can make.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "common/oom.h"
#include "support/erun_process.h"
#include "support/process_utils.h"
#include "support/sshd.h"

namespace erun::testing {
namespace {

using namespace std::chrono_literals;

// A memory cgroup of the test's own, removed (its processes moved out) at the
// end; invalid (dir() empty) where it cannot be made.
class MemoryCgroup {
 public:
  MemoryCgroup() {
    const std::string name = "erun-oom-test-" + std::to_string(::getpid());
    std::ifstream mounts("/proc/self/mounts");
    std::string dev, mnt, type, opts;
    std::string v1, v2;
    for (std::string line; std::getline(mounts, line);) {
      std::istringstream in(line);
      if (!(in >> dev >> mnt >> type >> opts)) continue;
      if (type == "cgroup" && ("," + opts + ",").find(",memory,") != std::string::npos) v1 = mnt;
      if (type == "cgroup2" && v2.empty()) v2 = mnt;
    }
    if (!v1.empty()) {
      v1_ = true;
      dir_ = v1 + "/" + name;
    } else if (!v2.empty() && read_file(v2 + "/cgroup.subtree_control").find("memory") != std::string::npos) {
      dir_ = v2 + "/" + name;
    }
    if (dir_.empty() || ::mkdir(dir_.c_str(), 0755) != 0 || !OomWatch::parse_count(read_file(counter_file()))) {
      if (!dir_.empty()) ::rmdir(dir_.c_str());
      dir_.clear();
    }
  }
  ~MemoryCgroup() {
    if (dir_.empty()) return;
    set_limit(-1);
    // Whatever is left (nothing, when the job ended) goes back to the root.
    const std::string parent = dir_.substr(0, dir_.rfind('/'));
    std::istringstream procs(read_file(dir_ + "/cgroup.procs"));
    for (std::string pid; procs >> pid;) write(parent + "/cgroup.procs", pid);
    for (int i = 0; i < 50 && ::rmdir(dir_.c_str()) != 0; ++i) std::this_thread::sleep_for(100ms);
  }
  const std::string& dir() const { return dir_; }
  std::string counter_file() const { return dir_ + (v1_ ? "/memory.oom_control" : "/memory.events"); }
  uint64_t oom_kills() const { return OomWatch::parse_count(read_file(counter_file())).value_or(0); }
  uint64_t usage() const {
    return std::stoull(read_file(dir_ + (v1_ ? "/memory.usage_in_bytes" : "/memory.current")));
  }
  // Bytes, or -1 for none.
  bool set_limit(long long bytes) const {
    const std::string v = bytes < 0 ? (v1_ ? "-1" : "max") : std::to_string(bytes);
    return write(dir_ + (v1_ ? "/memory.limit_in_bytes" : "/memory.max"), v);
  }
  // Runs a command in this cgroup: the wrapper for ErunProcess.
  std::vector<std::string> wrapper() const {
    return {"/bin/sh", "-c", "echo $$ > " + dir_ + "/cgroup.procs && exec \"$0\" \"$@\""};
  }

  // Makes `victim` the OOM killer's choice, then allocates in this cgroup,
  // beyond a limit 48 MiB above what it uses, until the kernel kills: true
  // when its OOM kill count rose (and the victim is gone), within 30 s.
  bool oom_kill(pid_t victim) const {
    if (!write("/proc/" + std::to_string(victim) + "/oom_score_adj", "1000")) return false;
    const uint64_t before = oom_kills();
    if (!set_limit(static_cast<long long>(usage()) + (48ll << 20))) return false;
    const std::string procs = dir_ + "/cgroup.procs", counter = counter_file();
    pid_t hog = ::fork();
    if (hog == 0) {
      // Only system calls from here: the test is multi-threaded.
      char pid[32];
      int n = std::snprintf(pid, sizeof pid, "%d\n", static_cast<int>(::getpid()));
      int fd = ::open(procs.c_str(), O_WRONLY);
      if (fd < 0 || ::write(fd, pid, n) != n) ::_exit(2);
      ::close(fd);
      // Exempt where it may be (lowering it takes CAP_SYS_RESOURCE); the
      // victim's 1000 outranks it either way.
      fd = ::open("/proc/self/oom_score_adj", O_WRONLY);
      if (fd >= 0) (void)!::write(fd, "-1000", 5);
      if (fd >= 0) ::close(fd);
      for (int mib = 0; mib < 1024; ++mib) {
        void* p = ::mmap(nullptr, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) ::_exit(4);
        std::memset(p, 1, 1 << 20);
        char text[512] = {};
        fd = ::open(counter.c_str(), O_RDONLY);
        ssize_t got = fd < 0 ? -1 : ::read(fd, text, sizeof text - 1);
        if (fd >= 0) ::close(fd);
        const char* at = got > 0 ? std::strstr(text, "oom_kill ") : nullptr;
        if (at && std::strtoull(at + 9, nullptr, 10) > before) ::_exit(0);
      }
      ::_exit(5);
    }
    if (hog < 0) return false;
    int status = 0;
    const auto until = std::chrono::steady_clock::now() + 30s;
    while (::waitpid(hog, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > until) {
        ::kill(hog, SIGKILL);
        ::waitpid(hog, &status, 0);
        break;
      }
      std::this_thread::sleep_for(20ms);
    }
    set_limit(-1);
    if (oom_kills() > before) return true;
    ADD_FAILURE() << "the hog ended with wait status " << status << "; OOM kills " << oom_kills() << " (before " << before << ")";
    return false;
  }

 private:
  static bool write(const std::string& path, const std::string& text) {
    int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) return false;
    bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    ::close(fd);
    return ok;
  }
  std::string dir_;
  bool v1_ = false;
};

class ErunOom : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root for a memory cgroup";
    if (cgroup_.dir().empty()) GTEST_SKIP() << "no memory cgroup could be made (cgroup v1 memory or v2)";
    // A copy of its own: its workers are found by this path while other
    // tests' jobs run beside it (tests/CMakeLists.txt, _own_copy_tests).
    program_ = dir_.file("train_mlp_oom");
    std::filesystem::copy_file(build_path("examples/train_mlp"), program_);
    ::chmod(program_.c_str(), 0755);
    dir_.write("discover.sh", "#!/bin/sh\necho localhost:2\n", true);
  }
  std::unique_ptr<ErunProcess> start(std::vector<std::string> launch = {"--launcher", "local"}) {
    std::vector<std::string> a = {"--host-discovery-script", dir_.file("discover.sh"), "-np", "2", "--min-np", "1",
                                  "--blacklist-after", "5", "--term-grace", "2", "--event-log",
                                  dir_.file("events.jsonl")};
    a.insert(a.end(), launch.begin(), launch.end());
    a.push_back(program_);
    a.insert(a.end(), kTrainMlpArgs.begin(), kTrainMlpArgs.end());
    return std::make_unique<ErunProcess>(a, std::vector<std::string>{}, cgroup_.wrapper());
  }
  std::vector<pid_t> workers() {
    std::vector<pid_t> out;
    for (pid_t pid : pids_with_cmdline(program_)) {
      if (read_file("/proc/" + std::to_string(pid) + "/cmdline").rfind(program_ + std::string(1, '\0'), 0) == 0) {
        out.push_back(pid);
      }
    }
    return out;
  }
  void expect_exact_and_nothing_left(ErunProcess& p) {
    ASSERT_FALSE(uninterrupted_checksum().empty());
    ASSERT_NO_FATAL_FAILURE(expect_trained_exactly(p, uninterrupted_checksum()));
    EXPECT_EQ(p.count("epoch 0 "), 1u) << "training started over\n" << p.out();
    std::vector<pid_t> left;
    EXPECT_TRUE(wait_no_process(program_, 20s, &left)) << describe_pids(left);
    EXPECT_EQ(read_file(cgroup_.dir() + "/cgroup.procs"), "") << "processes left in the job's cgroup";
  }

  MemoryCgroup cgroup_;
  TempDir dir_;
  std::string program_;
};

TEST_F(ErunOom, AWorkerTheOomKillerEndsIsRecoveredInPlaceAndNamedSo) {
  auto p = start();
  ASSERT_TRUE(p->wait_output("epoch 1 ", 120s)) << p->out() << p->err();
  auto w = workers();
  ASSERT_EQ(w.size(), 2u);
  ASSERT_TRUE(cgroup_.oom_kill(w[1])) << "the kernel killed nothing\n" << p->err();
  EXPECT_TRUE(wait_pid_gone(w[1], 10s)) << "the OOM killer chose another process";
  ASSERT_TRUE(p->wait_output("(killed by the OOM killer)", 20s)) << p->err();
  EXPECT_TRUE(p->wait_output("survivors re-join in place", 20s)) << p->err();
  ASSERT_NO_FATAL_FAILURE(expect_exact_and_nothing_left(*p));
  const std::string events = read_file(dir_.file("events.jsonl"));
  EXPECT_NE(events.find("\"exit_code\":137,\"oom_killed\":true"), std::string::npos) << events;
}

TEST_F(ErunOom, AnAgentTheOomKillerEndsFailsItsHostAndTheJobResumesAtTheLastCommit) {
  auto p = start();
  ASSERT_TRUE(p->wait_output("epoch 2 ", 120s)) << p->out() << p->err();
  pid_t agent = 0;
  for (pid_t pid : pids_with_cmdline("--agent")) {
    if (read_file("/proc/" + std::to_string(pid) + "/status").find("PPid:\t" + std::to_string(p->pid()) + "\n") !=
        std::string::npos) {
      agent = pid;
    }
  }
  ASSERT_GT(agent, 0);
  ASSERT_TRUE(cgroup_.oom_kill(agent)) << "the kernel killed nothing\n" << p->err();
  ASSERT_TRUE(p->wait_output("agent on localhost lost", 20s)) << p->err();
  EXPECT_NE(p->err().find("ended with signal 9 (killed by the OOM killer)"), std::string::npos) << p->err();
  ASSERT_NO_FATAL_FAILURE(expect_exact_and_nothing_left(*p));
  EXPECT_NE((p->err() + p->out()).find("from host memory"), std::string::npos) << "not resumed at the last commit";
}

TEST_F(ErunOom, AnAgentOverSshTheOomKillerEndsIsNamedSoThoughSshSaysOnly255) {
  auto server = SshServer::start({"127.0.0.2"});
  ERUN_REQUIRE_SSHD(server);
  dir_.write("discover.sh", "#!/bin/sh\necho 127.0.0.2:2\n", true);
  auto p = start(server->erun_args());
  ASSERT_TRUE(p->wait_output("epoch 2 ", 120s)) << p->out() << p->err();
  // The agent runs under the test's sshd: this job's agent is its worker's
  // parent. Into the job's cgroup with it (not its workers), so that the
  // kernel's OOM killer there may choose it.
  auto w = workers();
  ASSERT_FALSE(w.empty());
  const pid_t agent = parent_of(w[0]);
  ASSERT_NE(cmdline_of(agent).find(" --agent "), std::string::npos) << cmdline_of(agent);
  {
    std::ofstream procs(cgroup_.dir() + "/cgroup.procs");
    procs << agent << "\n";
  }
  ASSERT_NE(read_file(cgroup_.dir() + "/cgroup.procs").find(std::to_string(agent)), std::string::npos);
  std::this_thread::sleep_for(2500ms);  // its watchdog reads the agent's cgroup at its next word (every second)
  ASSERT_TRUE(cgroup_.oom_kill(agent)) << "the kernel killed nothing\n" << p->err();
  ASSERT_TRUE(p->wait_output("agent on 127.0.0.2 lost", 20s)) << p->err();
  EXPECT_NE(p->err().find("the agent was killed by the OOM killer on the host (its ssh process ended with exit code 255"),
            std::string::npos)
      << p->err();
  EXPECT_NE(p->err().find("the memory of the host"), std::string::npos) << "no OOM hint\n" << p->err();
  ASSERT_NO_FATAL_FAILURE(expect_exact_and_nothing_left(*p));
  EXPECT_NE((p->err() + p->out()).find("from host memory"), std::string::npos) << "not resumed at the last commit";
}

}  // namespace
}  // namespace erun::testing
