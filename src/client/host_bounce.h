// The route through host memory for chunks in GPU memory, for push and pull
// alike, where the fabric cannot reach GPU memory and the user allowed
// staging (ClientOptions::allow_host_staging): the one-sided operations
// read or write host memory of this call's own, and the GPU chunks are
// copied down before a push's puts or up after a pull's gets. One per call
// that needs it. Loop thread.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "client/call_counters.h"
#include "client/chunk_io.h"
#include "client/gpu_access.h"

namespace tessera::client {

class HostBounce {
 public:
  // Push: the GPU chunks' bytes copied into host memory, and each such
  // chunk's `local` pointed there, for the puts to read.
  Status Down(GpuAccess& gpu, CallCounters& counts, ChunkIos& ios);
  // Pull: each GPU chunk's `local` pointed at host memory, for the gets to
  // land in; Up copies them to where they belong.
  void Redirect(ChunkIos& ios);
  Status Up(GpuAccess& gpu, CallCounters& counts);

 private:
  // GPU memory, (where, bytes) a chunk, in the order of host_.
  using GpuPlaces = std::vector<std::pair<uint8_t*, size_t>>;

  // Host memory for the GPU chunks of `ios`, each such chunk's `local`
  // pointed at its place; where each pointed before.
  GpuPlaces PointAtHost(ChunkIos& ios);
  // Copies between host_ and `places`, down to host memory or up to GPU
  // memory; waits for the copies (also after a failed one: those issued
  // use the buffers) and counts them.
  Status Copy(GpuAccess& gpu, CallCounters& counts, const GpuPlaces& places, bool up);

  std::vector<uint8_t> host_;
  GpuPlaces gpu_places_;  // Redirect's GPU chunks
};

}  // namespace tessera::client
