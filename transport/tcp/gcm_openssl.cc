// GcmEngine over OpenSSL's EVP interface: runs on every CPU.
#include <openssl/evp.h>
#include <openssl/opensslv.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include "transport/tcp/gcm_engine.h"

namespace tessera::transport::tcp {
namespace {

class OpenSslGcm final : public GcmEngine {
 public:
  OpenSslGcm(EVP_CIPHER_CTX* evp, const GcmOptions& options) : evp_(evp), options_(options) {}
  ~OpenSslGcm() override { EVP_CIPHER_CTX_free(evp_); }
  OpenSslGcm(const OpenSslGcm&) = delete;
  OpenSslGcm& operator=(const OpenSslGcm&) = delete;

  void Start(const std::array<uint8_t, 12>& iv) override {
    // The key stays; only the nonce is new (GCM's default 12-byte IV).
    EVP_CipherInit_ex(evp_, nullptr, nullptr, nullptr, iv.data(), options_.seal ? 1 : 0);
  }

  void Update(const uint8_t* in, uint8_t* out, size_t len) override {
    while (len > 0) {
      const int piece = static_cast<int>(std::min<size_t>(len, INT_MAX / 2));
      int written = 0;
      if (options_.encrypt) {
        EVP_CipherUpdate(evp_, out, &written, in, piece);
      } else {
        EVP_CipherUpdate(evp_, nullptr, &written, in, piece);
        if (out != in) std::memcpy(out, in, static_cast<size_t>(piece));
      }
      in += piece;
      out += piece;
      len -= static_cast<size_t>(piece);
    }
  }

  void EndSeal(uint8_t tag[kGcmTagBytes]) override {
    int written = 0;
    uint8_t none[16];
    EVP_CipherFinal_ex(evp_, none, &written);
    EVP_CIPHER_CTX_ctrl(evp_, EVP_CTRL_GCM_GET_TAG, kGcmTagBytes, tag);
  }

  bool EndOpen(const uint8_t tag[kGcmTagBytes]) override {
    EVP_CIPHER_CTX_ctrl(evp_, EVP_CTRL_GCM_SET_TAG, kGcmTagBytes, const_cast<uint8_t*>(tag));
    int written = 0;
    uint8_t none[16];
    return EVP_CipherFinal_ex(evp_, none, &written) == 1;
  }

  std::string library_name() const override { return OPENSSL_VERSION_TEXT; }

 private:
  EVP_CIPHER_CTX* evp_;
  GcmOptions options_;
};

}  // namespace

Result<std::unique_ptr<GcmEngine>> CreateOpenSslGcm(const std::array<uint8_t, 32>& key,
                                                    const GcmOptions& options) {
  EVP_CIPHER_CTX* evp = EVP_CIPHER_CTX_new();
  if (evp == nullptr || EVP_CipherInit_ex(evp, EVP_aes_256_gcm(), nullptr, key.data(), nullptr,
                                          options.seal ? 1 : 0) != 1) {
    EVP_CIPHER_CTX_free(evp);
    return Status::Internal("OpenSSL could not set up AES-256-GCM for the session");
  }
  return std::unique_ptr<GcmEngine>(new OpenSslGcm(evp, options));
}

}  // namespace tessera::transport::tcp
