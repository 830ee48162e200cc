// The cluster secret and the proofs peers exchange to show they know it.
// A peer proves knowledge with HMAC-SHA256 over both sides' fresh nonces, so
// a recorded hello cannot be replayed.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>

#include "tessera/status.h"

namespace tessera {

using Nonce = std::array<uint8_t, 16>;
using Proof = std::array<uint8_t, 32>;

// TESSERA_SECRET (the secret itself) or TESSERA_SECRET_FILE (a file holding
// it), in that order; an explicit file path wins over both.
Result<std::string> LoadSecret(const std::string& file_path = "");
// A secret shorter than this could be guessed by whoever may try: refused
// unless the user allows it (allow_weak, or TESSERA_ALLOW_WEAK_SECRET=1).
constexpr size_t kMinSecretBytes = 16;
// A secret file longer than this is refused unread.
constexpr size_t kMaxSecretFileBytes = 4096;
Status CheckSecretStrength(const std::string& secret, bool allow_weak);
// 32 random bytes, hex-encoded; an error only when the system has no
// entropy to give.
Result<std::string> GenerateSecret();
// The reader key of a cluster secret: what read-only clients (evaluators,
// inference readers) authenticate with. It is derived one way from the
// secret (HMAC-SHA256 under a label, hex, after kReaderKeyPrefix), so a
// host given only the reader key can pull weights but can neither pass as
// a worker nor recover the secret; the shards derive it themselves.
constexpr std::string_view kReaderKeyPrefix = "tessera-reader-v1:";
std::string ReaderKey(const std::string& secret);
bool IsReaderKey(std::string_view secret);
// Fresh random bytes. Without entropy the process cannot authenticate
// anyone safely: it aborts, naming the cause (OpenSSL's RAND_bytes does not
// fail on Linux once the kernel's pool is initialised).
Nonce RandomNonce();
// HMAC-SHA256(secret, label || a || b || context).
Proof MakeProof(const std::string& secret, std::string_view label, const Nonce& a, const Nonce& b,
                std::string_view context);
bool ProofsEqual(const Proof& x, const Proof& y);

}  // namespace tessera
