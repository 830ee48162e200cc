// GPU buffers: which they are, device copies, and the CUDA IPC mappings of
// GPU shards on this node.

#include "client/client_impl.h"
#include "gpu/stream_order.h"

namespace tessera {

Result<bool> Client::Impl::OnGpu(const void* ptr, BufferMemory said) {
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

Status Client::Impl::GpuCopyAsync(void* dst, const void* src, size_t bytes) {
  TESSERA_RETURN_IF_ERROR(gpu::SetDevice(options_.cuda_device));  // per thread
  if (stream_.handle() == nullptr) {
    auto stream = gpu::Stream::Create(options_.cuda_device);
    if (!stream.ok()) return stream.status();
    stream_ = std::move(*stream);
  }
  return gpu::Copy(dst, src, bytes, stream_);
}

Status Client::Impl::GpuWait() {
  if (stream_.handle() == nullptr) return Status::Ok();
  return stream_.Synchronize();
}

Status Client::Impl::GpuPathTo(const ShardConn& s, const ChunkIos& ios) const {
  if (s.ipc.slot.data() != nullptr || fabric_gpu_.ok() || options_.allow_host_staging) {
    return Status::Ok();
  }
  for (const auto& io : ios) {
    if (io.on_gpu) {
      return Status::FailedPrecondition(
          "a GPU buffer cannot move to or from " + s.name() + ": " + fabric_gpu_.message() +
          "; run this worker on the shard's node (CUDA IPC), or set "
          "ClientOptions::allow_host_staging to copy through host memory");
    }
  }
  return Status::Ok();
}

Status Client::Impl::OrderOnStream(void* stream, const std::shared_ptr<Future::State>& op,
                                   std::function<void()> start) {
  // The flag first (it can fail without anything enqueued): the stream's
  // later work waits for it, and every way the call ends sets it, since the
  // continuation runs on every Finish (done, failed, cancelled, aborted).
  auto taken = gpu::StreamFlag::Take();
  if (!taken.ok()) return taken.status();
  auto flag = std::make_shared<gpu::StreamFlag>(std::move(*taken));
  {
    std::lock_guard<std::mutex> lock(op->mu);
    op->then.push_back([flag](const Status&) { flag->Set(); });
  }
  // The start runs on a CUDA thread once the stream reaches it: it only
  // posts the call to the loop thread (or fails it, the client being gone).
  Status st = gpu::EnqueueHostCall(stream, [poster = poster_, op, start = std::move(start)]() {
    if (!poster->Post(start) && op->TryStart()) {
      op->Finish(Status::Aborted("the client was destroyed before the stream reached this call"));
    }
  });
  if (!st.ok()) return st;
  if (st = flag->EnqueueWait(stream); !st.ok()) {
    // The call may have started already (an idle stream runs the start at
    // once): it then ends with this error, as it does if it is cancelled.
    op->Add(1);
    op->Finish(st.WithContext("ordering the stream's later work after this call"));
    op->Cancel();
  }
  return Status::Ok();
}

void Client::Impl::MapArena(ShardConn& s, const wire::ArenaKey& a) {
  if (a.ipc.empty() || s.ipc.slot.data() == nullptr) return;
  auto m = gpu::IpcMapping::Open(a.ipc.data(), a.ipc.size(), options_.cuda_device);
  if (!m.ok()) {
    TLOG_WARN("{}: arena {} not mapped with CUDA IPC ({}): pulls use the fabric", s.name(),
              a.arena_id, m.status().message());
    return;
  }
  s.ipc.arenas[a.arena_id] = std::move(*m);
}

void Client::Impl::UnmapShard(ShardConn& s) {
  if (s.ipc.slot.data() != nullptr) counts_.ipc_shards--;
  s.ipc.slot = gpu::IpcMapping{};
  s.ipc.arenas.clear();
}

}  // namespace tessera
