// The key a checkpoint's manifest is authenticated with (an HMAC beside it,
// tessera.json.hmac). The manifest records every file's size and SHA-256, so
// the HMAC covers all that restore reads: whoever can write the checkpoint
// directory but lacks the key cannot make an edited checkpoint pass.
//
// By default the key is derived one way from the cluster secret. A key that
// must outlive the secret (rotated; `tessera launch` makes one per run)
// comes from TESSERA_CHECKPOINT_KEY_FILE instead: any file of at least 16
// bytes, the same for every ps task of the run.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "tessera/status.h"

namespace tessera::ckpt {

using CheckpointKey = std::array<uint8_t, 32>;

// HMAC-SHA256 of `material` (a secret, or a key file's bytes) under a label.
CheckpointKey DeriveCheckpointKey(std::string_view material);
// TESSERA_CHECKPOINT_KEY_FILE's key where it is set (an error naming the
// file when it cannot be read or is shorter than 16 bytes), else the
// secret's.
Result<CheckpointKey> CheckpointKeyFor(const std::string& secret);
// HMAC-SHA256 of a manifest's text under `key`, hex.
std::string ManifestHmac(const CheckpointKey& key, std::string_view manifest_text);
// Equal in constant time (both hex of the same length, or not equal).
bool HmacsEqual(std::string_view a, std::string_view b);

}  // namespace tessera::ckpt
