// erun's own log: timestamped lines on stderr through spdlog, so they never mix
// with the workers' forwarded output on stdout. Lines about a worker say which
// generation, host and rank they concern; use who() to format that prefix.
#pragma once

#include <spdlog/spdlog.h>

#include <optional>
#include <string>
#include <string_view>

namespace erun {

// What erun's processes say: erun itself says warnings and errors by default
// (`--log-level`, `-v`), and hands its level to its agents and workers
// (ERUN_LOG_LEVEL).
enum class LogLevel { kError, kWarn, kInfo, kDebug };

// "error", "warn" (or "warning"), "info", "debug"; nullopt for anything else.
std::optional<LogLevel> parse_log_level(std::string_view text);
const char* log_level_name(LogLevel level);
// The level ERUN_LOG_LEVEL names in the environment, or `otherwise` (unset or
// not a level).
LogLevel log_level_from_env(LogLevel otherwise);

// Sets up the "erun" logger (stderr, timestamps, under the status line) at
// `level`; idempotent (a later call sets the level again).
void init_logging(LogLevel level);

// "gen 3 127.0.0.2 rank 1" (parts with a negative value or an empty host are left out).
std::string who(long generation, std::string_view host = {}, int rank = -1);

}  // namespace erun

#define ERUN_LOG_DEBUG(...) spdlog::debug(__VA_ARGS__)
#define ERUN_LOG_INFO(...) spdlog::info(__VA_ARGS__)
#define ERUN_LOG_WARN(...) spdlog::warn(__VA_ARGS__)
#define ERUN_LOG_ERROR(...) spdlog::error(__VA_ARGS__)
