// The rendezvous's two messages and their proofs (rendezvous.h):
//
//   join:    Nc (16 bytes) | length (4, little-endian) | JSON | HMAC(secret, kJoinLabel | Ns | Nc |
//   JSON) answer:  length (4) | JSON | HMAC(secret, kAnswerLabel | Nc | Ns | JSON)
//
// The JSON is the Join, or the Assignment (or an error) as text; nothing of
// it is parsed before its proof checked out.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/secret.h"
#include "rendezvous/rendezvous.h"

namespace tessera::rendezvous {

constexpr std::string_view kJoinLabel = "tessera-rendezvous-v1-join";
constexpr std::string_view kAnswerLabel = "tessera-rendezvous-v1-answer";
constexpr size_t kNonceBytes = sizeof(Nonce);
constexpr size_t kProofBytes = sizeof(Proof);

std::vector<uint8_t> EncodeJoin(const Join& join, const std::string& secret,
                                const Nonce& server_nonce, const Nonce& client_nonce);
// A join frame at the start of `bytes`: nullopt while it is incomplete; an
// error if it is too long, or its proof or fields are wrong.
Result<std::optional<Join>> DecodeJoin(std::span<const uint8_t> bytes, const std::string& secret,
                                       const Nonce& server_nonce, Nonce* client_nonce);

// An answer: the assignment, or the error every joined rank is told.
std::vector<uint8_t> EncodeAnswer(const Result<Assignment>& answer, const std::string& secret,
                                  const Nonce& client_nonce, const Nonce& server_nonce);
// Checks the proof, then reads the answer (its error, when rank 0 sent one).
Result<Assignment> DecodeAnswer(std::span<const uint8_t> json, std::span<const uint8_t> proof,
                                const std::string& secret, const Nonce& client_nonce,
                                const Nonce& server_nonce);

}  // namespace tessera::rendezvous
