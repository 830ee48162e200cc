// A shard's side of its peers (peer_sessions.cc admits and authenticates
// them): a worker's staging slot and CUDA IPC slot, worker presence, the bye
// of a clean stop, and what a peer's end leaves behind.

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

void Shard::SayBye() {
  constexpr auto kByeWait = std::chrono::seconds(2);
  auto answered = std::make_shared<std::promise<void>>();
  ctx_->Post([this, answered] {
    bye_acks_awaited_.clear();
    bye_answered_ = answered;
    const auto bye = wire::Encode(wire::Bye{}, kByeRequestId);
    if (link_ && link_->endpoint() != nullptr && joined_) {
      link_->Send(bye);
      bye_acks_awaited_.push_back(link_->endpoint());
    }
    if (sessions_) {  // none where the start failed before them
      sessions_->ForEach([&](Peer& peer) {
        if (!peer.is_shard) return;
        peer.ep->Send(kProtocolMsg, bye);
        bye_acks_awaited_.push_back(peer.ep.get());
      });
    }
    if (bye_acks_awaited_.empty()) OnByeAnswered(nullptr);
  });
  // The bound is for a peer that hangs: one that stopped (its connection
  // ended, maybe with the bye unread) counts as answered at once.
  answered->get_future().wait_for(kByeWait);
}

void Shard::OnByeAnswered(const transport::Endpoint* from) {
  std::erase(bye_acks_awaited_, from);
  if (!bye_acks_awaited_.empty() || !bye_answered_) return;
  bye_answered_->set_value();
  bye_answered_.reset();
}

void Shard::OnDisconnect(const EndpointPtr& ep, const Status& why) {
  if (bye_answered_) OnByeAnswered(ep.get());
  if (link_ && link_->carries(ep.get())) return link_->OnClosed(why);
  Peer* peer = sessions_->Find(ep.get());
  if (peer == nullptr) return sessions_->Forget(ep);  // one refused, told why
  if (peer->is_shard) {
    if (peer->said_bye) {
      TLOG_INFO("{} stopped", peer->hello.task);
    } else {
      TLOG_WARN("{} left the coordinator: {}", peer->hello.task, why.message());
    }
  } else if (peer->is_reader) {
    TLOG_INFO("reader {} {}", peer->hello.task,
              peer->said_bye ? "left" : "disconnected: " + why.message());
  } else if (peer->authenticated && !peer->is_observer) {
    if (peer->said_bye) {
      TLOG_INFO("{} left", peer->hello.task);
    } else {
      TLOG_INFO("{} disconnected: {}", peer->hello.task, why.message());
    }
    const uint32_t rank = peer->hello.task_index;
    if (roster_.Left(rank, peer->hello.task, std::chrono::steady_clock::now())) {
      RecheckAfterRejoinGrace();
    }
    if (presence_) {
      presence_->Left(rank, peer->said_bye, std::chrono::steady_clock::now());
      CheckPresence();
    }
  }
  for (const auto& ended : leases_.ReleaseAllOf(ep.get())) EndLease(ended.lease);
  std::erase_if(blocked_pushes_, [&](const PendingPush& p) { return p.peer == peer; });
  std::erase_if(waiting_pulls_, [&](const PendingPull& p) { return p.peer == peer; });
  if (hosted_) hosted_->OnPeerGone(reinterpret_cast<CoordinatorHost::PeerId>(ep.get()));
  sessions_->Forget(ep);
  RetryWaiting();
}

void Shard::CheckPresence() {
  if (!presence_ || stopping_) return;
  const auto now = std::chrono::steady_clock::now();
  std::optional<Status> verdict = presence_->Verdict(now);
  // Off the coordinator, the end waits for the coordinator's: its final
  // checkpoint needs this task serving.
  const bool coordinator_gone =
      hosts_coordinator() || link_->coordinator_said_bye() || !link_->joined();
  if (verdict && coordinator_gone) return end_.Decide(*verdict);
  if (auto next = presence_->NextCheck(); next && !verdict && !presence_check_scheduled_) {
    presence_check_scheduled_ = true;
    ctx_->PostAfter(std::chrono::duration_cast<std::chrono::milliseconds>(*next - now) +
                        std::chrono::milliseconds(1),
                    [this] {
                      presence_check_scheduled_ = false;
                      CheckPresence();
                    });
  }
}

std::optional<Status> Shard::WaitUntilWorkersLeaveFor(std::chrono::milliseconds limit) {
  if (!options_.stop_when_workers_leave) {
    return Status::FailedPrecondition("the server was not started to stop when workers leave");
  }
  return end_.WaitForVerdict(limit);
}

Status Shard::OnWorkerJoins(Peer& peer, wire::Welcome* welcome) {
  if (!is_coordinator_only()) {
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
  }
  roster_.Joined(peer.hello.task_index);
  if (presence_) presence_->Connected(peer.hello.task_index, peer.hello.task);
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
