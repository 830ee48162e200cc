// A shard's peers: admission, the handshake (hello, auth, what a peer may
// claim), CUDA IPC slots, refusals, and leaving on purpose or not.

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/log.h"
#include "core/node_id.h"
#include "core/timeouts.h"
#include "gpu/cuda.h"
#include "kernels/update.h"
#include "server/shard.h"

namespace tessera::server {
namespace {

// Connections accepted after which the end of a flood gives memory back.
constexpr uint64_t kFloodConnections = 1024;

void TrimHeap() {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

}  // namespace

void Shard::SendError(Peer& peer, uint64_t request_id, const Status& st) {
  wire::Error err{st.code(), options_.job + " task " + std::to_string(options_.task_index) + ": " +
                                 st.message()};
  Reply(peer, request_id, err);
}

void Shard::Drop(Peer& peer, const Status& why, uint64_t request_id, bool tell) {
  refused_++;
  uint64_t held_back = 0;
  // A stranger can be refused as often as it connects: those lines are
  // throttled (the count of refusals is in the status counters).
  if (peer.authenticated || refusal_log_.Allow(LogThrottle::Clock::now(), &held_back)) {
    TLOG_WARN("closing connection from {} ({}): {}{}", peer.ep->peer(),
              peer.hello.task.empty() ? "unauthenticated" : peer.hello.task, why.ToString(),
              held_back == 0 ? ""
                             : " (and " + std::to_string(held_back) +
                                   " more unauthenticated connections closed, not logged)");
  }
  auto ep = peer.ep;
  const bool unproven = !peer.authenticated;
  OnDisconnect(ep, why);  // nothing more it sends is read
  // An unproven peer gets no graceful close: that would hold its socket
  // and buffers for the linger, which a flood turns into descriptors run out.
  if (!tell) return unproven ? ep->Abort() : ep->Close();
  // Tell the peer why, and leave the closing to it: a close from here can
  // overtake the reason (UCX reports a disconnect over tcp while the message
  // travels through shared memory). A peer that does not close is closed
  // after the hello deadline, or sooner when too many linger.
  ep->Send(kProtocolMsg,
           wire::Encode(wire::Error{why.code(), options_.job + " task " +
                                                    std::to_string(options_.task_index) + ": " +
                                                    why.message()},
                        request_id));
  closing_.push_back({ep, std::chrono::steady_clock::now() + admission_->options().hello_deadline});
  if (closing_.size() > admission_->options().max_unauthenticated) {
    closing_.front().first->Abort();  // told why already; the newest are kept
    closing_.pop_front();
  }
  ScheduleSweep(admission_->options().hello_deadline);
}

void Shard::ScheduleSweep(std::chrono::milliseconds after) {
  if (overdue_sweep_scheduled_ || stopping_) return;
  overdue_sweep_scheduled_ = true;
  ctx_->PostAfter(after, [this] { DropOverdue(); });
}

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
    for (auto& [raw, peer] : peers_) {
      if (!peer->is_shard) continue;
      peer->ep->Send(kProtocolMsg, bye);
      bye_acks_awaited_.push_back(raw);
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
  std::erase_if(closing_, [&](const auto& c) { return c.first == ep; });
  auto it = peers_.find(ep.get());
  if (it == peers_.end()) return;
  Peer* peer = it->second.get();
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
    if (--connected_ranks_[rank] == 0) {
      departed_[rank] = {peer->hello.task, std::chrono::steady_clock::now()};
      worker_departures_++;
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
  if (service_) service_->OnPeerGone(reinterpret_cast<coord::PeerId>(ep.get()));
  admission_->Forget(reinterpret_cast<uintptr_t>(ep.get()));
  peers_.erase(it);
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
  if (verdict && coordinator_gone) {
    std::lock_guard<std::mutex> lock(verdict_mu_);
    if (!verdict_) {
      verdict_ = *verdict;
      verdict_cv_.notify_all();
    }
    return;
  }
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
  std::unique_lock<std::mutex> lock(verdict_mu_);
  verdict_cv_.wait_for(lock, limit, [&] { return verdict_.has_value(); });
  return verdict_;
}

void Shard::OnAccept(const EndpointPtr& ep) {
  accepted_since_trim_++;
  auto owned = std::make_unique<Peer>(ep, options_.secret, reader_key_);
  Peer& peer = *owned;
  peers_[ep.get()] = std::move(owned);
  const auto now = std::chrono::steady_clock::now();
  auto d = admission_->Admit(reinterpret_cast<uintptr_t>(ep.get()), HostOfPeer(ep->peer()), now);
  if (d.evicted) {
    auto it = peers_.find(reinterpret_cast<transport::Endpoint*>(*d.evicted));
    if (it != peers_.end()) {
      Drop(*it->second, Status::ResourceExhausted(
                            "did not authenticate, and the table of connections waiting to (" +
                            std::to_string(admission_->options().max_unauthenticated) +
                            ", of them " + std::to_string(admission_->options().max_strangers) +
                            " from outside the cluster's hosts) was full of newer ones"));
    }
  }
  if (!d.admitted.ok()) return Drop(peer, d.admitted);
  ScheduleSweep(admission_->options().hello_deadline);
}

void Shard::DropOverdue() {
  overdue_sweep_scheduled_ = false;
  const auto now = std::chrono::steady_clock::now();
  while (!closing_.empty() && closing_.front().second <= now) {
    closing_.front().first->Abort();  // had the hello deadline to read why and close
    closing_.pop_front();
  }
  for (auto conn : admission_->Overdue(now)) {
    auto it = peers_.find(reinterpret_cast<transport::Endpoint*>(conn));
    if (it == peers_.end()) {
      admission_->Forget(conn);
      continue;
    }
    Drop(*it->second,
         Status::DeadlineExceeded("did not authenticate within " +
                                  std::to_string(admission_->options().hello_deadline.count()) +
                                  " ms"),
         0, /*tell=*/false);
  }
  if (admission_->unauthenticated() > 0 || !closing_.empty()) {
    ScheduleSweep(admission_->options().hello_deadline / 4);
  } else if (accepted_since_trim_ >= kFloodConnections) {
    // A flood ended: what its connections' buffers took from the heap goes
    // back to the system, not kept for the next one.
    accepted_since_trim_ = 0;
    TrimHeap();
  }
}

Status Shard::OnHello(Peer& peer, const wire::Header& h, std::span<const uint8_t> frame) {
  auto m = wire::DecodeBody<wire::Hello>(h, frame);
  if (!m.ok()) return m.status();
  // Nothing is checked against the cluster before the peer proved itself, so
  // that a stranger learns nothing of it; the challenge carries no proof.
  const uint32_t index =
      is_coordinator_only() ? wire::kCoordinatorIndex : static_cast<uint32_t>(options_.task_index);
  Reply(peer, h.request_id, peer.handshake.OnHello(std::move(*m), index));
  admission_->NoteHello(reinterpret_cast<uintptr_t>(peer.ep.get()));
  return Status::Ok();
}

Status Shard::CheckClaims(const wire::Hello& m) const {
  if (m.task.empty()) return Status::InvalidArgument("hello without a task name");
  if (m.role == wire::PeerRole::kShard) {
    const int k = static_cast<int>(m.task_index);
    if (!hosts_coordinator()) {
      return Status::PermissionDenied(m.task + " tried to join a task that is not the coordinator");
    }
    if (k >= options_.cluster.num_tasks("ps") || m.task != TaskId{"ps", k}.ToString()) {
      return Status::PermissionDenied(m.task + " joins as ps task " + std::to_string(k) +
                                      ", which the cluster spec does not name so");
    }
  } else if (m.role == wire::PeerRole::kObserver) {
    return Status::Ok();  // no rank, no spec: an observer counts for nothing
  } else if (m.role == wire::PeerRole::kReader) {
    // No rank either, and no name of the cluster's tasks (logs and status
    // name peers by it); it must only agree on where the tensors live.
    for (const char* job : {"ps", "worker", "chief", "coordinator"}) {
      if (m.task.starts_with(std::string("/job:") + job + "/")) {
        return Status::PermissionDenied("reader " + m.task +
                                        " takes the name of a task of the cluster; name it "
                                        "another job (e.g. /job:evaluator/task:0)");
      }
    }
    auto theirs = ClusterSpec::FromJson(m.cluster);
    if (!theirs.ok())
      return theirs.status().WithContext("the cluster spec in " + m.task + "'s hello");
    const std::string diff = options_.cluster.DifferenceFrom(*theirs, /*workers_too=*/false);
    if (diff.empty()) return Status::Ok();
    return Status::FailedPrecondition(
        "the cluster spec of reader " + m.task + " (there) differs from that of " +
        TaskId{options_.job, options_.task_index}.ToString() + " (here): " + diff);
  } else if (static_cast<int>(m.task_index) >= options_.cluster.num_workers()) {
    return Status::PermissionDenied(m.task + " claims worker rank " + std::to_string(m.task_index) +
                                    " but the cluster has " +
                                    std::to_string(options_.cluster.num_workers()) + " workers");
  }
  auto theirs = ClusterSpec::FromJson(m.cluster);
  if (!theirs.ok())
    return theirs.status().WithContext("the cluster spec in " + m.task + "'s hello");
  const std::string diff = options_.cluster.DifferenceFrom(*theirs);
  if (!diff.empty()) {
    return Status::FailedPrecondition(
        "the cluster spec of " + m.task + " (there) differs from that of " +
        TaskId{options_.job, options_.task_index}.ToString() + " (here): " + diff +
        ". Give every task the same cluster spec");
  }
  return Status::Ok();
}

Status Shard::OnAuth(Peer& peer, const wire::Header& h, std::span<const uint8_t> frame) {
  auto m = wire::DecodeBody<wire::Auth>(h, frame);
  if (!m.ok()) return m.status();
  const auto conn = reinterpret_cast<uintptr_t>(peer.ep.get());
  if (Status proof = peer.handshake.CheckAuth(*m, peer.ep->peer()); !proof.ok()) {
    admission_->NoteFailure(conn);
    return proof;
  }
  admission_->NoteProven(conn, HostOfPeer(peer.ep->peer()));
  TESSERA_RETURN_IF_ERROR(CheckClaims(peer.handshake.hello()));
  peer.hello = peer.handshake.hello();
  peer.ep->MarkAuthenticated();
  wire::Welcome welcome;
  welcome.protection = peer.handshake.DecideProtection(
      options_.session_protection, peer.ep->CanProtectSession(), peer.ep->PeerOnLoopback());
  welcome.server_proof = peer.handshake.ServerProof();
  if (peer.hello.role != wire::PeerRole::kWorker) {
    // Readers, observers and shards write no tensors: a write key they got
    // hold of (a reader's captured staging key) lets them write nothing.
    peer.ep->MarkReadOnly();
  }
  if (peer.hello.role == wire::PeerRole::kObserver) {
    peer.authenticated = true;
    peer.is_observer = true;
    // No staging slot, no keys.
    return SendWelcome(peer, h.request_id, welcome);
  }
  if (peer.hello.role == wire::PeerRole::kReader) {
    peer.authenticated = true;
    peer.is_reader = true;
    TLOG_INFO("reader {} connected from {}", peer.hello.task, peer.ep->peer());
    // No staging slot: it writes nothing here.
    return SendWelcome(peer, h.request_id, welcome);
  }
  if (peer.hello.role == wire::PeerRole::kShard) {
    peer.authenticated = true;
    peer.is_shard = true;
    // No staging slot: shards write no tensors here.
    return SendWelcome(peer, h.request_id, welcome);
  }
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
    welcome.staging_region = peer.staging->Describe();
    if (!memory_->is_host() && !peer.hello.node_id.empty() && peer.hello.node_id == NodeId()) {
      // Same node: the worker may map a GPU slot and the arenas instead.
      Status ipc = OfferIpcSlot(peer, &welcome);
      if (!ipc.ok()) {
        TLOG_WARN("{} shares this node, but CUDA IPC is not offered: {}", peer.hello.task,
                  ipc.message());
      }
    }
  }
  peer.authenticated = true;
  connected_ranks_[peer.hello.task_index]++;
  if (presence_) presence_->Connected(peer.hello.task_index, peer.hello.task);
  departed_.erase(peer.hello.task_index);  // a restarted worker is back
  TLOG_INFO("{} connected from {}", peer.hello.task, peer.ep->peer());
  return SendWelcome(peer, h.request_id, welcome);
}

Status Shard::SendWelcome(Peer& peer, uint64_t request_id, const wire::Welcome& welcome) {
  Reply(peer, request_id, welcome);
  if (!welcome.session_protected()) return Status::Ok();
  // The welcome is the last plain frame each way: the client sends nothing
  // between its auth and the welcome, and seals all it sends after.
  return peer.ep->ProtectSession(peer.handshake.Keys());
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
