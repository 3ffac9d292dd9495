#include "common/log.h"

#include <spdlog/sinks/stdout_sinks.h>

#include <mutex>

namespace erun {

void init_logging(bool verbose) {
  static std::once_flag once;
  std::call_once(once, [] {
    auto logger = spdlog::stderr_logger_mt("erun");
    logger->set_pattern("%Y-%m-%d %H:%M:%S.%e erun %l: %v");
    logger->flush_on(spdlog::level::trace);
    spdlog::set_default_logger(logger);
  });
  spdlog::set_level(verbose ? spdlog::level::debug : spdlog::level::info);
}

std::string who(long generation, std::string_view host, int rank) {
  std::string out;
  if (generation >= 0) out += fmt::format("gen {}", generation);
  if (!host.empty()) out += fmt::format("{}{}", out.empty() ? "" : " ", host);
  if (rank >= 0) out += fmt::format("{}rank {}", out.empty() ? "" : " ", rank);
  return out;
}

}  // namespace erun
