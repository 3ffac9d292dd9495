#include "runner/takeover/job_record.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "common/handshake.h"
#include "common/log.h"
#include "common/private_files.h"
#include "common/strings.h"

namespace erun {

namespace {

constexpr std::string_view kMagic = "erun-job-record 1";
constexpr size_t kMaxRecord = 64u << 20;

std::string escape(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (c > ' ' && c <= '~' && c != '%') {
      out.push_back(static_cast<char>(c));
    } else {
      out += fmt::format("%{:02X}", c);
    }
  }
  return out;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

std::optional<std::string> unescape(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out.push_back(s[i]);
      continue;
    }
    if (s.size() - i < 3) return std::nullopt;
    int hi = hex_digit(s[i + 1]), lo = hex_digit(s[i + 2]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out.push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return out;
}

bool to_long(std::string_view s, long& v) { return parse_int(std::string(s), v); }

// Milliseconds past which a time in the record is damage (the year 2262 in
// nanoseconds; a steady clock's time points hold as much).
constexpr long kMaxWallMs = 9'000'000'000'000L;

}  // namespace

RecordClock RecordClock::now() {
  return RecordClock{std::chrono::steady_clock::now(), std::chrono::system_clock::now()};
}

std::string encode_record(const JobRecord& r, const RecordClock& clock) {
  std::string out = std::string(kMagic) + "\n";
  auto line = [&](std::string_view key, std::string_view value) {
    out += fmt::format("{} {}\n", key, escape(value));
  };
  line("name", r.name);
  line("term", std::to_string(r.term));
  line("driver_pid", std::to_string(r.driver_pid));
  line("driver_host", r.driver_host);
  line("job_id", r.job_id);
  line("secret", r.secret);
  line("rendezvous_port", std::to_string(r.rendezvous_port));
  line("commit_dir", r.commit_dir);
  line("cwd", r.cwd);
  for (auto& a : r.args) line("arg", a);
  line("generation", std::to_string(r.generation));
  line("resets", std::to_string(r.resets));
  line("restarts", std::to_string(r.restarts));
  line("launched", std::to_string(r.launched));
  line("in_place", r.in_place ? "1" : "0");
  if (r.unlocked) line("unlocked", "1");  // only then: an older erun reads the rest
  for (auto& s : r.plan) out += fmt::format("slot {} {}\n", escape(s.host), s.local_index);
  for (auto& a : r.agents) out += fmt::format("agent {} {}\n", escape(a.host), escape(a.attach_path));
  using std::chrono::milliseconds;
  for (auto& [host, h] : r.hosts) {
    // The blacklisting's time left as of now (what an erun before
    // host_until reads), then when it ends in milliseconds of the wall
    // clock since the epoch (a new driver reads that, not knowing when
    // this was written).
    const Duration left = std::max(h.blacklisted_until - clock.steady, Duration::zero());
    out += fmt::format("host {} {} {} {}\n", escape(host), h.failures_in_a_row, h.times_blacklisted,
                       std::chrono::duration_cast<milliseconds>(left).count());
    if (h.blacklisted_until != TimePoint{}) {
      const auto until = clock.wall + std::chrono::duration_cast<std::chrono::system_clock::duration>(
                                          h.blacklisted_until - clock.steady);
      out += fmt::format("host_until {} {}\n", escape(host),
                         std::chrono::duration_cast<milliseconds>(until.time_since_epoch()).count());
    }
  }
  for (auto& [keeper, holder] : r.keepers) out += fmt::format("keeper {} {}\n", escape(keeper), escape(holder));
  out += "end\n";
  return out;
}

namespace {

// A record's count: a number from 0 up, stored into a field of any integer type.
template <class Field>
bool read_count(const std::string& value, Field& field) {
  long n = 0;
  if (!to_long(value, n) || n < 0) return false;
  field = static_cast<Field>(n);
  return true;
}

// "host NAME FAILS TIMES MS": a host's history, with the time its
// blacklisting has left as of the writing.
bool decode_host(const std::vector<std::string>& values, const RecordClock& clock, JobRecord& r) {
  long fails = 0, times = 0, ms = 0;
  bool ok = values.size() == 4 && to_long(values[1], fails) && to_long(values[2], times) &&
            to_long(values[3], ms) && fails >= 0 && times >= 0 && ms >= 0 && fails < (1 << 30) &&
            times < (1 << 30) && ms < kMaxWallMs;
  if (!ok || r.hosts.count(values[0])) return false;
  HostHistory& h = r.hosts[values[0]];
  h.failures_in_a_row = static_cast<int>(fails);
  h.times_blacklisted = static_cast<int>(times);
  // Time left as of the writing (an erun before host_until wrote only
  // this): from now, when nothing more exact follows.
  if (ms > 0) h.blacklisted_until = clock.steady + std::chrono::milliseconds(ms);
  return true;
}

// "host_until NAME MS": when the blacklisting of a host named above ends, on
// the wall clock; read onto this driver's clock (in the past, when it is over).
bool decode_host_until(const std::vector<std::string>& values, const RecordClock& clock, JobRecord& r) {
  long ms = 0;
  if (values.size() != 2 || !r.hosts.count(values[0]) || !to_long(values[1], ms) || ms <= 0 ||
      ms >= kMaxWallMs) {
    return false;
  }
  const auto now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(clock.wall.time_since_epoch()).count();
  r.hosts[values[0]].blacklisted_until = clock.steady + std::chrono::milliseconds(ms - now_ms);
  return true;
}

// A key of one value: a text, a count or a flag. An unknown key (from a
// newer erun) is left alone.
bool decode_scalar(const std::string& key, const std::string& value, JobRecord& r) {
  const std::pair<std::string_view, std::string*> texts[] = {
      {"name", &r.name},     {"driver_host", &r.driver_host}, {"job_id", &r.job_id},
      {"secret", &r.secret}, {"commit_dir", &r.commit_dir},   {"cwd", &r.cwd},
  };
  for (auto& [name, field] : texts) {
    if (key == name) {
      *field = value;
      return true;
    }
  }
  if (key == "arg") {
    r.args.push_back(value);
    return true;
  }
  if (key == "term") return read_count(value, r.term);
  if (key == "driver_pid") return read_count(value, r.driver_pid);
  if (key == "rendezvous_port") return read_count(value, r.rendezvous_port);
  if (key == "generation") return read_count(value, r.generation);
  if (key == "resets") return read_count(value, r.resets);
  if (key == "restarts") return read_count(value, r.restarts);
  if (key == "launched") return read_count(value, r.launched);  // 0 from an erun before it was kept
  if (key == "in_place") {
    r.in_place = value == "1";
    return value == "0" || value == "1";
  }
  if (key == "unlocked") {
    r.unlocked = value == "1";
    return value == "0" || value == "1";
  }
  return true;
}

// One "key value..." line's values (unescaped) into the record; false when
// they do not fit the key.
bool decode_field(const std::string& key, const std::vector<std::string>& values, const RecordClock& clock,
                  JobRecord& r) {
  if (key == "slot") {
    long n = 0;
    if (values.size() != 2 || !to_long(values[1], n) || n < 0) return false;
    r.plan.push_back(SlotKey{values[0], static_cast<int>(n)});
    return true;
  }
  if (key == "host") return decode_host(values, clock, r);
  if (key == "host_until") return decode_host_until(values, clock, r);
  if (key == "keeper") return values.size() == 2 && r.keepers.emplace(values[0], values[1]).second;
  if (key == "agent") {
    if (values.size() != 2) return false;
    r.agents.push_back(JobRecord::Agent{values[0], values[1]});
    return true;
  }
  return values.size() == 1 && decode_scalar(key, values[0], r);
}

}  // namespace

Result<JobRecord> decode_record(std::string_view text, const RecordClock& clock) {
  using R = Result<JobRecord>;
  JobRecord r;
  size_t at = 0;
  int line_no = 0;
  bool ended = false;
  while (at < text.size()) {
    size_t nl = text.find('\n', at);
    if (nl == std::string_view::npos) return R::error("the last line is cut short");
    std::string_view line = text.substr(at, nl - at);
    at = nl + 1;
    ++line_no;
    if (line_no == 1) {
      if (line != kMagic) return R::error("not an erun job record (first line)");
      continue;
    }
    if (ended) return R::error("lines after its end");
    if (line == "end") {
      ended = true;
      continue;
    }
    auto words = split(std::string(line), ' ');
    auto bad = [&] { return R::error(fmt::format("line {} is malformed", line_no)); };
    if (words.size() < 2) return bad();
    std::vector<std::string> values;
    for (size_t i = 1; i < words.size(); ++i) {
      auto v = unescape(words[i]);
      if (!v) return bad();
      values.push_back(std::move(*v));
    }
    if (!decode_field(words[0], values, clock, r)) return bad();
  }
  if (!ended) return R::error("it is cut short (no end line)");
  if (r.job_id.empty() || r.secret.empty()) return R::error("it names no job id or secret");
  return r;
}

std::string default_job_name(const std::string& cwd, const std::vector<std::string>& args) {
  std::string key = fmt::format("{}", ::getuid());
  key.push_back('\0');
  key += cwd;
  for (auto& a : args) {
    key.push_back('\0');
    key += a;
  }
  std::string digest = handshake::sha256(key);
  std::string hex;
  for (size_t i = 0; i < 6 && i < digest.size(); ++i) hex += fmt::format("{:02x}", static_cast<unsigned char>(digest[i]));
  return "job-" + hex;
}

std::string jobs_directory() {
  if (const char* d = std::getenv("ERUN_JOB_DIR"); d && d[0] == '/') return d;
  const char* home = std::getenv("HOME");
  return std::string(home && home[0] == '/' ? home : "/tmp") + "/.erun/jobs";
}

bool valid_job_name(const std::string& name) {
  if (name.empty() || name.size() > 128 || name[0] == '.') return false;
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
              c == '-';
    if (!ok) return false;
  }
  return true;
}

namespace {

std::optional<JobRecord> read_record_at(int dir_fd, const std::string& dir) {
  int fd = ::openat(dir_fd, "record", O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  Fd owner(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 077) != 0 ||
      static_cast<size_t>(st.st_size) > kMaxRecord) {
    ERUN_LOG_WARN("job record {}/record is not a private regular file of this user: ignored", dir);
    return std::nullopt;
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < text.size()) {
    ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  text.resize(got);
  auto r = decode_record(text);
  if (!r) {
    ERUN_LOG_WARN("job record {}/record is damaged ({}): ignored", dir, r.message());
    return std::nullopt;
  }
  return std::move(r).value();
}

// A job's directory: this user's, no link, nobody else may write to it.
constexpr DirPolicy kJobDirPolicy{.refuse_shared_write = true, .refuse_link = true};

// The job's lock file in `dir_fd`, locked without waiting; an empty Fd
// with errno set when not (EWOULDBLOCK: another erun holds it). A job that
// ends removes its lock file and its directory (JobStore::remove()): a
// lock taken on a file that was removed meanwhile is no lock (ESTALE: look
// again), nor is one in a directory that is gone (ENOENT).
Fd take_lock_at(int dir_fd) {
  Fd lock(::openat(dir_fd, "lock", O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!lock) return Fd();
  auto none = [&lock](int error) {
    lock = Fd();
    errno = error;
    return Fd();
  };
  if (::flock(lock.get(), LOCK_EX | LOCK_NB) != 0) return none(errno);
  struct stat held {}, named {};
  if (::fstat(lock.get(), &held) != 0) return none(errno);
  if (::fstatat(dir_fd, "lock", &named, AT_SYMLINK_NOFOLLOW) != 0 || held.st_ino != named.st_ino ||
      held.st_dev != named.st_dev) {
    return none(ESTALE);
  }
  return lock;
}

// The error for a job whose lock another erun holds: who, and what to do.
std::string held_elsewhere(int dir_fd, const std::string& dir, const std::string& name) {
  auto held = read_record_at(dir_fd, dir);
  std::string who = held ? fmt::format("erun pid {} on {}", held->driver_pid, held->driver_host) : "another erun";
  std::string where = held && !held->cwd.empty() ? fmt::format(" (run from {})", held->cwd) : "";
  return fmt::format(
      "job {} is already driven by {}{}: to run a separate job beside it, give this one --job-name OTHER; to take "
      "this one over, end that erun first (its workers train on for --driver-grace) and run the same command "
      "again, or erun --attach {}",
      name, who, where, name);
}

}  // namespace

Result<std::unique_ptr<JobStore>> JobStore::lock(const std::string& jobs_dir, const std::string& name, bool* held_out) {
  using R = Result<std::unique_ptr<JobStore>>;
  if (held_out) *held_out = false;
  const std::string dir = jobs_dir + "/" + name;
  // A job of the same name that ends meanwhile removes the directory and
  // its lock: then again, with a new one.
  for (int attempt = 1;; ++attempt) {
    const bool last = attempt == 10;
    if (Status s = ensure_private_dir(dir, "job record directory", kJobDirPolicy); !s) {
      if (!last && ::access(dir.c_str(), F_OK) != 0 && errno == ENOENT) continue;  // removed between its steps
      return R::error(s.message() + " (set ERUN_JOB_DIR to a directory of your own)");
    }
    Fd dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!dir_fd && errno == ENOENT && !last) continue;
    if (!dir_fd) return R::error(fmt::format("cannot open the job record directory {}: {}", dir, std::strerror(errno)));
    // The directory checked is the one opened (not one swapped in between).
    if (Status s = check_private_dir(dir_fd.get(), dir, "job record directory", kJobDirPolicy); !s) {
      return R::error(s.message() + " (set ERUN_JOB_DIR to a directory of your own)");
    }
    Fd lock = take_lock_at(dir_fd.get());
    if (lock) return R(std::unique_ptr<JobStore>(new JobStore(dir, std::move(dir_fd), std::move(lock))));
    if ((errno == ESTALE || errno == ENOENT) && !last) continue;
    if (errno != EWOULDBLOCK) {
      return R::error(fmt::format("cannot lock the job lock {}/lock: {}", dir, std::strerror(errno)));
    }
    if (held_out) *held_out = true;
    return R::error(held_elsewhere(dir_fd.get(), dir, name));
  }
}

Result<std::unique_ptr<JobStore>> JobStore::open_unlocked(const std::string& jobs_dir, const std::string& name) {
  using R = Result<std::unique_ptr<JobStore>>;
  const std::string dir = jobs_dir + "/" + name;
  // Never made here: a job whose directory is gone has ended.
  Fd dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dir_fd && errno == ENOENT) return R::error(fmt::format("job {} ended: its directory {} is gone", name, dir));
  if (!dir_fd) return R::error(fmt::format("cannot open the job record directory {}: {}", dir, std::strerror(errno)));
  if (Status s = check_private_dir(dir_fd.get(), dir, "job record directory", kJobDirPolicy); !s) {
    return R::error(s.message());
  }
  return R(std::unique_ptr<JobStore>(new JobStore(dir, std::move(dir_fd), Fd())));
}

bool JobStore::try_lock() {
  if (lock_) return true;
  lock_ = take_lock_at(dir_fd_.get());
  return static_cast<bool>(lock_);
}

void JobStore::touch() { (void)::utimensat(dir_fd_.get(), "record", nullptr, AT_SYMLINK_NOFOLLOW); }

std::string record_stamp(const std::string& jobs_dir, const std::string& name) {
  Fd fd(::open((jobs_dir + "/" + name + "/record").c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  struct stat st {};
  if (!fd || ::fstat(fd.get(), &st) != 0) return "";
  return fmt::format("{}:{}:{}.{}", static_cast<unsigned long>(st.st_ino), static_cast<long>(st.st_size),
                     static_cast<long>(st.st_mtim.tv_sec), st.st_mtim.tv_nsec);
}

std::optional<JobRecord> JobStore::read() const { return read_record_at(dir_fd_.get(), dir_); }

std::optional<Duration> JobStore::record_age() const {
  struct stat st {};
  if (::fstatat(dir_fd_.get(), "record", &st, AT_SYMLINK_NOFOLLOW) != 0) return std::nullopt;
  const auto mtime = std::chrono::system_clock::time_point(std::chrono::duration_cast<std::chrono::system_clock::duration>(
      std::chrono::seconds(st.st_mtim.tv_sec) + std::chrono::nanoseconds(st.st_mtim.tv_nsec)));
  return std::chrono::duration_cast<Duration>(std::chrono::system_clock::now() - mtime);
}

uint64_t JobStore::record_inode() const {
  struct stat st {};
  if (::fstatat(dir_fd_.get(), "record", &st, AT_SYMLINK_NOFOLLOW) != 0) return 0;
  return static_cast<uint64_t>(st.st_ino);
}

Status JobStore::write(const JobRecord& r) {
  // A driver that was frozen or cut off while a standby took the job over
  // must not put its older view back (it learns from the agents that it was
  // replaced, and exits).
  // Nor may two eruns claim one term (both took over the same silent driver):
  // the second finds the first's claim.
  if (auto now = read(); now && now->job_id == r.job_id &&
                         (now->term > r.term || (now->term == r.term && (now->driver_pid != r.driver_pid ||
                                                                          now->driver_host != r.driver_host)))) {
    return Status::error(fmt::format("job {}: driver term {} (erun pid {} on {}) holds it now", r.name, now->term,
                                     now->driver_pid, now->driver_host));
  }
  std::string tmp;
  auto fd = create_private_temp(dir_fd_.get(), dir_, ".record-", &tmp);
  if (!fd) return Status::error(fd.message());
  Fd owner(fd.value());
  std::string text = encode_record(r);
  std::string_view left = text;
  while (!left.empty()) {
    ssize_t n = ::write(owner.get(), left.data(), left.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int e = errno;
      ::unlinkat(dir_fd_.get(), tmp.c_str(), 0);
      return Status::error(fmt::format("cannot write the job record in {}: {}", dir_, std::strerror(e)));
    }
    left.remove_prefix(static_cast<size_t>(n));
  }
  if (::fsync(owner.get()) != 0 || ::renameat(dir_fd_.get(), tmp.c_str(), dir_fd_.get(), "record") != 0) {
    int e = errno;
    ::unlinkat(dir_fd_.get(), tmp.c_str(), 0);
    return Status::error(fmt::format("cannot replace the job record {}/record: {}", dir_, std::strerror(e)));
  }
  written_job_ = r.job_id;
  written_term_ = r.term;
  return Status::ok();
}

bool JobStore::remove() {
  if (auto now = read(); now && !written_job_.empty() && now->job_id == written_job_ && now->term > written_term_) {
    ERUN_LOG_WARN("job {}: driver term {} (erun pid {} on {}) holds it now, not this erun's term {}: its record is "
                  "left to that driver",
                  now->name, now->term, now->driver_pid, now->driver_host, written_term_);
    return false;
  }
  ::unlinkat(dir_fd_.get(), "record", 0);
  ::unlinkat(dir_fd_.get(), "events", 0);
  if (!lock_) return true;
  // The lock file goes while this store still holds it (whoever opened it
  // before finds, once it has it, that it is no longer the job's lock:
  // take_lock_at()), then the directory, when nothing else is in it.
  ::unlinkat(dir_fd_.get(), "lock", 0);
  // A standby driver's marker (erun --standby) goes only when no standby
  // holds it: one that does sees the job end and cleans up itself.
  if (Fd marker(::openat(dir_fd_.get(), "standby", O_RDWR | O_NOFOLLOW | O_CLOEXEC));
      marker && ::flock(marker.get(), LOCK_EX | LOCK_NB) == 0) {
    ::unlinkat(dir_fd_.get(), "standby", 0);
  }
  ::rmdir(dir_.c_str());
  return true;
}

std::optional<JobRecord> peek_record(const std::string& jobs_dir, const std::string& name) {
  const std::string dir = jobs_dir + "/" + name;
  Fd dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dir_fd) return std::nullopt;
  return read_record_at(dir_fd.get(), dir);
}

}  // namespace erun
