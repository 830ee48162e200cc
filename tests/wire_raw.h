// A frame with a hand-made body, for fields and counts no encoder writes:
// what the wire tests decode to check a decoder's refusals.
#pragma once

#include <functional>

#include "wire/messages.h"

namespace tessera::wire::test {

template <typename Msg>
Status DecodeRaw(const std::function<void(MessageWriter&)>& body) {
  MessageBytes f;
  Header h;
  h.opcode = Msg::kOpcode;
  EncodeHeader(h, &f);
  MessageWriter w(&f);
  body(w);
  w.PatchU32(12, static_cast<uint32_t>(f.size() - kHeaderSize));
  return Decode<Msg>(f).status();
}

}  // namespace tessera::wire::test
