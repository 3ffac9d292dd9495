// StatusLine: erun's one bottom line on a terminal, kept up to date like
// pip's or cargo's progress line, with everything else scrolling above it.
// Every writer to the terminal (the log, the workers' forwarded output, the
// summary at the end) goes through write_above(), which lifts the line off,
// writes, and puts it back, under one lock, so a worker's line never lands in
// the middle of it. Off (write_above() is a plain write) unless enable() found
// stderr to be a terminal. Thread-safe.
#pragma once

#include <mutex>
#include <string>
#include <string_view>

namespace erun {

class StatusLine {
 public:
  static StatusLine& get();

  // Turns the line on when stderr is a terminal whose TERM is not "dumb";
  // returns whether it is on.
  bool enable();
  // Replaces the line's text (cut to the terminal's width).
  void show(const std::string& text);
  // Writes all of `data` to `fd` (a blocking write, EINTR retried) with the
  // line lifted off first when `fd` is a terminal. False when fd is gone.
  bool write_above(int fd, std::string_view data);
  // Takes the line away for good (the job is over).
  void close();

 private:
  void erase_locked();
  void draw_locked();

  std::mutex mu_;
  bool enabled_ = false;
  bool drawn_ = false;
  std::string text_;
};

}  // namespace erun
