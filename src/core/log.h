// Logging: spdlog behind short macros, one logger for the process.
// TESSERA_LOG_LEVEL=trace|debug|info|warn|error|off sets the level.
#pragma once

#include <spdlog/spdlog.h>

#include <string>

namespace tessera {

// Sets the level from TESSERA_LOG_LEVEL and a "[role] " prefix for every line.
void InitLogging(const std::string& role);

}  // namespace tessera

#define TLOG_TRACE(...) SPDLOG_TRACE(__VA_ARGS__)
#define TLOG_DEBUG(...) ::spdlog::debug(__VA_ARGS__)
#define TLOG_INFO(...) ::spdlog::info(__VA_ARGS__)
#define TLOG_WARN(...) ::spdlog::warn(__VA_ARGS__)
#define TLOG_ERROR(...) ::spdlog::error(__VA_ARGS__)
