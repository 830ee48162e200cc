#include "core/secret.h"

#include <openssl/crypto.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstdio>
#include <cstdlib>
#include <span>
#include <vector>

#include "core/bounded_file.h"

namespace tessera {
namespace {

std::string Hex(std::span<const uint8_t> bytes) {
  static const char* kHex = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (uint8_t b : bytes) {
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

}  // namespace

Result<std::string> LoadSecret(const std::string& file_path) {
  std::string path = file_path;
  if (path.empty()) {
    if (const char* s = std::getenv("TESSERA_SECRET"); s && *s) return std::string(s);
    if (const char* f = std::getenv("TESSERA_SECRET_FILE"); f && *f) path = f;
  }
  if (path.empty()) {
    return Status::NotFound(
        "no cluster secret: set TESSERA_SECRET or TESSERA_SECRET_FILE (tessera launch makes one)");
  }
  // A secret is tens of bytes (`tessera secret` writes 64); the bound keeps
  // a file that is something else (TESSERA_SECRET_FILE=/dev/zero) out.
  auto read = ReadBoundedFile(path, kMaxSecretFileBytes, "the cluster secret file");
  if (!read.ok()) return read.status();
  std::string secret = std::move(*read);
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
  if (secret.empty()) return Status::InvalidArgument("cluster secret file '" + path + "' is empty");
  return secret;
}

Status CheckSecretStrength(const std::string& secret, bool allow_weak) {
  if (secret.empty()) return Status::InvalidArgument("the cluster secret is empty");
  if (secret.size() >= kMinSecretBytes) return Status::Ok();
  const char* env = std::getenv("TESSERA_ALLOW_WEAK_SECRET");
  if (allow_weak || (env != nullptr && std::string(env) == "1")) return Status::Ok();
  return Status::InvalidArgument(
      "the cluster secret has " + std::to_string(secret.size()) + " bytes; at least " +
      std::to_string(kMinSecretBytes) +
      " are needed so that it cannot be guessed (`tessera secret` makes one). "
      "TESSERA_ALLOW_WEAK_SECRET=1 allows a shorter one");
}

Nonce RandomNonce() {
  Nonce n{};
  if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1) {
    std::fprintf(stderr, "tessera: RAND_bytes failed: no entropy for a nonce\n");
    std::abort();
  }
  return n;
}

Result<std::string> GenerateSecret() {
  std::array<uint8_t, 32> raw{};
  if (RAND_bytes(raw.data(), static_cast<int>(raw.size())) != 1) {
    return Status::Unavailable("RAND_bytes failed: no entropy for a secret");
  }
  return Hex(raw);
}

std::string ReaderKey(const std::string& secret) {
  if (IsReaderKey(secret)) return secret;  // already one: a reader's own key
  constexpr std::string_view kLabel = "tessera reader key v1";
  std::array<uint8_t, 32> mac{};
  unsigned int len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const uint8_t*>(kLabel.data()), kLabel.size(), mac.data(), &len);
  return std::string(kReaderKeyPrefix) + Hex(mac);
}

bool IsReaderKey(std::string_view secret) { return secret.starts_with(kReaderKeyPrefix); }

Proof MakeProof(const std::string& secret, std::string_view label, const Nonce& a, const Nonce& b,
                std::string_view context) {
  std::vector<uint8_t> msg(label.begin(), label.end());
  msg.insert(msg.end(), a.begin(), a.end());
  msg.insert(msg.end(), b.begin(), b.end());
  msg.insert(msg.end(), context.begin(), context.end());
  Proof out{};
  unsigned int len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), msg.data(), msg.size(),
       out.data(), &len);
  return out;
}

bool ProofsEqual(const Proof& x, const Proof& y) {
  return CRYPTO_memcmp(x.data(), y.data(), x.size()) == 0;
}

}  // namespace tessera
