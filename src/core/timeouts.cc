#include "core/timeouts.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>

namespace tessera {
namespace {

// The whole of `text` as a finite number, else nullopt-like false.
bool ParseNumber(const char* text, double* out) {
  if (text == nullptr || *text == '\0') return false;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text, &end);
  if (errno != 0 || end == text || *end != '\0' || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

}  // namespace

Result<double> TimeoutScale() {
  const char* text = std::getenv("TESSERA_TIMEOUT_SCALE");
  if (text == nullptr || *text == '\0') return 1.0;
  double scale = 0;
  if (!ParseNumber(text, &scale) || scale <= 0 || scale > 1000) {
    return Status::InvalidArgument(std::string("TESSERA_TIMEOUT_SCALE='") + text +
                                   "': expected a factor above 0 and at most 1000");
  }
  return scale;
}

Result<std::chrono::milliseconds> TimeoutFromEnv(const char* name,
                                                 std::chrono::milliseconds configured) {
  auto scale = TimeoutScale();
  if (!scale.ok()) return scale.status();
  double ms = static_cast<double>(configured.count());
  if (const char* text = std::getenv(name); text != nullptr && *text != '\0') {
    // At most a day: a larger value is a typo, not a timeout.
    if (!ParseNumber(text, &ms) || ms < 0 || ms > 86'400'000) {
      return Status::InvalidArgument(std::string(name) + "='" + text +
                                     "': expected milliseconds from 0 to 86400000");
    }
  }
  return std::chrono::milliseconds(std::llround(ms * *scale));
}

}  // namespace tessera
