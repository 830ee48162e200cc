#include "transport/tcp/tcp_frame.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <string>

#include "core/bytes.h"

namespace tessera::transport::tcp {
namespace {

// Frames are encoded on every send: no allocation, fixed offsets.
template <typename T>
void Store(uint8_t* at, T value) {
  static_assert(std::endian::native == std::endian::little, "tcp frames are little-endian");
  std::memcpy(at, &value, sizeof(T));
}

}  // namespace

void EncodeFrameHeader(const FrameHeader& h, std::span<uint8_t, kFrameHeaderBytes> out) {
  uint8_t* p = out.data();
  p[0] = static_cast<uint8_t>(h.type);
  p[1] = 0;
  Store(p + 2, h.msg_id);
  Store(p + 4, h.region);
  Store(p + 8, h.op);
  Store(p + 16, h.addr);
  Store(p + 24, h.length);
  std::memcpy(p + 32, h.key.data(), h.key.size());
}

Result<FrameHeader> DecodeFrameHeader(std::span<const uint8_t, kFrameHeaderBytes> in) {
  ByteReader r(in);
  FrameHeader h;
  uint8_t type = 0, reserved = 0;
  std::span<const uint8_t> key;
  // A fixed-size span: every read succeeds.
  (void)(r.Get(&type) && r.Get(&reserved) && r.Get(&h.msg_id) && r.Get(&h.region) && r.Get(&h.op) &&
         r.Get(&h.addr) && r.Get(&h.length) && r.GetBytes(h.key.size(), &key));
  if (type < static_cast<uint8_t>(FrameType::kMessage) ||
      type > static_cast<uint8_t>(FrameType::kGetData)) {
    return Status::InvalidArgument("unknown tcp frame type " + std::to_string(type));
  }
  if (reserved != 0) return Status::InvalidArgument("tcp frame with a reserved byte set");
  h.type = static_cast<FrameType>(type);
  std::copy(key.begin(), key.end(), h.key.begin());
  return h;
}

}  // namespace tessera::transport::tcp
