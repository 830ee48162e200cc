// A shard's side of its workers (the server's PeerSessions admit and
// authenticate them): a worker's staging slot and CUDA IPC slot, and what a
// peer's end leaves behind.

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/log.h"
#include "core/node_id.h"
#include "core/timeouts.h"
#include "gpu/cuda.h"
#include "kernels/update.h"
#include "server/shard.h"

namespace tessera::server {

void Shard::OnPeerGone(const Peer& peer, bool rank_departed) {
  if (rank_departed) RecheckAfterRejoinGrace();
  for (const auto& ended : leases_.ReleaseAllOf(peer.ep.get())) EndLease(ended.lease);
  std::erase_if(blocked_pushes_, [&](const PendingPush& p) { return p.peer == &peer; });
  std::erase_if(waiting_pulls_, [&](const PendingPull& p) { return p.peer == &peer; });
  RetryWaiting();
}

Status Shard::OnWorkerJoins(Peer& peer, wire::Welcome* welcome) {
  if (arena_kind_ != transport::MemoryKind::kHost) {
    TESSERA_RETURN_IF_ERROR(memory_->MakeCurrent());
  }
  auto staging = ctx_->Allocate(options_.staging_bytes_per_worker, arena_kind_,
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

Status Shard::OfferIpcSlot(Peer& peer, wire::Welcome* welcome) {
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

}  // namespace tessera::server
