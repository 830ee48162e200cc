// The one handshake every connection to a ps or coordinator task makes, from
// a worker, from a ps task joining the coordinator, or from `tessera status`:
//
//   client -> Hello     who it is, which cluster it was given, a fresh nonce
//   server -> Challenge a fresh nonce and which task it is; no proof yet
//   client -> Auth      HMAC(secret, both nonces, the hello, the task index)
//   server -> Welcome   its own HMAC, sent only after the client's checked out
//
// The client proves first, so that a stranger who connects learns nothing it
// could test guesses of the secret against offline (docs/security.md). Both
// proofs cover the whole hello, so no field of it can be swapped in transit,
// and the server's covers its decision to protect the session, so nobody
// on the path can switch protection off. Where it is on, both sides derive
// the session's keys from the secret, both nonces and that transcript:
// every frame after the auth (from the client) and after the welcome (from
// the server) is sealed with them.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>

#include "core/secret.h"
#include "core/session_keys.h"
#include "tessera/status.h"
#include "wire/messages.h"

namespace tessera::wire {

// The client's half: build the hello, answer the challenge, check the welcome.
class ClientHandshake {
 public:
  // Fills in hello.client_nonce. `secret`: the cluster secret, or for a
  // reader's hello the reader key (or the secret, from which it is derived).
  ClientHandshake(std::string secret, Hello hello);

  const Hello& hello() const { return hello_; }
  // The proof for this challenge.
  Auth Answer(const Challenge& challenge);
  // OK when the server proved it knows the secret and is the task
  // `expect_shard_index` (kCoordinatorIndex for a coordinator of its own);
  // `server_name` ("/job:ps/task:1 at h:p") names it in errors.
  // A client refuses a welcome that protects the session less than it
  // asked (kOn: encrypted; kIntegrity: at least authenticated).
  Status CheckWelcome(const Welcome& welcome, uint32_t expect_shard_index,
                      std::string_view server_name);
  // The session's keys, once CheckWelcome passed a welcome that protects it.
  SessionKeys Keys() const;

  // The one way every client reads the server's side of the handshake: a
  // challenge yields the Auth to send back; a welcome, once CheckWelcome
  // passed, the Welcome (done). An error frame becomes its status; anything
  // else, or out of turn, is refused, naming it. `expect_shard_index`: none
  // takes whichever task the challenge names (`tessera status`).
  Result<std::variant<Auth, Welcome>> OnFrame(std::span<const uint8_t> frame,
                                              std::optional<uint32_t> expect_shard_index,
                                              std::string_view server_name);

 private:
  std::string secret_;
  Hello hello_;
  Challenge challenge_;
  bool answered_ = false;
  SessionProtection protection_ = SessionProtection::kOff;  // the welcome's decision
};

// The server's half, one per connection. A reader's hello is proved with
// the reader key (ReaderKey of the secret), every other with the secret.
class ServerHandshake {
 public:
  ServerHandshake(std::string secret, std::string reader_key)
      : secret_(std::move(secret)), reader_key_(std::move(reader_key)) {}
  explicit ServerHandshake(const std::string& secret)
      : ServerHandshake(secret, ReaderKey(secret)) {}

  // Records the hello and returns the challenge to send.
  Challenge OnHello(Hello hello, uint32_t shard_index);
  // Checks the client's proof in constant time.
  Status CheckAuth(const Auth& auth, std::string_view peer_address) const;
  // How the session will be protected (kOff: not, kOn: encrypted,
  // kIntegrity), from what this server asks (`here`), what the hello asks,
  // whether the transport can, and whether the peer is on this host
  // (loopback); kept for the proof and the keys.
  SessionProtection DecideProtection(SessionProtection here, bool can_protect, bool loopback);
  // This server's proof, for the Welcome; only once CheckAuth passed (and
  // after DecideProtection, whose decision it covers).
  Proof ServerProof() const;
  // The session's keys, where DecideProtection said to protect it.
  SessionKeys Keys() const;

  bool said_hello() const { return said_hello_; }
  const Hello& hello() const { return hello_; }

 private:
  // The key the hello's role proves itself with.
  const std::string& Key() const {
    return hello_.role == PeerRole::kReader ? reader_key_ : secret_;
  }

  std::string secret_;
  std::string reader_key_;
  Hello hello_;
  Challenge challenge_;
  bool said_hello_ = false;
  SessionProtection protection_ = SessionProtection::kOff;
};

}  // namespace tessera::wire
