#include "ckpt/checkpoint_key.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cstdlib>

#include "ckpt/safetensors.h"
#include "core/bounded_file.h"
#include "core/secret.h"

namespace tessera::ckpt {
namespace {

constexpr std::string_view kLabel = "tessera checkpoint key v1";
constexpr size_t kMinKeyFileBytes = 16;

}  // namespace

CheckpointKey DeriveCheckpointKey(std::string_view material) {
  CheckpointKey key{};
  unsigned int len = 0;
  HMAC(EVP_sha256(), material.data(), static_cast<int>(material.size()),
       reinterpret_cast<const uint8_t*>(kLabel.data()), kLabel.size(), key.data(), &len);
  return key;
}

Result<CheckpointKey> CheckpointKeyFor(const std::string& secret) {
  const char* path = std::getenv("TESSERA_CHECKPOINT_KEY_FILE");
  if (path == nullptr || *path == 0) return DeriveCheckpointKey(secret);
  auto bytes = ReadBoundedFile(path, kMaxSecretFileBytes, "the checkpoint key file");
  if (!bytes.ok()) return bytes.status().WithContext("TESSERA_CHECKPOINT_KEY_FILE");
  if (bytes->size() < kMinKeyFileBytes) {
    return Status::InvalidArgument("the checkpoint key file " + std::string(path) + " has " +
                                   std::to_string(bytes->size()) + " bytes; at least " +
                                   std::to_string(kMinKeyFileBytes) + " are needed");
  }
  return DeriveCheckpointKey(*bytes);
}

std::string ManifestHmac(const CheckpointKey& key, std::string_view manifest_text) {
  uint8_t mac[32];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const uint8_t*>(manifest_text.data()), manifest_text.size(), mac, &len);
  return ToHex(std::span<const uint8_t>(mac, len));
}

bool HmacsEqual(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace tessera::ckpt
