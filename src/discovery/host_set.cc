#include "discovery/host_set.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>
#include <limits>
#include <unordered_map>

#include <fmt/format.h>

#include "common/strings.h"

namespace erun {

namespace {

constexpr long kMaxSlots = 1L << 16;
constexpr size_t kMaxExpandedHosts = 1U << 20;

bool is_ipv6(std::string_view name) { return name.find(':') != std::string_view::npos; }

// "[fe80::1]" for IPv6 (so that a ":slots" suffix stays unambiguous), the name otherwise.
std::string display_name(std::string_view name) {
  return is_ipv6(name) ? fmt::format("[{}]", name) : std::string(name);
}

bool all_digits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// The "what is wrong" part of a slot count error, or empty when `text` is fine.
std::string check_slots(std::string_view text, long& out) {
  if (!parse_int(text, out) || out <= 0) {
    if (!text.empty() && all_digits(text) && text.size() > 12) {
      return fmt::format("slots {} is more than the limit of {}", text, kMaxSlots);
    }
    return "slots must be a positive integer";
  }
  if (out > kMaxSlots) return fmt::format("slots {} is more than the limit of {}", out, kMaxSlots);
  return {};
}

// Parses one `host[:slots]` token; on failure returns an error with only the
// "what is wrong" part, which the caller wraps with where it came from.
Result<Host> parse_host_spec(std::string_view tok, int default_slots, bool* had_slots = nullptr) {
  std::string_view name;
  std::string_view slots_text;
  bool has_slots = false;
  if (tok.empty()) return Result<Host>::error("empty host");
  auto space = tok.find_first_of(" \t\r\f\v");
  if (space != std::string_view::npos) {
    auto rest = trim(tok.substr(space));
    if (starts_with(rest, "slots=")) {
      return Result<Host>::error(fmt::format(
          "write {}:{} here; \"slots=\" is the hostfile form", escape_for_log(tok.substr(0, space)),
          escape_for_log(rest.substr(6), 20)));
    }
    return Result<Host>::error(fmt::format("unexpected \"{}\" after the host", escape_for_log(rest, 60)));
  }
  if (tok.front() == '[') {
    auto close = tok.find(']');
    if (close == std::string_view::npos) {
      return Result<Host>::error("'[' without a closing ']' (IPv6 goes as [addr] or [addr]:slots)");
    }
    name = tok.substr(1, close - 1);
    auto rest = tok.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') {
        return Result<Host>::error(fmt::format("unexpected '{}' after ']'", escape_for_log(rest, 60)));
      }
      slots_text = rest.substr(1);
      has_slots = true;
    }
    if (!is_ipv6(name)) {
      return Result<Host>::error(
          fmt::format("brackets are only for IPv6 addresses, and \"{}\" is not one", escape_for_log(name)));
    }
  } else {
    auto colons = std::count(tok.begin(), tok.end(), ':');
    if (colons >= 2) {
      name = tok;  // a bare IPv6 address, never with slots
    } else if (colons == 1) {
      auto c = tok.find(':');
      name = tok.substr(0, c);
      slots_text = tok.substr(c + 1);
      has_slots = true;
    } else {
      name = tok;
    }
  }
  Host h;
  h.name = std::string(name);
  h.slots = default_slots;
  if (has_slots) {
    long n = 0;
    auto why = check_slots(slots_text, n);
    if (!why.empty()) return Result<Host>::error(std::move(why));
    h.slots = static_cast<int>(n);
  }
  if (had_slots) *had_slots = has_slots;
  if (auto st = validate_hostname(h.name); !st) return Result<Host>::error(st.message());
  return h;
}

// The blank-separated words of `line` (views into it).
std::vector<std::string_view> split_words(std::string_view line) {
  std::vector<std::string_view> out;
  for (size_t i = 0; i < line.size();) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
    size_t j = i;
    while (j < line.size() && line[j] != ' ' && line[j] != '\t') ++j;
    if (j > i) out.push_back(line.substr(i, j - i));
    i = j;
  }
  return out;
}

// A rack name: 1-64 letters, digits, '.', '_' or '-'.
bool valid_rack(std::string_view name) {
  return !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
}

// Checks one raw input line as bytes, before any parsing: a control byte (a
// NUL included) anywhere, or a byte that is neither part of a host spec nor a
// blank in the part before a '#' comment, rejects the line. Hostnames never
// need them, and a shell metacharacter or a NUL that slipped through would
// reach a remote shell or cut a C string short. Returns the "what is wrong"
// part, or empty when the line is fine.
std::string check_line_bytes(std::string_view line) {
  auto hash = line.find('#');
  for (size_t i = 0; i < line.size(); ++i) {
    auto c = static_cast<unsigned char>(line[i]);
    bool blank = c == ' ' || c == '\t' || (c == '\r' && i + 1 == line.size());
    bool control = (c < 0x20 && !blank) || c == 0x7f;
    bool in_spec = std::isalnum(c) || c == '.' || c == '-' || c == ':' || c == '[' || c == ']' ||
                   c == '%' || c == '_' || c == '=' || blank;
    if (control || (i < hash && !in_spec && c != '#')) {
      return fmt::format(
          "byte {} is {} '{}': a host line may hold only letters, digits and . - : [ ] % _ = "
          "(then a # comment)",
          i + 1, control ? "the control character" : "the character",
          escape_for_log(line.substr(i, 1)));
    }
  }
  return {};
}

std::string_view strip_comment(std::string_view line) {
  auto hash = line.find('#');
  if (hash != std::string_view::npos) line = line.substr(0, hash);
  return trim(line);
}

// Adds `h` from input item `where` (a line or item number) to `set`, merging or
// rejecting a repeat. `first_seen` remembers where each host came from.
// Linear in the input: `first_seen` maps a name to where it first came from and
// its index in `set`.
struct Seen {
  size_t where = 0;
  size_t index = 0;
};

Status add_host(HostSet& set, std::unordered_map<std::string, Seen>& first_seen, Host h,
                size_t where, DuplicatePolicy dup, std::string_view unit) {
  auto [it, inserted] = first_seen.emplace(h.name, Seen{where, set.size()});
  if (inserted) {
    set.append_new(std::move(h));
    return Status::ok();
  }
  if (dup == DuplicatePolicy::kReject) {
    return Status::error(fmt::format(
        "host {} is listed twice ({}s {} and {}): list each host once with its total slots",
        h.name, unit, it->second.where, where));
  }
  long total = static_cast<long>(set.hosts()[it->second.index].slots) + h.slots;
  if (total > kMaxSlots) {
    return Status::error(fmt::format("host {} adds up to {} slots, more than the limit of {}",
                                     h.name, total, kMaxSlots));
  }
  set.add_slots_at(it->second.index, h.slots);
  if (h.draining) set.mark_draining_at(it->second.index);
  if (!h.rack.empty()) set.set_rack_at(it->second.index, std::move(h.rack));
  return Status::ok();
}

// Appends the expansion of one bracket-free-at-top-level item ("rack[1-2]-n[01-02]").
Status expand_one(std::string_view item, std::vector<std::string>& out) {
  std::vector<std::string> acc{std::string()};
  size_t i = 0;
  while (i < item.size()) {
    auto open = item.find('[', i);
    auto stray = item.find(']', i);
    if (stray != std::string_view::npos && (open == std::string_view::npos || stray < open)) {
      return Status::error(fmt::format("\"{}\" has a ']' without a '['", item));
    }
    auto literal = item.substr(i, open == std::string_view::npos ? item.size() - i : open - i);
    for (auto& s : acc) s += literal;
    if (open == std::string_view::npos) break;
    auto close = item.find(']', open);
    if (close == std::string_view::npos) {
      return Status::error(fmt::format("\"{}\" has a '[' without a closing ']'", item));
    }
    auto inner = item.substr(open + 1, close - open - 1);
    if (inner.find('[') != std::string_view::npos) {
      return Status::error(fmt::format("\"{}\" has nested brackets", item));
    }
    if (trim(inner).empty()) return Status::error(fmt::format("\"{}\" has empty brackets", item));
    std::vector<std::string> values;
    for (const auto& part_s : split(inner, ',')) {
      auto part = trim(part_s);
      auto dash = part.find('-');
      auto lo_s = part.substr(0, dash);
      auto hi_s = dash == std::string_view::npos ? lo_s : part.substr(dash + 1);
      long lo = 0, hi = 0;
      if (!all_digits(lo_s) || !all_digits(hi_s) || !parse_int(lo_s, lo) || !parse_int(hi_s, hi)) {
        return Status::error(fmt::format(
            "\"{}\": \"{}\" is not a number or a range like 01-04", item, part));
      }
      if (hi < lo) {
        return Status::error(
            fmt::format("\"{}\": range {} goes backwards (write it low-high)", item, part));
      }
      if (static_cast<size_t>(hi - lo) >= kMaxExpandedHosts) {
        return Status::error(fmt::format("\"{}\": range {} is too large", item, part));
      }
      for (long v = lo; v <= hi; ++v) {
        values.push_back(fmt::format("{:0{}}", v, lo_s.size()));
      }
    }
    if (acc.size() * values.size() > kMaxExpandedHosts) {
      return Status::error(fmt::format("\"{}\" expands to more than {} hosts", item, kMaxExpandedHosts));
    }
    std::vector<std::string> next;
    next.reserve(acc.size() * values.size());
    for (const auto& prefix : acc) {
      for (const auto& v : values) next.push_back(prefix + v);
    }
    acc = std::move(next);
    i = close + 1;
  }
  if (out.size() + acc.size() > kMaxExpandedHosts) {
    return Status::error(fmt::format("hostlist expands to more than {} hosts", kMaxExpandedHosts));
  }
  for (auto& s : acc) out.push_back(std::move(s));
  return Status::ok();
}

}  // namespace

int HostSet::total_slots() const {
  long total = 0;
  for (const auto& h : hosts_) total += h.slots;
  return static_cast<int>(std::min<long>(total, std::numeric_limits<int>::max()));
}

int HostSet::find(std::string_view name) const {
  for (size_t i = 0; i < hosts_.size(); ++i) {
    if (hosts_[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

int HostSet::slots_of(std::string_view name) const {
  int i = find(name);
  return i < 0 ? 0 : hosts_[static_cast<size_t>(i)].slots;
}

void HostSet::append_new(Host h) { hosts_.push_back(std::move(h)); }

void HostSet::add_slots_at(size_t index, int slots) { hosts_.at(index).slots += slots; }

void HostSet::add(Host h) {
  int i = find(h.name);
  if (i < 0) hosts_.push_back(std::move(h));
  else hosts_[static_cast<size_t>(i)].slots += h.slots;
}

void HostSet::mark_draining_at(size_t index) { hosts_[index].draining = true; }

void HostSet::set_rack_at(size_t index, std::string rack) { hosts_[index].rack = std::move(rack); }

bool HostSet::any_draining() const {
  return std::any_of(hosts_.begin(), hosts_.end(), [](const Host& h) { return h.draining; });
}

std::string HostSet::to_string() const {
  std::string out;
  for (const auto& h : hosts_) {
    if (!out.empty()) out += ',';
    out += fmt::format("{}:{}", display_name(h.name), h.slots);
  }
  return out;
}

std::string HostSet::summary(size_t max_hosts) const {
  if (hosts_.size() <= max_hosts) return to_string();
  std::string out;
  for (size_t i = 0; i < max_hosts; ++i) {
    out += fmt::format("{}:{},", display_name(hosts_[i].name), hosts_[i].slots);
  }
  return out + fmt::format("... ({} hosts, {} slots)", hosts_.size(), total_slots());
}

Status validate_hostname(std::string_view name) {
  auto bad = [&](std::string_view why) {
    return Status::error(fmt::format("\"{}\" is not a valid host: {}", escape_for_log(name), why));
  };
  if (name.empty()) return Status::error("empty host name: give a hostname or an IP address");
  if (is_ipv6(name)) {
    auto pct = name.find('%');
    std::string addr(name.substr(0, pct));
    if (pct != std::string_view::npos) {
      auto zone = name.substr(pct + 1);
      if (zone.empty()) return bad("empty IPv6 zone after '%'");
      for (char c : zone) {
        if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') {
          return bad("bad character in the IPv6 zone");
        }
      }
    }
    in6_addr a6;
    if (::inet_pton(AF_INET6, addr.c_str(), &a6) != 1) {
      return bad("not an IPv6 address (an IPv6 address with slots goes as [addr]:slots)");
    }
    return Status::ok();
  }
  if (name.size() > 253) return bad("longer than 253 characters");
  std::string copy(name);
  in_addr a4;
  if (::inet_pton(AF_INET, copy.c_str(), &a4) == 1) return Status::ok();
  auto labels = split(name, '.');
  for (const auto& label : labels) {
    if (label.empty()) {
      return bad(name.back() == '.' ? "remove the trailing '.'" : "empty label between dots");
    }
    if (label.size() > 63) return bad("a label is longer than 63 characters");
    for (char c : label) {
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-') {
        return bad(fmt::format(
            "character '{}' is not allowed (use letters, digits, '-' and '.', or an IP address)",
            escape_for_log(std::string_view(&c, 1))));
      }
    }
    if (label.front() == '-' || label.back() == '-') {
      return bad("a label starts or ends with '-'");
    }
  }
  if (all_digits(labels.back())) return bad("looks like an IPv4 address but is not one");
  return Status::ok();
}

Result<HostSet> parse_discovery_output(std::string_view text, int default_slots,
                                       DuplicatePolicy dup) {
  HostSet set;
  std::unordered_map<std::string, Seen> first_seen;
  // Lines as views into `text`: no copy of a 20,000-line output.
  size_t no = 0;
  for (size_t start = 0; start <= text.size();) {
    auto nl = text.find('\n', start);
    if (nl == std::string_view::npos) nl = text.size();
    auto raw = text.substr(start, nl - start);
    start = nl + 1;
    ++no;
    if (auto why = check_line_bytes(raw); !why.empty()) {
      return Result<HostSet>::error(fmt::format(
          "discovery output line {} \"{}\": {}; fix the script's output", no,
          escape_for_log(trim(raw)), why));
    }
    auto line = strip_comment(raw);
    if (line.empty()) continue;
    auto shown = escape_for_log(trim(raw));
    // Words after the host: `draining` (it leaves the job at its workers'
    // next commit: a notice, not a failure) and `rack=NAME` (standbys are
    // taken nearest: same host, then same rack). Old scripts never print a
    // second word: it was an error before.
    bool draining = false;
    std::string_view rack;
    if (line.find_first_of(" \t") != std::string_view::npos) {  // most lines are a host alone
      auto words = split_words(line);
      size_t n = words.size();
      for (; n > 1; --n) {  // known words, taken from the end
        const std::string_view w = words[n - 1];
        if (w == "draining" && !draining) {
          draining = true;
        } else if (starts_with(w, "rack=") && rack.empty() && valid_rack(w.substr(5))) {
          rack = w.substr(5);
        } else {
          break;
        }
      }
      // What is left is the host (anything else there: parse_host_spec says what).
      const std::string_view last = words[n - 1];
      line = line.substr(0, static_cast<size_t>(last.data() + last.size() - line.data()));
    }
    auto h = parse_host_spec(line, default_slots);
    if (!h) {
      return Result<HostSet>::error(fmt::format(
          "discovery output line {} \"{}\": {} (expected host[:slots], or host[:slots] draining for a host that "
          "leaves; rack=NAME may follow)",
          no, shown, h.message()));
    }
    h->draining = draining;
    h->rack = std::string(rack);
    if (auto st = add_host(set, first_seen, std::move(*h), no, dup, "line"); !st) {
      return Result<HostSet>::error(
          fmt::format("discovery output line {} \"{}\": {}", no, shown, st.message()));
    }
  }
  return set;
}

Result<HostSet> parse_hosts_flag(std::string_view value, int default_slots) {
  HostSet set;
  std::unordered_map<std::string, Seen> first_seen;
  if (trim(value).empty()) {
    return Result<HostSet>::error("-H is empty: give hosts as host[:slots],..., e.g. -H a:4,b:4");
  }
  auto items = split(value, ',');
  for (size_t i = 0; i < items.size(); ++i) {
    auto item = trim(items[i]);
    size_t no = i + 1;
    if (item.empty()) {
      return Result<HostSet>::error(
          fmt::format("-H item {} is empty: remove the extra ',' (e.g. -H a:4,b:4)", no));
    }
    auto why = check_line_bytes(item);
    if (why.empty() && item.find('#') != std::string_view::npos) why = "'#' is not allowed here";
    if (!why.empty()) {
      return Result<HostSet>::error(fmt::format("-H item {} \"{}\": {}", no, escape_for_log(item), why));
    }
    auto h = parse_host_spec(item, default_slots);
    if (!h) {
      return Result<HostSet>::error(fmt::format(
          "-H item {} \"{}\": {} (expected host[:slots], e.g. -H a:4,b:4)", no, item, h.message()));
    }
    if (auto st = add_host(set, first_seen, std::move(*h), no, DuplicatePolicy::kReject, "item");
        !st) {
      return Result<HostSet>::error(fmt::format("-H item {} \"{}\": {}", no, item, st.message()));
    }
  }
  return set;
}

Result<HostSet> parse_hostfile(std::string_view text, int default_slots) {
  HostSet set;
  std::unordered_map<std::string, Seen> first_seen;
  auto lines = split(text, '\n');
  for (size_t i = 0; i < lines.size(); ++i) {
    size_t no = i + 1;
    auto shown = escape_for_log(trim(lines[i]));
    auto fail = [&](std::string_view why) {
      return Result<HostSet>::error(fmt::format(
          "hostfile line {} \"{}\": {} (expected host, host:slots or host slots=N)", no, shown,
          why));
    };
    if (auto why = check_line_bytes(lines[i]); !why.empty()) return fail(why);
    auto line = strip_comment(lines[i]);
    if (line.empty()) continue;
    const auto words = split_words(line);
    bool colon_slots = false;
    auto h = parse_host_spec(words[0], default_slots, &colon_slots);
    if (!h) return fail(h.message());
    bool seen_slots = false;
    for (size_t w = 1; w < words.size(); ++w) {
      auto eq = words[w].find('=');
      if (eq == std::string_view::npos) return fail(fmt::format("unexpected \"{}\"", words[w]));
      auto key = words[w].substr(0, eq);
      auto val = words[w].substr(eq + 1);
      long n = 0;
      if (key == "slots") {
        if (colon_slots || seen_slots) return fail("slots given twice");
        auto why = check_slots(val, n);
        if (!why.empty()) return fail(why);
        h->slots = static_cast<int>(n);
        seen_slots = true;
      } else if (key == "max_slots" || key == "max-slots") {
        auto why = check_slots(val, n);
        if (!why.empty()) return fail(fmt::format("max_{}", why));
      } else {
        return fail(fmt::format("unknown key \"{}\" (known: slots, max_slots)", key));
      }
    }
    if (auto st = add_host(set, first_seen, std::move(*h), no, DuplicatePolicy::kMerge, "line");
        !st) {
      return fail(st.message());
    }
  }
  return set;
}

Result<std::vector<std::string>> expand_slurm_hostlist(std::string_view expr) {
  using R = Result<std::vector<std::string>>;
  auto fail = [&](std::string_view why) {
    std::string msg(why);
    auto dup = fmt::format("\"{}\": ", expr);
    if (starts_with(msg, dup)) msg.erase(0, dup.size());
    return R::error(fmt::format("Slurm hostlist \"{}\": {} (expected e.g. node[01-04,07],gpu1)",
                                expr, msg));
  };
  if (trim(expr).empty()) return fail("it is empty");
  std::vector<std::string> out;
  // Top-level separators are ',' and whitespace; commas inside brackets belong to a range list.
  int depth = 0;
  std::string item;
  auto flush = [&]() -> Status {
    if (item.empty()) return Status::ok();
    auto st = expand_one(item, out);
    item.clear();
    return st;
  };
  for (char c : expr) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth < 0) return fail("']' without a '['");
    if (depth == 0 && (c == ',' || std::isspace(static_cast<unsigned char>(c)))) {
      if (auto st = flush(); !st) return fail(st.message());
      continue;
    }
    item += c;
  }
  if (depth != 0) return fail("'[' without a closing ']'");
  if (auto st = flush(); !st) return fail(st.message());
  if (out.empty()) return fail("it names no hosts");
  for (const auto& name : out) {
    if (auto st = validate_hostname(name); !st) return fail(st.message());
  }
  return out;
}

Result<std::vector<int>> expand_slurm_counts(std::string_view expr) {
  using R = Result<std::vector<int>>;
  auto fail = [&](std::string_view why) {
    std::string msg(why);
    auto dup = fmt::format("\"{}\": ", expr);
    if (starts_with(msg, dup)) msg.erase(0, dup.size());
    return R::error(fmt::format("Slurm count list \"{}\": {} (expected e.g. 2(x3),1)", expr, msg));
  };
  if (trim(expr).empty()) return fail("it is empty");
  std::vector<int> out;
  for (const auto& raw : split(expr, ',')) {
    auto item = trim(raw);
    if (item.empty()) return fail("empty item");
    long count = 0, repeat = 1;
    auto paren = item.find('(');
    auto count_s = item.substr(0, paren);
    if (!all_digits(count_s) || !parse_int(count_s, count) || count <= 0 || count > kMaxSlots) {
      return fail(fmt::format("\"{}\" is not a positive count", item));
    }
    if (paren != std::string_view::npos) {
      auto rest = item.substr(paren);
      if (rest.size() < 4 || rest.substr(0, 2) != "(x" || rest.back() != ')') {
        return fail(fmt::format("\"{}\": a repeat is written N(xM)", item));
      }
      auto rep_s = rest.substr(2, rest.size() - 3);
      if (!all_digits(rep_s) || !parse_int(rep_s, repeat) || repeat <= 0 ||
          static_cast<size_t>(repeat) > kMaxExpandedHosts) {
        return fail(fmt::format("\"{}\": bad repeat count", item));
      }
    }
    if (out.size() + static_cast<size_t>(repeat) > kMaxExpandedHosts) return fail("too many counts");
    out.insert(out.end(), static_cast<size_t>(repeat), static_cast<int>(count));
  }
  return out;
}

Result<HostSet> slurm_hosts(std::string_view nodelist, std::string_view counts) {
  auto names = expand_slurm_hostlist(nodelist);
  if (!names) return names.status();
  std::vector<int> slots;
  if (trim(counts).empty()) {
    slots.assign(names->size(), 1);
  } else {
    auto c = expand_slurm_counts(counts);
    if (!c) return c.status();
    slots = std::move(*c);
    if (slots.size() == 1) slots.assign(names->size(), slots[0]);
  }
  if (slots.size() != names->size()) {
    return Result<HostSet>::error(fmt::format(
        "Slurm allocation: {} hosts in \"{}\" but {} counts in \"{}\": give one count per host "
        "or a single count for all",
        names->size(), nodelist, slots.size(), counts));
  }
  HostSet set;
  std::unordered_map<std::string, Seen> first_seen;
  for (size_t i = 0; i < names->size(); ++i) {
    if (auto st = add_host(set, first_seen, Host{(*names)[i], slots[i]}, i + 1,
                           DuplicatePolicy::kReject, "position");
        !st) {
      return Result<HostSet>::error(fmt::format("Slurm hostlist \"{}\": {}", nodelist, st.message()));
    }
  }
  return set;
}

std::string HostDiff::to_string() const {
  if (empty()) return "no change";
  std::vector<std::string> parts;
  for (const auto& a : added) parts.push_back("+" + a);
  for (const auto& r : removed) parts.push_back("-" + r);
  for (const auto& c : changed) {
    parts.push_back(fmt::format("{}:{}->{}", display_name(c.host), c.old_slots, c.new_slots));
  }
  return join(parts, " ");
}

std::string HostDiff::summary(size_t max_items) const {
  size_t total = added.size() + removed.size() + changed.size();
  if (total <= max_items) return to_string();
  HostDiff cut;
  size_t left = max_items;
  auto take = [&](const auto& from, auto& to) {
    for (size_t i = 0; i < from.size() && left > 0; ++i, --left) to.push_back(from[i]);
  };
  take(added, cut.added);
  take(removed, cut.removed);
  take(changed, cut.changed);
  return fmt::format("{} ... ({} added, {} removed, {} changed)", cut.to_string(), added.size(),
                     removed.size(), changed.size());
}

HostDiff diff_hosts(const HostSet& before, const HostSet& after) {
  HostDiff d;
  std::unordered_map<std::string_view, int> old_slots;
  for (const auto& h : before.hosts()) old_slots.emplace(h.name, h.slots);
  std::unordered_map<std::string_view, int> new_slots;
  for (const auto& h : after.hosts()) new_slots.emplace(h.name, h.slots);
  for (const auto& h : after.hosts()) {
    auto it = old_slots.find(h.name);
    if (it == old_slots.end()) d.added.push_back(h.name);
    else if (it->second != h.slots) d.changed.push_back({h.name, it->second, h.slots});
  }
  for (const auto& h : before.hosts()) {
    if (!new_slots.count(h.name)) d.removed.push_back(h.name);
  }
  return d;
}

}  // namespace erun
