#include "server/shard_memory.h"

#include "core/log.h"
#include "core/node_id.h"
#include "gpu/cuda.h"
#include "transport/run_on_loop.h"

namespace tessera::server {

Result<std::unique_ptr<ShardMemory>> ShardMemory::Open(const ServerOptions& options,
                                                       transport::Context& ctx) {
  auto spec = ParseMemorySpec(options.memory);
  if (!spec.ok()) return spec.status();
  auto memory = ParamMemory::Open(*spec);
  if (!memory.ok()) return memory.status();
  std::unique_ptr<ShardMemory> opened(
      new ShardMemory(options, ctx, std::move(*memory), spec->kind));
  if (!opened->memory_->is_host()) TESSERA_RETURN_IF_ERROR(opened->DecideReach());
  TESSERA_RETURN_IF_ERROR(opened->SetBudget());
  return opened;
}

Status ShardMemory::DecideReach() {
  // Kernels run on the progress thread: the GPU must be current there.
  Status current = RunOnLoop(ctx_, [this] { return memory_->MakeCurrent(); });
  if (!current.ok()) return current;
  // Can the fabric reach this GPU's memory? Asking is not enough (verbs
  // learns it from a registration): register a small allocation.
  Status reach = ctx_.CanRegister(transport::MemoryKind::kCuda);
  if (reach.ok()) reach = memory_->MakeCurrent();
  if (reach.ok()) {
    auto probe = ctx_.Allocate(4096, transport::MemoryKind::kCuda, transport::RemoteAccess::kRead);
    reach = probe.status();
  }
  if (reach.ok()) return Status::Ok();
  if (!options_.allow_host_staging) {
    return Status::FailedPrecondition(
        "memory " + memory_->spec().ToString() +
        ": the fabric cannot reach GPU memory: " + reach.message() +
        ". Allow staging through host memory (--allow-host-staging; every staged byte is "
        "counted), or use a fabric that can (docs/gpu.md)");
  }
  arena_kind_ = transport::MemoryKind::kHost;
  TLOG_WARN(
      "parameters in {}, but workers reach them through host memory (--allow-host-staging): {}",
      memory_->Describe(), reach.message());
  return Status::Ok();
}

Status ShardMemory::SetBudget() {
  if (options_.memory_limit_bytes != 0) {
    budget_ = options_.memory_limit_bytes;
    return Status::Ok();
  }
  auto free_bytes = memory_->FreeBytes();
  if (!free_bytes.ok()) return free_bytes.status().WithContext("asking " + memory_->Describe());
  // Unknown (0): no bound but the limits on chunks.
  budget_ = *free_bytes == 0 ? UINT64_MAX : *free_bytes;
  return Status::Ok();
}

std::string ShardMemory::Describe() const {
  return memory_->Describe() + (staged() ? ", staged through host memory" : "");
}

Status ShardMemory::GiveWorkerSlots(Peer& peer, wire::Welcome* welcome) {
  if (arena_kind_ != transport::MemoryKind::kHost) {
    TESSERA_RETURN_IF_ERROR(memory_->MakeCurrent());
  }
  auto staging = ctx_.Allocate(options_.staging_bytes_per_worker, arena_kind_,
                               transport::RemoteAccess::kWrite);
  if (!staging.ok()) return staging.status().WithContext("staging slot for " + peer.hello.task);
  peer.staging = std::move(*staging);
  // Its key is this connection's: a copy of it used on any other writes
  // nothing, where the fabric can tell (Tessera's tcp; verbs with type-2B
  // memory windows; docs/security.md).
  if (Status bound = peer.staging->TakeWritesOnlyFrom(*peer.ep); !bound.ok()) {
    if (bound.code() != StatusCode::kUnimplemented) {
      return bound.WithContext("staging slot for " + peer.hello.task);
    }
    TLOG_DEBUG("staging slot for {}: {}", peer.hello.task, bound.ToString());
  }
  welcome->staging_region = peer.staging->Describe();
  if (!memory_->is_host() && !peer.hello.node_id.empty() && peer.hello.node_id == NodeId()) {
    // Same node: the worker may map a GPU slot and the arenas instead.
    Status ipc = OfferIpcSlot(peer, welcome);
    if (!ipc.ok()) {
      TLOG_WARN("{} shares this node, but CUDA IPC is not offered: {}", peer.hello.task,
                ipc.message());
    }
  }
  return Status::Ok();
}

Status ShardMemory::OfferIpcSlot(Peer& peer, wire::Welcome* welcome) {
  if (arena_kind_ == transport::MemoryKind::kCuda) {
    // The fabric's slot is GPU memory of its own allocation: map that.
    peer.ipc_slot = static_cast<uint8_t*>(peer.staging->data());
  } else {
    auto slot = memory_->Allocate(peer.staging->size());
    if (!slot.ok()) return slot.status();
    peer.ipc_slot_owner = std::move(*slot);
    peer.ipc_slot = peer.ipc_slot_owner.data();
  }
  auto handle = gpu::ExportIpc(peer.ipc_slot);
  if (!handle.ok()) {
    peer.ipc_slot = nullptr;
    peer.ipc_slot_owner = StateBuffer{};
    return handle.status();
  }
  welcome->staging_ipc.assign(handle->begin(), handle->end());
  cuda_ipc_workers_++;
  return Status::Ok();
}

void ShardMemory::AddStats(ServerStats* s) const {
  s->host_staged_bytes = staged_bytes_;
  s->cuda_ipc_workers = cuda_ipc_workers_;
}

}  // namespace tessera::server
