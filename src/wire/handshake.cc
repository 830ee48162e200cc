#include "wire/handshake.h"

#include <algorithm>
#include <utility>

namespace tessera::wire {
namespace {

// Labels keep a client's proof from ever passing as a server's, and proofs
// of earlier protocol versions from passing as these.
constexpr std::string_view kClientLabel = "tessera-v4-client";
constexpr std::string_view kServerLabel = "tessera-v4-server";
constexpr std::string_view kSessionLabel = "tessera-v4-session";

// What both proofs bind: every field of the hello, and which task answered.
std::string Transcript(const Hello& hello, uint32_t shard_index) {
  MessageBytes bytes;
  MessageWriter w(&bytes);
  hello.EncodeBody(w);
  w.Put(shard_index);
  return std::string(bytes.begin(), bytes.end());
}

// What the server's proof and the session's keys bind besides: its decision.
std::string ServerTranscript(const Hello& hello, uint32_t shard_index,
                             SessionProtection protection) {
  return Transcript(hello, shard_index) + static_cast<char>(protection);
}

// HKDF's pattern over HMAC-SHA256: a key for the session from the secret
// and the handshake, then a key and an IV for each direction from it.
SessionKeys DeriveKeys(const std::string& secret, const Nonce& client_nonce,
                       const Nonce& server_nonce, SessionProtection protection,
                       const std::string& transcript, bool server) {
  const Proof session = MakeProof(secret, kSessionLabel, client_nonce, server_nonce, transcript);
  const std::string session_key(session.begin(), session.end());
  auto half = [&](std::string_view direction) {
    SessionKeys::Half h;
    const Proof key = MakeProof(session_key, direction, client_nonce, server_nonce, "key");
    const Proof iv = MakeProof(session_key, direction, client_nonce, server_nonce, "iv");
    std::copy(key.begin(), key.begin() + h.key.size(), h.key.begin());
    std::copy(iv.begin(), iv.begin() + h.iv.size(), h.iv.begin());
    return h;
  };
  SessionKeys keys;
  keys.send = half(server ? "server-to-client" : "client-to-server");
  keys.receive = half(server ? "client-to-server" : "server-to-client");
  keys.encrypt = protection == SessionProtection::kOn;
  return keys;
}

}  // namespace

ClientHandshake::ClientHandshake(std::string secret, Hello hello)
    : secret_(hello.role == PeerRole::kReader ? ReaderKey(secret) : std::move(secret)),
      hello_(std::move(hello)) {
  hello_.client_nonce = RandomNonce();
}

Auth ClientHandshake::Answer(const Challenge& challenge) {
  challenge_ = challenge;
  answered_ = true;
  Auth auth;
  auth.client_proof = MakeProof(secret_, kClientLabel, challenge.server_nonce, hello_.client_nonce,
                                Transcript(hello_, challenge.shard_index));
  return auth;
}

Status ClientHandshake::CheckWelcome(const Welcome& welcome, uint32_t expect_shard_index,
                                     std::string_view server_name) {
  if (!answered_) return Status::Internal("welcome before the challenge was answered");
  const Proof expect =
      MakeProof(secret_, kServerLabel, hello_.client_nonce, challenge_.server_nonce,
                ServerTranscript(hello_, challenge_.shard_index, welcome.protection));
  if (!ProofsEqual(expect, welcome.server_proof)) {
    return Status::PermissionDenied(std::string(server_name) +
                                    " could not prove it knows the cluster secret "
                                    "(is it started with the same secret?)");
  }
  if (challenge_.shard_index != expect_shard_index) {
    auto name = [](uint32_t index) {
      return index == kCoordinatorIndex ? std::string("the coordinator")
                                        : "ps task " + std::to_string(index);
    };
    return Status::FailedPrecondition(std::string(server_name) + " is " +
                                      name(challenge_.shard_index) + ", but this task's cluster " +
                                      "spec has it as " + name(expect_shard_index) +
                                      ": give every task the same cluster spec");
  }
  const SessionProtection asked = hello_.protection;
  if ((asked == SessionProtection::kOn && welcome.protection != SessionProtection::kOn) ||
      (asked == SessionProtection::kIntegrity && !welcome.session_protected())) {
    return Status::FailedPrecondition(
        std::string(server_name) + " does not " +
        (asked == SessionProtection::kOn ? "encrypt" : "protect") +
        " the session, which this task asks for (session protection " +
        SessionProtectionName(asked) + "): start it with --transport tcp");
  }
  protection_ = welcome.protection;
  return Status::Ok();
}

SessionKeys ClientHandshake::Keys() const {
  return DeriveKeys(secret_, hello_.client_nonce, challenge_.server_nonce, protection_,
                    ServerTranscript(hello_, challenge_.shard_index, protection_),
                    /*server=*/false);
}

Result<std::variant<Auth, Welcome>> ClientHandshake::OnFrame(
    std::span<const uint8_t> frame, std::optional<uint32_t> expect_shard_index,
    std::string_view server_name) {
  auto h = DecodeHeader(frame);
  if (!h.ok()) return h.status().WithContext(std::string(server_name));
  if (h->opcode == Opcode::kError) {
    auto err = DecodeBody<Error>(*h, frame);
    if (!err.ok()) return err.status().WithContext(std::string(server_name));
    return Status(err->code, err->message);
  }
  if (h->opcode == Opcode::kChallenge && !answered_) {
    auto challenge = DecodeBody<Challenge>(*h, frame);
    if (!challenge.ok()) return challenge.status().WithContext(std::string(server_name));
    return std::variant<Auth, Welcome>(Answer(*challenge));
  }
  if (h->opcode == Opcode::kWelcome && answered_) {
    auto welcome = DecodeBody<Welcome>(*h, frame);
    if (!welcome.ok()) return welcome.status().WithContext(std::string(server_name));
    TESSERA_RETURN_IF_ERROR(
        CheckWelcome(*welcome, expect_shard_index.value_or(challenge_.shard_index), server_name));
    return std::variant<Auth, Welcome>(std::move(*welcome));
  }
  return Status::InvalidArgument(
      std::string(server_name) + " sent " + OpcodeName(h->opcode) + " during the handshake" +
      (answered_ ? ", where a welcome was due" : ", before a challenge"));
}

Challenge ServerHandshake::OnHello(Hello hello, uint32_t shard_index) {
  hello_ = std::move(hello);
  challenge_.server_nonce = RandomNonce();
  challenge_.shard_index = shard_index;
  said_hello_ = true;
  return challenge_;
}

Status ServerHandshake::CheckAuth(const Auth& auth, std::string_view peer_address) const {
  const Proof expect = MakeProof(Key(), kClientLabel, challenge_.server_nonce, hello_.client_nonce,
                                 Transcript(hello_, challenge_.shard_index));
  if (!said_hello_ || !ProofsEqual(expect, auth.client_proof)) {
    return Status::PermissionDenied(hello_.task + " at " + std::string(peer_address) +
                                    (hello_.role == PeerRole::kReader
                                         ? " does not know the cluster's reader key"
                                         : " does not know the cluster secret"));
  }
  return Status::Ok();
}

SessionProtection ServerHandshake::DecideProtection(SessionProtection here, bool can_protect,
                                                    bool loopback) {
  using P = SessionProtection;
  auto asked = [&](P p) { return here == p || hello_.protection == p; };
  if (!can_protect) {
    protection_ = P::kOff;
  } else if (asked(P::kOn)) {
    protection_ = P::kOn;
  } else if (asked(P::kIntegrity)) {
    protection_ = P::kIntegrity;
  } else if (asked(P::kOff)) {
    protection_ = P::kOff;
  } else {
    protection_ = loopback ? P::kOff : P::kOn;
  }
  return protection_;
}

Proof ServerHandshake::ServerProof() const {
  return MakeProof(Key(), kServerLabel, hello_.client_nonce, challenge_.server_nonce,
                   ServerTranscript(hello_, challenge_.shard_index, protection_));
}

SessionKeys ServerHandshake::Keys() const {
  return DeriveKeys(Key(), hello_.client_nonce, challenge_.server_nonce, protection_,
                    ServerTranscript(hello_, challenge_.shard_index, protection_),
                    /*server=*/true);
}

}  // namespace tessera::wire
