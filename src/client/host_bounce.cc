#include "client/host_bounce.h"

namespace tessera::client {

auto HostBounce::PointAtHost(ChunkIos& ios) -> GpuPlaces {
  GpuPlaces was;
  uint64_t need = 0;
  for (const auto& io : ios) need += io.on_gpu ? io.chunk->bytes : 0;
  if (need == 0) return was;
  host_.resize(need);
  uint8_t* at = host_.data();
  for (auto& io : ios) {
    if (!io.on_gpu) continue;
    was.emplace_back(io.local, io.chunk->bytes);
    io.local = at;
    at += io.chunk->bytes;
  }
  return was;
}

Status HostBounce::Copy(GpuAccess& gpu, CallCounters& counts, const GpuPlaces& places, bool up) {
  if (places.empty()) return Status::Ok();
  uint8_t* host = host_.data();
  Status st;
  for (const auto& [on_gpu, n] : places) {
    if (st.ok()) st = up ? gpu.CopyAsync(on_gpu, host, n) : gpu.CopyAsync(host, on_gpu, n);
    host += n;
  }
  Status waited = gpu.Wait();
  if (st.ok()) st = waited;
  if (st.ok()) counts.staged_bytes += host_.size();
  return st.WithContext(up ? "staging into GPU memory through host memory"
                           : "staging a GPU buffer through host memory");
}

Status HostBounce::Down(GpuAccess& gpu, CallCounters& counts, ChunkIos& ios) {
  return Copy(gpu, counts, PointAtHost(ios), /*up=*/false);
}

void HostBounce::Redirect(ChunkIos& ios) { gpu_places_ = PointAtHost(ios); }

Status HostBounce::Up(GpuAccess& gpu, CallCounters& counts) {
  return Copy(gpu, counts, gpu_places_, /*up=*/true);
}

}  // namespace tessera::client
