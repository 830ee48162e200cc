#include "transport/tcp/tcp_session_cipher.h"

#include <openssl/evp.h>

#include <algorithm>
#include <climits>
#include <cstring>

namespace tessera::transport::tcp {

struct SessionCipher::Ctx {
  EVP_CIPHER_CTX* evp = EVP_CIPHER_CTX_new();
  ~Ctx() { EVP_CIPHER_CTX_free(evp); }
};

Result<std::unique_ptr<SessionCipher>> SessionCipher::Create(const SessionKeys::Half& keys,
                                                             Direction direction, bool encrypt) {
  auto ctx = std::make_unique<Ctx>();
  const int enc = direction == Direction::kSeal ? 1 : 0;
  if (ctx->evp == nullptr ||
      EVP_CipherInit_ex(ctx->evp, EVP_aes_256_gcm(), nullptr, keys.key.data(), nullptr, enc) != 1) {
    return Status::Internal("OpenSSL could not set up AES-256-GCM for the session");
  }
  return std::unique_ptr<SessionCipher>(
      new SessionCipher(std::move(ctx), keys, direction, encrypt));
}

SessionCipher::SessionCipher(std::unique_ptr<Ctx> ctx, const SessionKeys::Half& keys,
                             Direction direction, bool encrypt)
    : ctx_(std::move(ctx)), base_iv_(keys.iv), direction_(direction), encrypt_(encrypt) {}

SessionCipher::~SessionCipher() = default;

void SessionCipher::Begin() {
  std::array<uint8_t, 12> iv = base_iv_;
  const uint64_t seq = sequence_++;
  for (int i = 0; i < 8; ++i) iv[11 - i] ^= static_cast<uint8_t>(seq >> (8 * i));
  // The key stays; only the nonce is new (GCM's default 12-byte IV).
  EVP_CipherInit_ex(ctx_->evp, nullptr, nullptr, nullptr, iv.data(),
                    direction_ == Direction::kSeal ? 1 : 0);
}

void SessionCipher::Update(const uint8_t* in, uint8_t* out, size_t len) {
  while (len > 0) {
    const int piece = static_cast<int>(std::min<size_t>(len, INT_MAX / 2));
    int written = 0;
    if (encrypt_) {
      EVP_CipherUpdate(ctx_->evp, out, &written, in, piece);
    } else {
      // Integrity only: the bytes are GCM's associated data, and go as they are.
      EVP_CipherUpdate(ctx_->evp, nullptr, &written, in, piece);
      if (out != in) std::memcpy(out, in, static_cast<size_t>(piece));
    }
    in += piece;
    out += piece;
    len -= static_cast<size_t>(piece);
  }
}

void SessionCipher::EndSeal(uint8_t tag[kSealTagBytes]) {
  int written = 0;
  uint8_t none[16];
  EVP_CipherFinal_ex(ctx_->evp, none, &written);
  EVP_CIPHER_CTX_ctrl(ctx_->evp, EVP_CTRL_GCM_GET_TAG, kSealTagBytes, tag);
}

bool SessionCipher::EndOpen(const uint8_t tag[kSealTagBytes]) {
  EVP_CIPHER_CTX_ctrl(ctx_->evp, EVP_CTRL_GCM_SET_TAG, kSealTagBytes, const_cast<uint8_t*>(tag));
  int written = 0;
  uint8_t none[16];
  return EVP_CipherFinal_ex(ctx_->evp, none, &written) == 1;
}

}  // namespace tessera::transport::tcp
