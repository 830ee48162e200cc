// Every rank's side of the rendezvous: join, then wait for the answer.
#include "rendezvous/frames.h"
#include "rendezvous/rendezvous.h"
#include "rendezvous/socket_io.h"

namespace tessera::rendezvous {

Result<Assignment> JoinRendezvous(const std::string& host, uint16_t port, const std::string& secret,
                                  const Join& join, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  const std::string where = "the rendezvous at " + host + ":" + std::to_string(port);
  auto s = ConnectBefore(host, port, deadline);
  if (!s.ok()) return s.status();
  Nonce server_nonce{};
  TESSERA_RETURN_IF_ERROR(
      ReadExactBefore(*s, server_nonce.data(), server_nonce.size(), deadline).WithContext(where));
  const Nonce client_nonce = RandomNonce();
  TESSERA_RETURN_IF_ERROR(
      WriteAllBefore(*s, EncodeJoin(join, secret, server_nonce, client_nonce), deadline)
          .WithContext(where));
  // Rank 0 answers once every rank joined: that is what this waits for.
  uint8_t length_bytes[4];
  Status st = ReadExactBefore(*s, length_bytes, 4, deadline);
  if (!st.ok()) {
    return Status(st.code(), where + ": no answer within " +
                                 std::to_string(timeout.count() / 1000) + " s (" + st.message() +
                                 "; did every rank start, and rank 0 live?)");
  }
  const uint32_t length =
      static_cast<uint32_t>(length_bytes[0]) | static_cast<uint32_t>(length_bytes[1]) << 8 |
      static_cast<uint32_t>(length_bytes[2]) << 16 | static_cast<uint32_t>(length_bytes[3]) << 24;
  if (length > kMaxAnswerBytes) {
    return Status::InvalidArgument(where + " announced an answer of " + std::to_string(length) +
                                   " bytes");
  }
  std::vector<uint8_t> body(length + kProofBytes);
  TESSERA_RETURN_IF_ERROR(
      ReadExactBefore(*s, body.data(), body.size(), deadline).WithContext(where));
  return DecodeAnswer(std::span<const uint8_t>(body).first(length),
                      std::span<const uint8_t>(body).subspan(length), secret, client_nonce,
                      server_nonce);
}

}  // namespace tessera::rendezvous
