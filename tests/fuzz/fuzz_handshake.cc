// The handshake against a peer that controls every byte it sends. The input
// is two frames (a 2-byte length, then the first frame; the rest is the
// second). As a server: a hello, then a proof. As a client: a challenge,
// then a welcome. Without the secret neither side may ever accept, and for
// any hello that decodes, two honest sides with the same secret must agree
// (on the session's protection and its keys too) and with different
// secrets must not.
#include <cstdint>
#include <span>
#include <string>

#include "fuzz_check.h"
#include "wire/handshake.h"

namespace {

using namespace tessera::wire;

constexpr const char* kSecret = "fuzz-secret-0123456789abcdef";
constexpr uint32_t kShardIndex = 1;

void AsServer(std::span<const uint8_t> first, std::span<const uint8_t> second) {
  auto hello = Decode<Hello>(first);
  if (!hello.ok()) return;
  ServerHandshake server(kSecret);
  server.OnHello(*hello, kShardIndex);
  auto auth = Decode<Auth>(second);
  if (auth.ok()) {
    FUZZ_CHECK(!server.CheckAuth(*auth, "fuzzer").ok(), "a forged proof was accepted");
  }

  // Honest sides, with this hello.
  for (const bool same_secret : {true, false}) {
    ClientHandshake client(same_secret ? kSecret : "another-secret-0123456789", *hello);
    ServerHandshake honest(kSecret);
    const Challenge challenge = honest.OnHello(client.hello(), kShardIndex);
    const Auth answer = client.Answer(challenge);
    const bool accepted = honest.CheckAuth(answer, "client").ok();
    FUZZ_CHECK(accepted == same_secret, "honest proofs were judged wrongly");
    if (!accepted) continue;
    // The hello's ask of session protection (any value that decodes) and
    // the server's rule decide it; an honest server's decision satisfies
    // the ask wherever its transport can protect, and both derive one key.
    Welcome welcome;
    welcome.protection = honest.DecideProtection(tessera::SessionProtection::kAuto,
                                                 /*can_protect=*/true, /*loopback=*/false);
    welcome.server_proof = honest.ServerProof();
    FUZZ_CHECK(client.CheckWelcome(welcome, kShardIndex, "server").ok(),
               "an honest server's welcome was refused");
    if (welcome.session_protected()) {
      FUZZ_CHECK(client.Keys().send.key == honest.Keys().receive.key,
                 "the two sides derived different session keys");
    }
    FUZZ_CHECK(!client.CheckWelcome(welcome, kShardIndex + 1, "server").ok(),
               "a welcome from another task was accepted");
  }
}

void AsClient(std::span<const uint8_t> first, std::span<const uint8_t> second) {
  auto challenge = Decode<Challenge>(first);
  if (!challenge.ok()) return;
  Hello hello;
  hello.task = "/job:worker/task:0";
  ClientHandshake client(kSecret, hello);
  client.Answer(*challenge);
  auto welcome = Decode<Welcome>(second);
  if (!welcome.ok()) return;
  FUZZ_CHECK(!client.CheckWelcome(*welcome, challenge->shard_index, "fuzzer").ok(),
             "a forged welcome was accepted");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const size_t first_len = std::min<size_t>(size - 2, data[0] | (size_t{data[1]} << 8));
  const std::span<const uint8_t> first(data + 2, first_len);
  const std::span<const uint8_t> second(data + 2 + first_len, size - 2 - first_len);
  AsServer(first, second);
  AsClient(first, second);
  return 0;
}
