#include "runner/observe/events.h"

#include <cmath>
#include <cstdio>
#include <ctime>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace erun {
namespace {

using json = nlohmann::json;

std::string json_value(const std::string& v) { return json_string(v); }
std::string json_value(long v) { return fmt::format("{}", v); }
std::string json_value(double v) { return fmt::format("{:.6g}", v); }
std::string json_value(bool v) { return v ? "true" : "false"; }
std::string json_value(const std::map<std::string, long>& v) {
  std::string out = "{";
  for (auto& [k, n] : v) out += fmt::format("{}{}:{}", out.size() > 1 ? "," : "", json_string(k), n);
  return out + "}";
}

// A field read back: set only when the log's value has the field's type
// (any number for a number).
void json_read(const json& j, std::string& v) {
  if (j.is_string()) v = j.get<std::string>();
}
void json_read(const json& j, long& v) {
  if (j.is_number_integer()) v = j.get<long>();
  else if (j.is_number()) v = static_cast<long>(j.get<double>());
}
void json_read(const json& j, double& v) {
  if (j.is_number()) v = j.get<double>();
}
void json_read(const json& j, bool& v) {
  if (j.is_boolean()) v = j.get<bool>();
}
void json_read(const json& j, std::map<std::string, long>& v) {
  if (!j.is_object()) return;
  for (auto& [k, n] : j.items()) json_read(n, v[k]);
}

// "2026-11-28T14:38:24.994Z" (the log's "time") as seconds since the epoch.
std::optional<double> parse_time(const std::string& s) {
  int y, mo, d, h, mi, sec, ms = 0;
  if (std::sscanf(s.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d.%3dZ", &y, &mo, &d, &h, &mi, &sec, &ms) < 6) {
    return std::nullopt;
  }
  tm t{};
  t.tm_year = y - 1900;
  t.tm_mon = mo - 1;
  t.tm_mday = d;
  t.tm_hour = h;
  t.tm_min = mi;
  t.tm_sec = sec;
  return static_cast<double>(timegm(&t)) + ms / 1000.0;
}

std::string time_text(double time) {
  const long long ms_since_epoch = std::llround(time * 1000);
  const time_t sec = static_cast<time_t>(ms_since_epoch / 1000);
  tm utc;
  gmtime_r(&sec, &utc);
  char when[32];
  strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &utc);
  return fmt::format("{}.{:03d}Z", when, static_cast<int>(ms_since_epoch % 1000));
}

template <class E>
E read_fields(const json& j) {
  E e;
  std::apply(
      [&j](auto... f) {
        auto read = [&j](auto& field) {
          if (auto it = j.find(field.name); it != j.end()) json_read(*it, field.value);
        };
        (read(f), ...);
      },
      e.fields());
  return e;
}

// The event type named `name` with the fields of `j`; none for a name no
// type has.
template <size_t... I>
std::optional<Event> read_event(const std::string& name, const json& j, std::index_sequence<I...>) {
  std::optional<Event> out;
  ((name == std::variant_alternative_t<I, Event>::kName
        ? (void)out.emplace(read_fields<std::variant_alternative_t<I, Event>>(j))
        : void()),
   ...);
  return out;
}

}  // namespace

const char* event_name(const Event& event) {
  return std::visit([](const auto& e) { return std::decay_t<decltype(e)>::kName; }, event);
}

std::string event_line(const Stamp& stamp, const Event& event) {
  std::string line =
      fmt::format(R"({{"time":"{}","t":{:.3f},"event":"{}")", time_text(stamp.time), stamp.t, event_name(event));
  std::visit(
      [&line](const auto& e) {
        using E = std::decay_t<decltype(e)>;
        std::apply([&line](auto... f) { ((line += fmt::format(",\"{}\":{}", f.name, json_value(f.value))), ...); },
                   const_cast<E&>(e).fields());
      },
      event);
  return line + "}";
}

std::optional<LoggedEvent> parse_event_line(std::string_view line) {
  json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  auto text = [&j](const char* key) {
    auto it = j.find(key);
    return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  const std::string name = text("event");
  std::optional<double> when = parse_time(text("time"));
  if (name.empty() || !when) return std::nullopt;
  LoggedEvent out;
  out.stamp.time = *when;
  if (auto t = j.find("t"); t != j.end() && t->is_number()) out.stamp.t = t->get<double>();
  out.event = read_event(name, j, std::make_index_sequence<std::variant_size_v<Event>>());
  return out;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) out += fmt::format("\\u{:04x}", c);
        else out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

}  // namespace erun
