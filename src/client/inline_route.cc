#include "client/inline_route.h"

#include <cstring>
#include <string>

namespace tessera::client {

Status InlineRoute::Pack(const ChunkIos& ios, wire::Push& msg) {
  uint64_t raw = 0;
  for (const auto& io : ios) raw += io.chunk->bytes;
  msg.entries.resize(ios.size());
  msg.payload.resize(raw);
  uint8_t* const payload = msg.payload.data();
  wire::PushEntry* const entries = msg.entries.data();
  bool from_gpu = false;
  uint64_t at = 0;
  for (size_t i = 0; i < ios.size(); ++i) {
    const ChunkIo& io = ios[i];
    entries[i] = {io.chunk->key_id, at, io.chunk->bytes};
    uint8_t* into = payload + at;
    at += io.chunk->bytes;
    if (!io.on_gpu) {
      std::memcpy(into, io.local, io.chunk->bytes);
    } else {
      if (Status st = gpu_.CopyAsync(into, io.local, io.chunk->bytes); !st.ok()) {
        return st.WithContext("push from GPU memory");
      }
      counts_.gpu_inline_bytes += io.chunk->bytes;
      from_gpu = true;
    }
  }
  return from_gpu ? gpu_.Wait().WithContext("push from GPU memory") : Status::Ok();
}

Status InlineRoute::Unpack(const ChunkIos& ios, std::span<const uint8_t> data) {
  uint64_t total = 0;
  for (const auto& io : ios) total += io.chunk->bytes;
  if (total != data.size()) {
    return Status::Internal("inline pull reply of " + std::to_string(data.size()) + " bytes for " +
                            std::to_string(total));
  }
  const uint8_t* src = data.data();
  bool to_gpu = false;
  for (const auto& io : ios) {
    if (!io.on_gpu) {
      std::memcpy(io.local, src, io.chunk->bytes);
    } else {
      if (Status st = gpu_.CopyAsync(io.local, src, io.chunk->bytes); !st.ok()) {
        return st.WithContext("pull into GPU memory");
      }
      counts_.gpu_inline_bytes += io.chunk->bytes;
      to_gpu = true;
    }
    src += io.chunk->bytes;
  }
  // The reply's bytes must stay until the copies are done.
  return to_gpu ? gpu_.Wait().WithContext("pull into GPU memory") : Status::Ok();
}

}  // namespace tessera::client
