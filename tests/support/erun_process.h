// ErunProcess: runs the built erun binary as a real process for integration
// tests, collecting its stdout and stderr on a background thread. Every wait
// is bounded; the destructor SIGKILLs a still-running erun (its workers then
// die through their supervisors' stdin EOF).
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/subprocess.h"

namespace erun::testing {

std::string erun_binary();
std::string build_path(const std::string& relative);   // under ERUN_BUILD_DIR
std::string source_path(const std::string& relative);  // under ERUN_SOURCE_DIR

// Runs a tool (ip, ssh-keygen, ...) to its end, 30 s at most: its stdout, or
// an error naming the command, how it ended and its stderr.
Result<std::string> run_tool(const std::vector<std::string>& argv);

// A fresh temp directory, removed (recursively) in the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  void write(const std::string& name, const std::string& text, bool executable = false) const;

 private:
  std::string path_;
};

// examples/train_mlp's arguments in the end-to-end training tests (10 epochs
// of 40 ms steps, a commit every 5 steps).
extern const std::vector<std::string> kTrainMlpArgs;
// The model checksum in train_mlp's final line of `out` ("" when absent).
std::string train_checksum(const std::string& out);
// The output of the same training uninterrupted in one process, without the
// step sleep: the reference an elastic run's train_checksum() must equal (an
// error message when it cannot start).
std::string uninterrupted_training_output();
// Its train_checksum(), computed once per test program; "" (after an
// EXPECT failure naming the output) when it cannot be had.
const std::string& uninterrupted_checksum();

class ErunProcess;
// Waits (300 s at most) for an end-to-end train_mlp job to end, and checks
// that it ended 0 at `reference`'s checksum with no step applied twice. Call
// it inside ASSERT_NO_FATAL_FAILURE to stop the test when erun did not end.
void expect_trained_exactly(ErunProcess& p, const std::string& reference);

class ErunProcess {
 public:
  // `wrapper`: the command that runs erun (e.g. {"ip", "netns", "exec",
  // NAME}: erun on another "machine"); it must exec erun in its own process.
  explicit ErunProcess(std::vector<std::string> args, std::vector<std::string> extra_env = {},
                       std::vector<std::string> wrapper = {});
  ~ErunProcess();
  bool started() const { return started_; }
  const std::string& start_error() const { return start_error_; }
  long pid() const;
  std::optional<ExitStatus> wait(Duration timeout);
  void signal(int sig);
  std::string out() const;
  std::string err() const;
  // Waits until stdout+stderr contain `text`.
  bool wait_output(const std::string& text, Duration timeout) const;
  // Counts occurrences of `text` in stdout+stderr.
  size_t count(const std::string& text) const;

 private:
  void pump();
  std::unique_ptr<Subprocess> proc_;
  bool started_ = false;
  std::string start_error_;
  mutable std::mutex mu_;
  std::string out_, err_;
  int out_fd_ = -1, err_fd_ = -1;
  std::thread reader_;
  std::optional<ExitStatus> exit_;
};

}  // namespace erun::testing
