#include "wire/handshake.h"

#include <utility>

namespace tessera::wire {
namespace {

// Labels keep a client's proof from ever passing as a server's, and proofs
// of earlier protocol versions from passing as these.
constexpr std::string_view kClientLabel = "tessera-v3-client";
constexpr std::string_view kServerLabel = "tessera-v3-server";

// What both proofs bind: every field of the hello, and which task answered.
std::string Transcript(const Hello& hello, uint32_t shard_index) {
  MessageBytes bytes;
  MessageWriter w(&bytes);
  hello.EncodeBody(w);
  w.Put(shard_index);
  return std::string(bytes.begin(), bytes.end());
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
                                     std::string_view server_name) const {
  if (!answered_) return Status::Internal("welcome before the challenge was answered");
  const Proof expect =
      MakeProof(secret_, kServerLabel, hello_.client_nonce, challenge_.server_nonce,
                Transcript(hello_, challenge_.shard_index));
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
  return Status::Ok();
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

Proof ServerHandshake::ServerProof() const {
  return MakeProof(Key(), kServerLabel, hello_.client_nonce, challenge_.server_nonce,
                   Transcript(hello_, challenge_.shard_index));
}

}  // namespace tessera::wire
