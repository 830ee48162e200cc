// GPU buffers: which they are, device copies, and whether a shard can be
// reached from them.

#include "client/gpu_access.h"

namespace tessera::client {

Result<bool> GpuAccess::OnGpu(const void* ptr, BufferMemory said) {
  if (said == BufferMemory::kHost) return false;  // taken as said: no CUDA call
  const bool device = gpu::QueryPointer(ptr).device;
  if (said == BufferMemory::kCuda && !device) {
    return Status::InvalidArgument(std::string("the buffer was given as GPU memory, but ") +
                                   (gpu::Built()
                                        ? "CUDA does not know it as device memory (cudaMalloc it)"
                                        : "this build has no CUDA"));
  }
  return device;
}

Status GpuAccess::CopyAsync(void* dst, const void* src, size_t bytes) {
  TESSERA_RETURN_IF_ERROR(gpu::SetDevice(device_));  // per thread
  if (stream_.handle() == nullptr) {
    auto stream = gpu::Stream::Create(device_);
    if (!stream.ok()) return stream.status();
    stream_ = std::move(*stream);
  }
  return gpu::Copy(dst, src, bytes, stream_);
}

Status GpuAccess::Wait() {
  if (stream_.handle() == nullptr) return Status::Ok();
  return stream_.Synchronize();
}

Status GpuAccess::PathTo(const ShardLink& link, const ChunkIos& ios) const {
  if (link.ipc.slot.data() != nullptr || fabric_.ok() || allow_host_staging_) return Status::Ok();
  for (const auto& io : ios) {
    if (io.on_gpu) {
      return Status::FailedPrecondition(
          "a GPU buffer cannot move to or from " + link.name() + ": " + fabric_.message() +
          "; run this worker on the shard's node (CUDA IPC), or set "
          "ClientOptions::allow_host_staging to copy through host memory");
    }
  }
  return Status::Ok();
}

}  // namespace tessera::client
