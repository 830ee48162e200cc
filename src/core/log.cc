#include "core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <mutex>
#include <string_view>

namespace tessera {
namespace {

bool IsControl(char c) {
  const auto u = static_cast<unsigned char>(c);
  return (u < 0x20 && c != '\t') || u == 0x7f;
}

// Passes each line on with its control characters escaped ("\n", "\x1b"):
// a peer's task name or message with a newline or an ANSI escape in it
// (logged as a peer sent it) can neither forge a line nor hide one.
class EscapingSink final : public spdlog::sinks::sink {
 public:
  explicit EscapingSink(std::shared_ptr<spdlog::sinks::sink> inner) : inner_(std::move(inner)) {}
  void log(const spdlog::details::log_msg& msg) override {
    const std::string_view in(msg.payload.data(), msg.payload.size());
    if (std::none_of(in.begin(), in.end(), IsControl)) return inner_->log(msg);
    std::string out;
    out.reserve(in.size() + 16);
    for (char c : in) {
      if (!IsControl(c)) {
        out += c;
      } else if (c == '\n') {
        out += "\\n";
      } else if (c == '\r') {
        out += "\\r";
      } else {
        static const char* kHex = "0123456789abcdef";
        const auto u = static_cast<unsigned char>(c);
        out += "\\x";
        out += kHex[u >> 4];
        out += kHex[u & 15];
      }
    }
    spdlog::details::log_msg escaped = msg;
    escaped.payload = spdlog::string_view_t(out.data(), out.size());
    inner_->log(escaped);
  }
  void flush() override { inner_->flush(); }
  void set_pattern(const std::string& pattern) override { inner_->set_pattern(pattern); }
  void set_formatter(std::unique_ptr<spdlog::formatter> formatter) override {
    inner_->set_formatter(std::move(formatter));
  }

 private:
  std::shared_ptr<spdlog::sinks::sink> inner_;
};

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
    auto* l = new spdlog::logger(
        "tessera",
        std::make_shared<EscapingSink>(std::make_shared<spdlog::sinks::stderr_color_sink_mt>()));
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
