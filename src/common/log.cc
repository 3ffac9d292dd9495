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

void init_logging(bool verbose) {
  // Under erun's status line (ERUN_QUIET=1: erun itself, its agents and its
  // workers, which inherit it) only warnings and errors are said.
  const char* q = std::getenv("ERUN_QUIET");
  const bool quiet = q && std::string_view(q) == "1";
  static std::once_flag once;
  std::call_once(once, [] {
    auto logger = std::make_shared<spdlog::logger>("erun", std::make_shared<StderrSink>());
    spdlog::register_logger(logger);
    logger->set_pattern("%Y-%m-%d %H:%M:%S.%e erun %l: %v");
    logger->flush_on(spdlog::level::trace);
    spdlog::set_default_logger(logger);
  });
  spdlog::set_level(verbose ? spdlog::level::debug : quiet ? spdlog::level::warn : spdlog::level::info);
}

std::string who(long generation, std::string_view host, int rank) {
  std::string out;
  if (generation >= 0) out += fmt::format("gen {}", generation);
  if (!host.empty()) out += fmt::format("{}{}", out.empty() ? "" : " ", host);
  if (rank >= 0) out += fmt::format("{}rank {}", out.empty() ? "" : " ", rank);
  return out;
}

}  // namespace erun
