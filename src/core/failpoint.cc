#include "core/failpoint.h"

#include <cstdlib>
#include <string_view>

namespace tessera {

FailPoint::FailPoint(const char* name) : name_(name) {
  const char* spec = std::getenv("TESSERA_FAIL_AT");
  if (spec == nullptr) return;
  const std::string_view want(spec);
  const size_t colon = want.find(':');
  if (want.substr(0, colon) != name_) return;
  fail_at_ = colon == std::string_view::npos ? 1 : std::strtoull(spec + colon + 1, nullptr, 10);
}

Status FailPoint::Injected() const {
  return Status::Internal("failure injected at '" + name_ + "' (TESSERA_FAIL_AT)");
}

}  // namespace tessera
