// erun's own log: timestamped lines on stderr through spdlog, so they never mix
// with the workers' forwarded output on stdout. Lines about a worker say which
// generation, host and rank they concern; use who() to format that prefix.
#pragma once

#include <spdlog/spdlog.h>

#include <string>
#include <string_view>

namespace erun {

// Sets up the "erun" logger (stderr, timestamps, under the status line);
// idempotent. verbose enables debug lines; ERUN_QUIET=1 in the environment (a
// terminal with the status line, which says what the info lines would) keeps
// warnings and errors only.
void init_logging(bool verbose);

// "gen 3 127.0.0.2 rank 1" (parts with a negative value or an empty host are left out).
std::string who(long generation, std::string_view host = {}, int rank = -1);

}  // namespace erun

#define ERUN_LOG_DEBUG(...) spdlog::debug(__VA_ARGS__)
#define ERUN_LOG_INFO(...) spdlog::info(__VA_ARGS__)
#define ERUN_LOG_WARN(...) spdlog::warn(__VA_ARGS__)
#define ERUN_LOG_ERROR(...) spdlog::error(__VA_ARGS__)
