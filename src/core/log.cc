#include "core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cctype>
#include <cstdlib>
#include <mutex>

namespace tessera {
namespace {

void SetPrefix(spdlog::logger& logger, const std::string& role) {
  logger.set_pattern("%H:%M:%S.%e %^%L%$ [" + role + "] %v");
}

}  // namespace

Result<spdlog::level::level_enum> LogLevelFromEnv() {
  const char* text = std::getenv("TESSERA_LOG_LEVEL");
  if (text == nullptr || *text == '\0') return spdlog::level::info;
  const std::string level = text;
  // Any case: WARN is as plain a spelling as warn.
  std::string lower = level;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const auto& [name, value] :
       {std::pair<const char*, spdlog::level::level_enum>{"trace", spdlog::level::trace},
        {"debug", spdlog::level::debug},
        {"info", spdlog::level::info},
        {"warn", spdlog::level::warn},
        {"warning", spdlog::level::warn},
        {"error", spdlog::level::err},
        {"off", spdlog::level::off}}) {
    if (lower == name) return value;
  }
  return Status::InvalidArgument("TESSERA_LOG_LEVEL='" + level +
                                 "' is not one of trace, debug, info, warn, error, off");
}

spdlog::logger& Logger() {
  // Never registered with spdlog, so that nothing of the application's
  // (spdlog::set_level, set_pattern, drop_all) changes it by accident.
  static spdlog::logger* logger = [] {
    auto* l =
        new spdlog::logger("tessera", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
    SetPrefix(*l, "tessera");
    l->set_level(LogLevelFromEnv().value_or(spdlog::level::info));
    return l;
  }();
  return *logger;
}

Status InitLogging(const std::string& role) {
  SetPrefix(Logger(), role);
  auto level = LogLevelFromEnv();
  if (!level.ok()) return level.status();
  Logger().set_level(*level);
  return Status::Ok();
}

}  // namespace tessera
