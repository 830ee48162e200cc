// A client's reach into GPU memory: which buffers are GPU memory, device
// copies on the client's own stream, and whether chunks in GPU memory can
// move to a shard one-sided (the fabric reaches GPU memory, the shard is
// mapped with CUDA IPC, or the user allowed staging through host memory).
// Copies on the loop thread.
#pragma once

#include <cstddef>

#include "client/chunk_io.h"
#include "client/shard_link.h"
#include "gpu/cuda.h"
#include "tessera/client.h"

namespace tessera::client {

class GpuAccess {
 public:
  // `fabric`: whether the fabric registers GPU memory, else why not.
  GpuAccess(int cuda_device, Status fabric, bool allow_host_staging)
      : device_(cuda_device), fabric_(std::move(fabric)), allow_host_staging_(allow_host_staging) {}

  // Whether `ptr` is GPU memory, checked against what the caller said.
  static Result<bool> OnGpu(const void* ptr, BufferMemory said);
  // A device copy (any direction) on this client's stream; Wait waits for
  // the copies and reports their error.
  Status CopyAsync(void* dst, const void* src, size_t bytes);
  Status Wait();
  // Whether one-sided operations may read and write GPU memory directly.
  bool fabric_reaches() const { return fabric_.ok(); }
  // Why GPU chunks cannot move to or from `link` one-sided, or OK.
  Status PathTo(const ShardLink& link, const ChunkIos& ios) const;

 private:
  const int device_;
  const Status fabric_;
  const bool allow_host_staging_;
  gpu::Stream stream_;  // created on first use
};

}  // namespace tessera::client
