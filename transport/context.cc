#include "transport/transport.h"
#include "transport/ucx/ucx_context.h"

namespace tessera::transport {

Result<std::unique_ptr<Context>> Context::Open(const ContextOptions& options) {
  if (options.backend == "ucx") return UcxContext::Create(options);
  if (options.backend == "verbs") {
    return Status::Unimplemented("the verbs backend is not built yet; use --transport ucx");
  }
  return Status::InvalidArgument("unknown transport backend '" + options.backend +
                                 "' (expected ucx or verbs)");
}

void ApplyBackendDefaults(const std::string& backend) {
  if (backend == "ucx") ApplyUcxDefaults();
}

}  // namespace tessera::transport
