// OutputForwarder over real pipes: tagging, whole lines under concurrent
// writers, partial and over-long lines, stderr tail (per-rank files: the agent,
// agent_workers_test.cc).
#include "runner/launch/output.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/strings.h"
#include "support/process_utils.h"

namespace erun {
namespace {

using testing::read_file;

struct Pipe {
  int r = -1, w = -1;
  Pipe() {
    int fds[2];
    EXPECT_EQ(::pipe2(fds, O_CLOEXEC), 0);
    r = fds[0];
    w = fds[1];
  }
  void write(std::string_view s) const {
    size_t done = 0;
    while (done < s.size()) {
      ssize_t n = ::write(w, s.data() + done, s.size() - done);
      ASSERT_GT(n, 0);
      done += static_cast<size_t>(n);
    }
  }
  void close_write() {
    if (w >= 0) ::close(w);
    w = -1;
  }
  ~Pipe() { close_write(); }
};

class OutputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/erun-output-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    sink_path_ = dir_ + "/sink";
    sink_ = ::open(sink_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    ASSERT_GE(sink_, 0);
  }
  void TearDown() override {
    ::close(sink_);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  OutputOptions options() const {
    OutputOptions o;
    o.sink_fd = sink_;
    return o;
  }
  std::vector<std::string> sink_lines() const {
    auto lines = split(read_file(sink_path_), '\n');
    if (!lines.empty() && lines.back().empty()) lines.pop_back();
    return lines;
  }
  std::vector<std::string> lines_with(const std::string& prefix) const {
    std::vector<std::string> out;
    for (auto& l : sink_lines()) {
      if (starts_with(l, prefix)) out.push_back(l);
    }
    return out;
  }

  std::string dir_, sink_path_;
  int sink_ = -1;
};

TEST_F(OutputTest, TagsWholeLinesPerStream) {
  OutputForwarder f(options());
  Pipe out, err;
  f.add(1, 3, out.r, err.r);
  out.write("hello\nwor");
  err.write("oops\n");
  out.write("ld\n");
  out.close_write();
  err.close_write();
  f.drain(1, 10000);
  EXPECT_EQ(lines_with("[3]<stdout>:"), (std::vector<std::string>{"[3]<stdout>:hello", "[3]<stdout>:world"}));
  EXPECT_EQ(lines_with("[3]<stderr>:"), (std::vector<std::string>{"[3]<stderr>:oops"}));
  EXPECT_EQ(sink_lines().size(), 3u);
}

TEST_F(OutputTest, UntaggedLinesAreForwardedAsIs) {
  auto o = options();
  o.tag = false;
  OutputForwarder f(o);
  Pipe out;
  f.add(1, 0, out.r, -1);
  out.write("a\nb\n");
  out.close_write();
  f.drain(1, 10000);
  EXPECT_EQ(read_file(sink_path_), "a\nb\n");
}

TEST_F(OutputTest, PartialLastLineIsFlushedAtEof) {
  OutputForwarder f(options());
  Pipe out;
  f.add(7, 0, out.r, -1);
  out.write("first\nno newline");
  out.close_write();
  f.drain(7, 10000);
  EXPECT_EQ(sink_lines(), (std::vector<std::string>{"[0]<stdout>:first", "[0]<stdout>:no newline"}));
}

TEST_F(OutputTest, ConcurrentWritersNeverInterleaveWithinALine) {
  constexpr int kLines = 1500;
  constexpr size_t kLen = 3000;  // lines longer than PIPE_BUF: the writers' writes split
  OutputForwarder f(options());
  std::vector<std::unique_ptr<Pipe>> pipes;
  for (int rank = 0; rank < 3; ++rank) {
    pipes.push_back(std::make_unique<Pipe>());
    f.add(rank, rank, pipes.back()->r, -1);
  }
  std::vector<std::thread> writers;
  for (int rank = 0; rank < 3; ++rank) {
    writers.emplace_back([&, rank] {
      std::string line(kLen, static_cast<char>('a' + rank));
      line += '\n';
      for (int i = 0; i < kLines; ++i) {
        // Odd pieces, so lines arrive cut at arbitrary points.
        pipes[rank]->write(std::string_view(line).substr(0, 1000 + i % 7));
        pipes[rank]->write(std::string_view(line).substr(1000 + i % 7));
      }
      pipes[rank]->close_write();
    });
  }
  for (auto& t : writers) t.join();
  for (int rank = 0; rank < 3; ++rank) f.drain(rank, 20000);
  int counts[3] = {0, 0, 0};
  for (const auto& l : sink_lines()) {
    ASSERT_EQ(l.size(), 12 + kLen) << l.substr(0, 40);
    int rank = l[1] - '0';
    ASSERT_TRUE(rank >= 0 && rank < 3) << l.substr(0, 40);
    ASSERT_EQ(l.substr(0, 12), fmt::format("[{}]<stdout>:", rank));
    ASSERT_EQ(l.find_first_not_of(static_cast<char>('a' + rank), 12), std::string::npos);
    ++counts[rank];
  }
  for (int c : counts) EXPECT_EQ(c, kLines);
}

TEST_F(OutputTest, OverlongLineIsForwardedInChunks) {
  OutputForwarder f(options());
  Pipe out;
  f.add(1, 0, out.r, -1);
  std::thread writer([&] {
    out.write(std::string(200 * 1024, 'x'));
    out.write("\nend\n");
    out.close_write();
  });
  writer.join();
  f.drain(1, 10000);
  auto lines = sink_lines();
  ASSERT_GE(lines.size(), 4u);
  size_t xs = 0;
  for (size_t i = 0; i + 1 < lines.size(); ++i) {
    ASSERT_TRUE(starts_with(lines[i], "[0]<stdout>:"));
    EXPECT_LE(lines[i].size() - 12, 64u * 1024);
    xs += lines[i].size() - 12;
  }
  EXPECT_EQ(xs, 200u * 1024);
  EXPECT_EQ(lines.back(), "[0]<stdout>:end");
}

TEST_F(OutputTest, KeepsTheLastStderrLines) {
  auto o = options();
  o.tail_lines = 3;
  OutputForwarder f(o);
  Pipe out, err;
  f.add(9, 1, out.r, err.r);
  for (int i = 0; i < 10; ++i) err.write(fmt::format("line {}\n", i));
  out.write("not in the tail\n");
  err.write("last, unterminated");
  err.close_write();
  out.close_write();
  f.drain(9, 10000);
  EXPECT_EQ(f.tail(9), (std::vector<std::string>{"line 8", "line 9", "last, unterminated"}));
  f.forget(9);
  EXPECT_TRUE(f.tail(9).empty());
}

TEST_F(OutputTest, DrainIsBoundedWhileAPipeStaysOpen) {
  OutputForwarder f(options());
  Pipe out;
  f.add(1, 0, out.r, -1);
  out.write("still running\n");
  auto start = std::chrono::steady_clock::now();
  f.drain(1, 200);
  auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_GE(waited, std::chrono::milliseconds(150));
  EXPECT_LT(waited, std::chrono::seconds(10));
  f.drain(12345, 10000);  // unknown worker: returns at once
}

TEST_F(OutputTest, DestructorForwardsPendingOutputAndClosesPipes) {
  ::signal(SIGPIPE, SIG_IGN);
  Pipe out;
  {
    OutputForwarder f(options());
    f.add(1, 4, out.r, -1);
    out.write("before shutdown\n");
    // No drain: the pipe is still open when the forwarder goes.
  }
  EXPECT_EQ(sink_lines(), (std::vector<std::string>{"[4]<stdout>:before shutdown"}));
  EXPECT_EQ(::write(out.w, "x", 1), -1);
  EXPECT_EQ(errno, EPIPE);
}

TEST_F(OutputTest, ClosedSinkDoesNotKillTheProcess) {
  Pipe sink, out;
  auto o = options();
  o.sink_fd = sink.w;
  OutputForwarder f(o);
  ::close(sink.r);
  sink.r = -1;
  f.add(1, 0, out.r, -1);
  out.write("into a closed pipe\n");
  out.close_write();
  f.drain(1, 10000);  // reaching here means SIGPIPE did not kill the test
  SUCCEED();
}

}  // namespace
}  // namespace erun
