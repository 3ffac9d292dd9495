#include "common/log.h"

#include <spdlog/sinks/base_sink.h>

#include <cstdlib>
#include <mutex>
#include <string_view>

#include "common/status_line.h"

namespace erun {
namespace {

// stderr, through the status line: a log line never lands inside it.
class StderrSink final : public spdlog::sinks::base_sink<std::mutex> {
 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t line;
    formatter_->format(msg, line);
    (void)StatusLine::get().write_above(2, std::string_view(line.data(), line.size()));
  }
  void flush_() override {}
};

}  // namespace

std::optional<LogLevel> parse_log_level(std::string_view text) {
  if (text == "error") return LogLevel::kError;
  if (text == "warn" || text == "warning") return LogLevel::kWarn;
  if (text == "info") return LogLevel::kInfo;
  if (text == "debug") return LogLevel::kDebug;
  return std::nullopt;
}

const char* log_level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kError:
      return "error";
    case LogLevel::kWarn:
      return "warn";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kDebug:
      return "debug";
  }
  return "info";
}

LogLevel log_level_from_env(LogLevel otherwise) {
  const char* v = std::getenv("ERUN_LOG_LEVEL");
  return v ? parse_log_level(v).value_or(otherwise) : otherwise;
}

void init_logging(LogLevel level) {
  static std::once_flag once;
  std::call_once(once, [] {
    auto logger = std::make_shared<spdlog::logger>("erun", std::make_shared<StderrSink>());
    spdlog::register_logger(logger);
    logger->set_pattern("%Y-%m-%d %H:%M:%S.%e erun %l: %v");
    logger->flush_on(spdlog::level::trace);
    spdlog::set_default_logger(logger);
  });
  spdlog::set_level(level == LogLevel::kDebug  ? spdlog::level::debug
                    : level == LogLevel::kInfo ? spdlog::level::info
                    : level == LogLevel::kWarn ? spdlog::level::warn
                                               : spdlog::level::err);
}

std::string who(long generation, std::string_view host, int rank) {
  std::string out;
  if (generation >= 0) out += fmt::format("gen {}", generation);
  if (!host.empty()) out += fmt::format("{}{}", out.empty() ? "" : " ", host);
  if (rank >= 0) out += fmt::format("{}rank {}", out.empty() ? "" : " ", rank);
  return out;
}

}  // namespace erun
