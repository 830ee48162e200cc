#include "core/log.h"

#include <cstdlib>

#include <spdlog/cfg/helpers.h>
#include <spdlog/sinks/stdout_color_sinks.h>

namespace tessera {

void InitLogging(const std::string& role) {
  spdlog::drop("tessera:" + role);
  auto logger = spdlog::stderr_color_mt("tessera:" + role);
  logger->set_pattern("%H:%M:%S.%e %^%L%$ [" + role + "] %v");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::info);
  if (const char* level = std::getenv("TESSERA_LOG_LEVEL")) {
    spdlog::set_level(spdlog::level::from_str(level));
  }
}

}  // namespace tessera
