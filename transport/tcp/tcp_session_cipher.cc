#include "transport/tcp/tcp_session_cipher.h"

namespace tessera::transport::tcp {

Result<std::unique_ptr<SessionCipher>> SessionCipher::Create(const SessionKeys::Half& keys,
                                                             const Options& options) {
  GcmOptions gcm;
  gcm.library = options.library;
  gcm.seal = options.direction == Direction::kSeal;
  gcm.encrypt = options.encrypt;
  auto engine = GcmEngine::Create(keys.key, gcm);
  if (!engine.ok()) return engine.status();
  return std::unique_ptr<SessionCipher>(new SessionCipher(std::move(*engine), keys));
}

SessionCipher::~SessionCipher() = default;

void SessionCipher::Begin() {
  std::array<uint8_t, 12> iv = base_iv_;
  const uint64_t seq = sequence_++;
  for (int i = 0; i < 8; ++i) iv[11 - i] ^= static_cast<uint8_t>(seq >> (8 * i));
  engine_->Start(iv);
}

}  // namespace tessera::transport::tcp
