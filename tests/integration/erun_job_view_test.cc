// Seeing the job (docs/design.md, "Seeing the job"): examples/train_mlp (a
// copy of its own, found by path) on two simulated hosts under the real erun,
// one worker SIGKILLed. Its Prometheus page follows the job (world size,
// generation, resets, recoveries, commits); the summary erun prints at the
// end adds up to the wall time and is what `erun report` prints from the
// event log; the picture is one self-contained file. On a terminal (a real
// pty) erun keeps its status line at the bottom, with the workers' lines and
// its warnings whole above it.
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "support/erun_process.h"
#include "support/process_utils.h"

namespace erun::testing {
namespace {

using namespace std::chrono_literals;

// GET /metrics from 127.0.0.1:port; "" when it cannot connect.
std::string scrape(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    const std::string req = "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n";
    (void)!::write(fd, req.data(), req.size());
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

// A sample's value in a Prometheus page ("erun_world_size", or with its
// labels: "erun_resets_total{reason=\"worker failed\"}"); NAN when absent.
double sample(const std::string& page, const std::string& name) {
  std::istringstream in(page);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
  }
  return NAN;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs a command to its end: its stdout; its exit code in *code.
std::string command_output(const std::vector<std::string>& argv, int* code) {
  SpawnOptions o;
  o.argv = argv;
  o.pipe_stderr = false;
  auto p = Subprocess::spawn(o);
  if (!p) {
    *code = -1;
    return p.message();
  }
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(p->stdout_fd(), buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  auto s = p->wait_for(60s);
  *code = s ? s->shell_code() : -1;
  return out;
}

class ErunJobView : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(uninterrupted_checksum().empty());
    program_ = dir_.file("train_mlp_view");
    std::filesystem::copy_file(build_path("examples/train_mlp"), program_);
    ::chmod(program_.c_str(), 0755);
    dir_.write("hosts", "127.0.0.2:1\n127.0.0.3:1\n");
    dir_.write("discover.sh", "#!/bin/sh\ncat " + dir_.file("hosts") + "\n", true);
  }
  void TearDown() override {
    std::vector<pid_t> left;
    EXPECT_TRUE(wait_no_process(program_, 30s, &left)) << describe_pids(left);
  }
  std::vector<std::string> args(std::vector<std::string> extra) {
    std::vector<std::string> a = {"--launcher", "local", "--host-discovery-script", dir_.file("discover.sh"),
                                  "--discovery-interval", "0.2", "-np", "2", "--min-np", "1", "--term-grace", "2",
                                  "--event-log", dir_.file("events.jsonl")};
    a.insert(a.end(), extra.begin(), extra.end());
    a.push_back(program_);
    a.insert(a.end(), kTrainMlpArgs.begin(), kTrainMlpArgs.end());
    return a;
  }
  TempDir dir_;
  std::string program_;
};

TEST_F(ErunJobView, MetricsSummaryAndReportTellTheSameJob) {
  ErunProcess p(args({"--metrics-port", "0"}));
  ASSERT_TRUE(p.started()) << p.start_error();
  ASSERT_TRUE(p.wait_output("/metrics", 60s)) << p.err();
  std::smatch m;
  const std::string err = p.err();
  ASSERT_TRUE(std::regex_search(err, m, std::regex("metrics at http://127\\.0\\.0\\.1:([0-9]+)/metrics"))) << err;
  const int port = std::stoi(m[1].str());

  ASSERT_TRUE(p.wait_output("epoch 2 ", 120s)) << p.out() << p.err();
  std::string page;
  for (int i = 0; i < 50 && !(sample(page, "erun_last_commit_id") > 0); ++i) {
    std::this_thread::sleep_for(100ms);
    page = scrape(port);
  }
  EXPECT_NE(page.find("Content-Type: text/plain; version=0.0.4"), std::string::npos) << page;
  EXPECT_EQ(sample(page, "erun_world_size"), 2) << page;
  EXPECT_EQ(sample(page, "erun_generation"), 1) << page;
  EXPECT_EQ(sample(page, "erun_hosts"), 2) << page;
  EXPECT_GT(sample(page, "erun_last_commit_id"), 0) << page;
  EXPECT_GT(sample(page, "erun_goodput_ratio"), 0) << page;
  EXPECT_LE(sample(page, "erun_goodput_ratio"), 1) << page;
  EXPECT_EQ(sample(page, "erun_recovery_seconds_count"), 0) << page;

  const pid_t victim = worker_on_host(program_, "127.0.0.3");
  ASSERT_GT(victim, 0);
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  ASSERT_TRUE(p.wait_output("epoch 5 ", 120s)) << p.out() << p.err();
  page = scrape(port);
  EXPECT_EQ(sample(page, "erun_resets_total{reason=\"worker failed\"}"), 1) << page;
  EXPECT_EQ(sample(page, "erun_workers_failed_total"), 1) << page;
  EXPECT_GE(sample(page, "erun_recovery_seconds_count"), 1) << page;
  EXPECT_GE(sample(page, "erun_generation"), 2) << page;
  EXPECT_GT(sample(page, "erun_time_seconds_total{phase=\"recovery\"}"), 0) << page;

  ASSERT_NO_FATAL_FAILURE(expect_trained_exactly(p, uninterrupted_checksum()));

  // The summary at the end: in the event log, its parts add up to the wall time.
  nlohmann::json summary, rolled;
  std::ifstream log(dir_.file("events.jsonl"));
  std::string line;
  while (std::getline(log, line)) {
    auto e = nlohmann::json::parse(line);
    if (e["event"] == "job_summary") summary = e;
    if (e["event"] == "rolled_back") rolled = e;
  }
  ASSERT_TRUE(summary.is_object()) << slurp(dir_.file("events.jsonl"));
  double parts = 0;
  for (const char* k : {"startup_s", "training_s", "recovery_s", "rolled_back_s", "waiting_s", "driver_gap_s"}) {
    parts += summary[k].get<double>();
  }
  EXPECT_NEAR(parts, summary["wall_s"].get<double>(), 0.01) << summary.dump();
  EXPECT_GT(summary["goodput"].get<double>(), 0.5) << summary.dump();
  EXPECT_LT(summary["goodput"].get<double>(), 1.0) << summary.dump();
  EXPECT_EQ(summary["resets"]["worker failed"], 1) << summary.dump();
  EXPECT_EQ(summary["workers_failed"], 1) << summary.dump();
  EXPECT_GE(summary["workers_launched"].get<long>(), 3) << summary.dump();  // two, then a replacement
  EXPECT_GT(summary["slowest_recovery_s"].get<double>(), 0) << summary.dump();
  // The survivors restored the last commit: what ran after it was thrown
  // away, at most a commit interval (5 steps of 40 ms) and the reports' lag.
  ASSERT_TRUE(rolled.is_object()) << slurp(dir_.file("events.jsonl"));
  EXPECT_GE(rolled["seconds"].get<double>(), 0);
  EXPECT_LT(rolled["seconds"].get<double>(), 2.0);
  EXPECT_NEAR(summary["rolled_back_s"].get<double>(), rolled["seconds"].get<double>(), 1e-3);

  // erun printed it; `erun report` prints the same from the log.
  const std::string printed = p.err();
  const size_t at = printed.find("erun: job ");
  ASSERT_NE(at, std::string::npos) << printed;
  EXPECT_NE(printed.find("goodput", at), std::string::npos) << printed;
  int code = 0;
  const std::string report = command_output({erun_binary(), "report", dir_.file("events.jsonl")}, &code);
  EXPECT_EQ(code, 0) << report;
  EXPECT_EQ(printed.substr(at + 6, report.size()), report) << "erun printed:\n" << printed << "\nreport:\n" << report;

  // The picture: one self-contained file, private.
  if (::access("/usr/bin/python3", X_OK) != 0 ||
      (command_output({"/usr/bin/python3", "-c", "import matplotlib"}, &code), code != 0)) {
    GTEST_SKIP() << "no python3 with matplotlib here: the picture is not drawn (scripts/setup.sh installs it)";
  }
  (void)command_output({erun_binary(), "report", dir_.file("events.jsonl"), "-o", dir_.file("job.html")}, &code);
  ASSERT_EQ(code, 0);
  const std::string html = slurp(dir_.file("job.html"));
  EXPECT_NE(html.find("<svg"), std::string::npos);
  EXPECT_NE(html.find("goodput"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("src=\"http"), std::string::npos);
  struct stat st {};
  ASSERT_EQ(::stat(dir_.file("job.html").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

// erun with stdout and stderr on a pseudo-terminal: all it wrote until it ended.
std::string run_on_a_terminal(const std::vector<std::string>& args, int* code) {
  int master = -1;
  winsize ws{};
  ws.ws_col = 160;
  ws.ws_row = 40;
  // Everything the child needs is made before the fork: it only execs.
  std::string bin = erun_binary();
  std::vector<std::string> copy = args;
  std::vector<char*> argv = {bin.data()};
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  // A person's terminal: erun's default log level (the suite's is info).
  std::vector<std::string> env_text = {"TERM=xterm"};
  for (char** e = environ; *e; ++e) {
    if (std::strncmp(*e, "TERM=", 5) != 0 && std::strncmp(*e, "ERUN_LOG_LEVEL=", 15) != 0) env_text.emplace_back(*e);
  }
  std::vector<char*> envp;
  for (auto& e : env_text) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid = ::forkpty(&master, nullptr, nullptr, &ws);
  if (pid == 0) {
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  std::string out;
  if (pid < 0) return out;
  const auto until = std::chrono::steady_clock::now() + 240s;
  char buf[4096];
  while (std::chrono::steady_clock::now() < until) {
    pollfd p{master, POLLIN, 0};
    if (::poll(&p, 1, 200) > 0) {
      ssize_t n = ::read(master, buf, sizeof buf);
      if (n <= 0) break;  // EIO: every writer is gone
      out.append(buf, static_cast<size_t>(n));
    }
  }
  int status = 0;
  if (::waitpid(pid, &status, WNOHANG) == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
  }
  *code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  ::close(master);
  return out;
}

TEST_F(ErunJobView, OnATerminalTheStatusLineStaysAtTheBottom) {
  int code = -1;
  const std::string out = run_on_a_terminal(args({}), &code);
  EXPECT_EQ(code, 0) << out;
  const std::string draw = "\r\033[Kerun: gen ";
  size_t draws = 0;
  for (size_t at = out.find(draw); at != std::string::npos; at = out.find(draw, at + 1)) {
    ++draws;
    // Nothing is written after it but its own erasure: never a worker's
    // line glued to it, never a newline that would leave it in the scrollback.
    const size_t end = out.find_first_of("\r\n", at + draw.size());
    if (end != std::string::npos) {
      EXPECT_EQ(out[end], '\r') << out.substr(at, end - at + 20);
    }
  }
  EXPECT_GT(draws, 0u) << out;
  EXPECT_NE(out.find("goodput"), std::string::npos);
  // The workers' lines come whole, each on its own line.
  EXPECT_NE(train_checksum(out), "") << out;
  EXPECT_GE(std::count(out.begin(), out.end(), '\n'), 10);
  // Quiet by default: no info line; the summary is said.
  EXPECT_EQ(out.find("ranks joined"), std::string::npos) << out;
  EXPECT_NE(out.find("erun: job "), std::string::npos) << out;
  // The line is taken away before the summary: no draw comes after it.
  ASSERT_NE(out.rfind("erun: job "), std::string::npos);
  EXPECT_LT(out.rfind(draw), out.rfind("erun: job ")) << out.substr(out.rfind("erun: job "));
}

TEST_F(ErunJobView, NoStatusTakesTheLineAwayAndLogLevelInfoShowsEveryStep) {
  int code = -1;
  const std::string out = run_on_a_terminal(args({"--no-status", "--log-level", "info"}), &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_EQ(out.find("\033[K"), std::string::npos) << out;
  EXPECT_NE(out.find("ranks joined"), std::string::npos) << out;
  EXPECT_NE(out.find("goodput"), std::string::npos) << out;
}

}  // namespace
}  // namespace erun::testing
