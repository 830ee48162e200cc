// Logging: spdlog behind short macros, through Tessera's own logger
// ("tessera"), never the application's default one, so that a trainer that
// links Tessera keeps its own format and levels.
//
// TESSERA_LOG_LEVEL=trace|debug|info|warn|error|off sets the level; any
// other value is an error that Server::Start, Client::Connect and the
// command-line tools report.
#pragma once

#include <spdlog/spdlog.h>

#include <memory>
#include <string>

#include "tessera/status.h"

namespace tessera {

// Tessera's logger, made on first use (stderr, "[tessera]" prefix, the
// level TESSERA_LOG_LEVEL names or info).
spdlog::logger& Logger();
// The level TESSERA_LOG_LEVEL names (info when unset), or an error naming
// the bad value.
Result<spdlog::level::level_enum> LogLevelFromEnv();
// Sets the logger's "[role] " prefix (a process that is one task) and its
// level from TESSERA_LOG_LEVEL; an error for a bad level, which is then left
// as it was.
Status InitLogging(const std::string& role);

}  // namespace tessera

#define TLOG_TRACE(...) SPDLOG_LOGGER_TRACE(&::tessera::Logger(), __VA_ARGS__)
#define TLOG_DEBUG(...) ::tessera::Logger().debug(__VA_ARGS__)
#define TLOG_INFO(...) ::tessera::Logger().info(__VA_ARGS__)
#define TLOG_WARN(...) ::tessera::Logger().warn(__VA_ARGS__)
#define TLOG_ERROR(...) ::tessera::Logger().error(__VA_ARGS__)
