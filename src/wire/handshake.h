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
// proofs cover the whole hello, so no field of it can be swapped in transit.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>

#include "core/secret.h"
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
  Status CheckWelcome(const Welcome& welcome, uint32_t expect_shard_index,
                      std::string_view server_name) const;

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
  // This server's proof, for the Welcome; only once CheckAuth passed.
  Proof ServerProof() const;

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
};

}  // namespace tessera::wire
