// The inline route, for push and pull alike: a call's chunk bytes travel
// inside its message, side by side in the order of the chunks. Chunks in
// host memory are copied with memcpy; chunks in GPU memory with device
// copies on the client's stream, waited for once per message. Loop thread.
#pragma once

#include <cstdint>
#include <span>

#include "client/call_counters.h"
#include "client/chunk_io.h"
#include "client/gpu_access.h"
#include "wire/messages.h"

namespace tessera::client {

class InlineRoute {
 public:
  InlineRoute(GpuAccess& gpu, CallCounters& counts) : gpu_(gpu), counts_(counts) {}

  // Push: the chunks' bytes into `msg`'s payload, an entry each. Both lists
  // are sized once and filled in place (a reused message keeps their
  // capacity): a batch of small tensors costs a copy each, no more.
  Status Pack(const ChunkIos& ios, wire::Push& msg);
  // Pull: a reply's `data` out to the chunks' buffers; an error, and no
  // byte written, where its size is not the chunks' sum.
  Status Unpack(const ChunkIos& ios, std::span<const uint8_t> data);

 private:
  GpuAccess& gpu_;
  CallCounters& counts_;
};

}  // namespace tessera::client
