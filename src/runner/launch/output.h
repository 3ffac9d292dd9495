// OutputForwarder: one thread that reads every worker's stdout and stderr
// pipes and writes whole lines to erun's stdout, prefixed in horovodrun's form
// `[rank]<stdout>:` (or untagged). Lines of different workers never
// interleave; a partial last line is flushed when its pipe closes. (The
// per-rank files of --output-filename are written by each host's agent.)
// Thread-safe.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace erun {

struct OutputOptions {
  bool tag = true;
  int sink_fd = 1;         // where tagged lines go (erun's stdout)
  size_t tail_lines = 20;  // stderr lines kept per worker for failure reports
};

class OutputForwarder {
 public:
  explicit OutputForwarder(OutputOptions options);
  ~OutputForwarder();  // drains what is readable, closes every pipe

  // Takes ownership of the fds (-1 to skip one). `key` identifies the worker
  // for tail(); rank is what the prefix shows.
  void add(long key, int rank, int stdout_fd, int stderr_fd);
  // Waits (bounded) until the worker's pipes reached EOF and were flushed.
  void drain(long key, int timeout_ms);
  // The last stderr lines of a worker (for the root-cause report).
  std::vector<std::string> tail(long key) const;
  void forget(long key);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace erun
