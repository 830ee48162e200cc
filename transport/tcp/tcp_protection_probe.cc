// `tessera doctor`'s view of session protection: the rule this environment
// gives Tessera's tcp (TESSERA_SESSION_PROTECTION), and how fast this host
// seals, which is what protection costs a large transfer.
#include <openssl/opensslv.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tessera/cluster.h"
#include "transport/probe.h"
#include "transport/tcp/tcp_session_cipher.h"

namespace tessera::transport {
namespace {

struct SealSpeed {
  double gbps = 0;
  std::string library;
};

// Seals 64 MiB in 1 MiB records, as a protected session's large payloads go.
SealSpeed MeasureSealing() {
  SessionKeys::Half keys;
  keys.key.fill(1);
  auto cipher =
      tcp::SessionCipher::Create(keys, {.direction = tcp::SessionCipher::Direction::kSeal});
  if (!cipher.ok()) return {0, cipher.status().message()};
  constexpr size_t kRecord = 1 << 20;
  constexpr int kRecords = 64;
  std::vector<uint8_t> in(kRecord, 0x5a), out(kRecord + tcp::kSealTagBytes);
  (*cipher)->Seal(in.data(), kRecord, out.data());  // warm
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kRecords; ++i) (*cipher)->Seal(in.data(), kRecord, out.data());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return {s > 0 ? kRecords * static_cast<double>(kRecord) / s / 1e9 : 0, (*cipher)->library_name()};
}

}  // namespace

ProbeFinding ProbeSessionProtection() {
  ProbeFinding f{"session-protection", "ok", "", ""};
  const char* env = std::getenv("TESSERA_SESSION_PROTECTION");
  const std::string setting = env != nullptr && *env ? env : "auto";
  auto protection = ParseSessionProtection(setting);
  if (!protection.ok()) {
    f.level = "problem";
    f.detail = "TESSERA_SESSION_PROTECTION: " + protection.status().message();
    f.fix = "set it to auto, on, integrity or off, or unset it";
    return f;
  }
  const SealSpeed sealing = MeasureSealing();
  char speed[64];
  std::snprintf(speed, sizeof(speed), "%.1f", sealing.gbps);
  f.data = {{"setting", setting},
            {"from_environment", env != nullptr && *env},
            {"cipher", "AES-256-GCM"},
            {"cipher_library", sealing.library},
            {"openssl", OPENSSL_VERSION_TEXT},
            {"seal_gbps_one_core", sealing.gbps}};
  switch (*protection) {
    case SessionProtection::kOn:
      f.detail = "every tcp session is authenticated and encrypted after its handshake";
      break;
    case SessionProtection::kIntegrity:
      f.detail =
          "every tcp session is authenticated after its handshake, not encrypted: "
          "nobody on the path can alter it unnoticed, anyone there can read it";
      break;
    case SessionProtection::kOff:
      f.level = "warn";
      f.detail =
          "tcp sessions are not protected unless the other side asks: anyone on the "
          "path can read and alter them";
      f.fix = "unset TESSERA_SESSION_PROTECTION unless the network is trusted";
      break;
    default:
      f.detail =
          "tcp sessions that leave the host are authenticated and encrypted after their "
          "handshake; loopback ones are not";
  }
  f.detail += " (AES-256-GCM by " + sealing.library + "; this host seals " + std::string(speed) +
              " GB/s on one core, which bounds a protected session's bandwidth; UCX and verbs "
              "sessions are never protected: docs/security.md)";
  return f;
}

}  // namespace tessera::transport
