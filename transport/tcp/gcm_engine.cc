#include "transport/tcp/gcm_engine.h"

namespace tessera::transport::tcp {

Result<std::unique_ptr<GcmEngine>> GcmEngine::Create(const std::array<uint8_t, 32>& key,
                                                     const GcmOptions& options) {
  switch (options.library) {
    case GcmLibrary::kOpenSsl:
      return CreateOpenSslGcm(key, options);
    case GcmLibrary::kIpsecMb:
      return CreateIpsecMbGcm(key, options);
    case GcmLibrary::kFastest:
      break;
  }
  if (IpsecMbRunsHere()) return CreateIpsecMbGcm(key, options);
  return CreateOpenSslGcm(key, options);
}

}  // namespace tessera::transport::tcp
