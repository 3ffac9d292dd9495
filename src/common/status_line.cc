#include "common/status_line.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "common/subprocess.h"

namespace erun {

StatusLine& StatusLine::get() {
  static StatusLine line;
  return line;
}

bool StatusLine::enable() {
  std::lock_guard<std::mutex> lock(mu_);
  const char* term = std::getenv("TERM");
  enabled_ = ::isatty(2) == 1 && !(term && std::strcmp(term, "dumb") == 0);
  return enabled_;
}

void StatusLine::show(const std::string& text) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!enabled_) return;
  text_ = text;
  draw_locked();
}

bool StatusLine::write_above(int fd, std::string_view data) {
  std::unique_lock<std::mutex> lock(mu_);
  const bool lift = drawn_ && (fd == 2 || ::isatty(fd) == 1);
  if (!lift) {
    // Nothing to lift: no lock held while writing, so a stuck stdout (a
    // reader that stopped) never holds up erun's log on stderr.
    lock.unlock();
    return write_all(fd, data);
  }
  erase_locked();
  bool ok = write_all(fd, data);
  draw_locked();
  return ok;
}

void StatusLine::close() {
  std::lock_guard<std::mutex> lock(mu_);
  if (drawn_) erase_locked();
  enabled_ = false;
}

void StatusLine::erase_locked() {
  (void)write_all(2, "\r\033[K");
  drawn_ = false;
}

void StatusLine::draw_locked() {
  winsize ws{};
  size_t width = ::ioctl(2, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 1 ? ws.ws_col - 1 : 79;
  std::string line = "\r\033[K" + text_.substr(0, width);
  drawn_ = write_all(2, line);
}

}  // namespace erun
