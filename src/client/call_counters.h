// What a client counts beyond its transport's messages and bytes: the
// rest of ClientCounters. Plain atomics, any thread.
#pragma once

#include <atomic>
#include <cstdint>

namespace tessera::client {

struct CallCounters {
  // Chunks of sync pushes their shard dropped.
  std::atomic<uint64_t> dropped_stale{0}, dropped_duplicate{0};
  // GPU buffers: bytes through CUDA IPC, staged through host memory, or
  // copied into inline messages; shards reached through CUDA IPC.
  std::atomic<uint64_t> ipc_bytes{0}, staged_bytes{0}, gpu_inline_bytes{0};
  std::atomic<int> ipc_shards{0};
  std::atomic<uint64_t> protected_sessions{0};  // handshakes that ended protected
};

}  // namespace tessera::client
