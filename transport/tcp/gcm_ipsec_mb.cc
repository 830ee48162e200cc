// GcmEngine over Intel's IPsec-MB (x86-64 with AES-NI): its direct GCM and
// GMAC functions, chosen once for this CPU (SSE, AVX2 or VAES/AVX-512).
#include "tessera_config.h"
#include "transport/tcp/gcm_engine.h"

#if TESSERA_HAVE_IPSEC_MB
#include <intel-ipsec-mb.h>
#include <openssl/crypto.h>

#include <cstring>
#include <new>
#endif

namespace tessera::transport::tcp {

#if TESSERA_HAVE_IPSEC_MB
namespace {

// One manager for the process: the direct API only reads its table of
// functions, so every session's engine may share it from any thread.
IMB_MGR* SharedManager() {
  static IMB_MGR* const manager = []() -> IMB_MGR* {
    IMB_MGR* m = alloc_mb_mgr(0);
    if (m == nullptr) return nullptr;
    init_mb_mgr_auto(m, nullptr);
    constexpr uint64_t kNeeded = IMB_FEATURE_AESNI | IMB_FEATURE_PCLMULQDQ;
    if (imb_get_errno(m) != 0 || (m->features & kNeeded) != kNeeded) {
      free_mb_mgr(m);
      return nullptr;
    }
    return m;
  }();
  return manager;
}

const char* ArchName(const IMB_MGR* m) {
  if ((m->features & IMB_FEATURE_VAES) != 0 && (m->features & IMB_FEATURE_VPCLMULQDQ) != 0) {
    return "VAES/AVX-512";
  }
  if ((m->features & IMB_FEATURE_AVX2) != 0) return "AVX2";
  return "SSE";
}

class IpsecMbGcm final : public GcmEngine {
 public:
  IpsecMbGcm(IMB_MGR* manager, const std::array<uint8_t, 32>& key, const GcmOptions& options)
      : manager_(manager), options_(options) {
    IMB_AES256_GCM_PRE(manager_, key.data(), &key_);
  }
  ~IpsecMbGcm() override {
    // The expanded key is secret: leave nothing of it in freed memory.
    OPENSSL_cleanse(&key_, sizeof(key_));
  }
  IpsecMbGcm(const IpsecMbGcm&) = delete;
  IpsecMbGcm& operator=(const IpsecMbGcm&) = delete;

  void Start(const std::array<uint8_t, 12>& iv) override {
    if (options_.encrypt) {
      IMB_AES256_GCM_INIT(manager_, &key_, &context_, iv.data(), nullptr, 0);
    } else {
      IMB_AES256_GMAC_INIT(manager_, &key_, &context_, iv.data(), iv.size());
    }
  }

  void Update(const uint8_t* in, uint8_t* out, size_t len) override {
    if (len == 0) return;
    if (!options_.encrypt) {
      IMB_AES256_GMAC_UPDATE(manager_, &key_, &context_, in, len);
      if (out != in) std::memcpy(out, in, len);
    } else if (options_.seal) {
      IMB_AES256_GCM_ENC_UPDATE(manager_, &key_, &context_, out, in, len);
    } else {
      IMB_AES256_GCM_DEC_UPDATE(manager_, &key_, &context_, out, in, len);
    }
  }

  void EndSeal(uint8_t tag[kGcmTagBytes]) override { Finalize(tag); }

  bool EndOpen(const uint8_t tag[kGcmTagBytes]) override {
    uint8_t expected[kGcmTagBytes];
    Finalize(expected);
    // Constant time, as OpenSSL compares its tags.
    uint8_t diff = 0;
    for (size_t i = 0; i < kGcmTagBytes; ++i) diff |= static_cast<uint8_t>(expected[i] ^ tag[i]);
    return diff == 0;
  }

  std::string library_name() const override {
    return std::string("IPsec-MB ") + IMB_VERSION_STR + " (" + ArchName(manager_) + ")";
  }

 private:
  void Finalize(uint8_t tag[kGcmTagBytes]) {
    if (!options_.encrypt) {
      IMB_AES256_GMAC_FINALIZE(manager_, &key_, &context_, tag, kGcmTagBytes);
    } else if (options_.seal) {
      IMB_AES256_GCM_ENC_FINALIZE(manager_, &key_, &context_, tag, kGcmTagBytes);
    } else {
      IMB_AES256_GCM_DEC_FINALIZE(manager_, &key_, &context_, tag, kGcmTagBytes);
    }
  }

  IMB_MGR* manager_;
  GcmOptions options_;
  // IPsec-MB's code loads and stores these aligned; its header does not
  // say so, so the engine does (and is allocated over-aligned).
  alignas(64) gcm_key_data key_;
  alignas(64) gcm_context_data context_;
};

}  // namespace

bool GcmEngine::IpsecMbRunsHere() { return SharedManager() != nullptr; }

Result<std::unique_ptr<GcmEngine>> CreateIpsecMbGcm(const std::array<uint8_t, 32>& key,
                                                    const GcmOptions& options) {
  IMB_MGR* manager = SharedManager();
  if (manager == nullptr) {
    return Status::Unimplemented("IPsec-MB cannot run on this CPU (it needs AES-NI and PCLMULQDQ)");
  }
  return std::unique_ptr<GcmEngine>(new IpsecMbGcm(manager, key, options));
}

#else  // !TESSERA_HAVE_IPSEC_MB

bool GcmEngine::IpsecMbRunsHere() { return false; }

Result<std::unique_ptr<GcmEngine>> CreateIpsecMbGcm(const std::array<uint8_t, 32>&,
                                                    const GcmOptions&) {
  return Status::Unimplemented(
      "this build has no IPsec-MB (libipsec-mb-dev was not found when it was configured)");
}

#endif

}  // namespace tessera::transport::tcp
