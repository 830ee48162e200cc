// The keys that protect a session after its handshake (the handshake derives
// them, wire/handshake.h; a transport uses them, Endpoint::ProtectSession):
// one half for what this side sends, one for what it receives; the peer
// holds the same two, swapped.
#pragma once

#include <array>
#include <cstdint>

namespace tessera {

struct SessionKeys {
  struct Half {
    std::array<uint8_t, 32> key{};
    std::array<uint8_t, 12> iv{};
  };
  Half send, receive;
  // false: frames are authenticated, not encrypted (SessionProtection::kIntegrity).
  bool encrypt = true;
};

}  // namespace tessera
