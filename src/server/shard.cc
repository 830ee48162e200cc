#include "server/shard.h"
#include "core/dtype.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <future>

#include "core/log.h"
#include "core/node_id.h"
#include "core/timeouts.h"
#include "gpu/cuda.h"
#include "kernels/update.h"
#include "transport/run_on_loop.h"

namespace tessera::server {
namespace {

// `d`: the chunk's value, in host memory.
std::string FormatValues(const Param& p, const uint8_t* d) {
  std::string out;
  for (uint64_t i = 0; i < p.entry.elem_count; ++i) {
    if (i) out += ", ";
    switch (p.entry.tensor.dtype) {
      case DType::kF32:
        out += fmt::format("{:.6g}", reinterpret_cast<const float*>(d)[i]);
        break;
      case DType::kF64:
        out += fmt::format("{:.10g}", reinterpret_cast<const double*>(d)[i]);
        break;
      case DType::kF16:
        out += fmt::format("{:.4g}", HalfToFloat(reinterpret_cast<const uint16_t*>(d)[i]));
        break;
      case DType::kBF16:
        out += fmt::format("{:.4g}", BFloat16ToFloat(reinterpret_cast<const uint16_t*>(d)[i]));
        break;
      case DType::kI32:
        out += std::to_string(reinterpret_cast<const int32_t*>(d)[i]);
        break;
      case DType::kI64:
        out += std::to_string(reinterpret_cast<const int64_t*>(d)[i]);
        break;
    }
  }
  return p.entry.elem_count == 1 ? out : "[" + out + "]";
}

}  // namespace

std::chrono::milliseconds Shard::LeaseCheckInterval() const {
  return std::clamp(options_.lease_timeout / 4, std::chrono::milliseconds(10),
                    std::chrono::milliseconds(1000));
}

Shard::~Shard() { Stop(); }

Status Shard::Start() {
  TESSERA_RETURN_IF_ERROR(options_.cluster.Validate());
  if (options_.job != "ps" && options_.job != "coordinator") {
    return Status::InvalidArgument("a server runs a ps or coordinator task, not '" + options_.job +
                                   "'");
  }
  const TaskId self{options_.job, options_.task_index};
  auto addr = options_.cluster.address(self);
  if (!addr.ok()) return addr.status();
  TESSERA_RETURN_IF_ERROR(CheckSecretStrength(options_.secret, options_.allow_weak_secret));
  TESSERA_RETURN_IF_ERROR(LogLevelFromEnv().status());

  transport::ContextOptions topts;
  topts.backend = options_.transport;
  topts.name = options_.job + std::to_string(options_.task_index);
  topts.busy_poll = options_.busy_poll;
  auto ctx = transport::Context::Open(topts);
  if (!ctx.ok()) return ctx.status();
  ctx_ = std::move(*ctx);
  TESSERA_RETURN_IF_ERROR(OpenMemory());
  table_ = std::make_unique<ParamTable>(ctx_.get(), memory_.get(), arena_kind_,
                                        options_.arena_bytes, options_.cluster.num_workers());
  if (!options_.checkpoint_dir.empty()) {
    // Every ps task writes its own file there: found out now, not when the
    // first round fails (a read-only or missing mount used to go unnoticed
    // until the end of training).
    TESSERA_RETURN_IF_ERROR(ckpt::CheckWritableDirectory(options_.checkpoint_dir));
  }
  if (is_coordinator_only() ||
      (!options_.cluster.separate_coordinator() && options_.task_index == 0)) {
    coord_ = std::make_unique<coord::Coordinator>(options_.cluster.num_tasks("ps"),
                                                  options_.cluster.num_workers());
    joined_shards_.assign(static_cast<size_t>(options_.cluster.num_tasks("ps")), nullptr);
    joined_ = true;
    if (!options_.checkpoint_dir.empty()) TESSERA_RETURN_IF_ERROR(StartCheckpoints());
  }

  ctx_->SetHandler(kProtocolMsg, [this](const EndpointPtr& ep, std::span<const uint8_t> frame) {
    OnMessage(ep, frame);
  });
  ctx_->SetDisconnectHandler(
      [this](const EndpointPtr& ep, const Status& why) { OnDisconnect(ep, why); });
  const std::string host = options_.bind_host.empty() ? addr->host : options_.bind_host;
  AdmissionOptions admission;
  admission.max_unauthenticated = options_.max_unauthenticated;
  auto hello_deadline = TimeoutFromEnv("TESSERA_HELLO_TIMEOUT_MS", options_.hello_timeout);
  if (!hello_deadline.ok()) return hello_deadline.status();
  admission.hello_deadline = *hello_deadline;
  admission_ = std::make_unique<Admission>(admission);
  auto listener = ctx_->Listen(host, addr->port, [this](const EndpointPtr& ep) { OnAccept(ep); });
  if (!listener.ok()) {
    return listener.status().WithContext(self.ToString());
  }
  listener_ = std::move(*listener);
  ctx_->PostAfter(LeaseCheckInterval(), [this] { RevokeExpiredLeases(); });
  if (checkpointer_) ctx_->Post([this] { checkpointer_->Start(); });
  if (!hosts_coordinator()) ctx_->Post([this] { JoinCoordinator(); });
  TLOG_INFO("{} serving on {}:{} over {}{}; parameters in {}{}", self.ToString(), host,
            listener_->port(), ctx_->Describe(),
            coord_ && !is_coordinator_only() ? " (and the coordinator)" : "", memory_->Describe(),
            table_->staged() ? ", staged through host memory" : "");
  return Status::Ok();
}

std::string Shard::StatusJson() const {
  const ServerStats s = stats();
  nlohmann::json workers = nlohmann::json::array();
  for (const auto& [raw, peer] : peers_) {
    if (!peer->authenticated || peer->is_shard || peer->is_observer) continue;
    workers.push_back({{"task", peer->hello.task},
                       {"address", peer->ep->peer()},
                       {"cuda_ipc", peer->ipc_slot != nullptr}});
  }
  nlohmann::json j = {{"task", TaskId{options_.job, options_.task_index}.ToString()},
                      {"coordinator", hosts_coordinator()},
                      {"transport", ctx_->Describe()},
                      {"memory", memory_->Describe()},
                      {"staged_through_host", table_->staged()},
                      {"workers", workers},
                      {"stats",
                       {{"tensors", s.tensors},
                        {"pushes_applied", s.pushes_applied},
                        {"pulls_served", s.pulls_served},
                        {"connections_refused", s.connections_refused},
                        {"leases_revoked", s.leases_revoked},
                        {"sync_steps_applied", s.sync_steps_applied},
                        {"stale_pushes_dropped", s.stale_pushes_dropped},
                        {"duplicate_pushes_dropped", s.duplicate_pushes_dropped},
                        {"chunks_restored", s.chunks_restored},
                        {"checkpoints_written", s.checkpoints_written},
                        {"host_staged_bytes", s.host_staged_bytes},
                        {"cuda_ipc_workers", s.cuda_ipc_workers}}}};
  if (coord_) {
    j["global_step"] = coord_->global_step();
    // What the coordinator was told of steps, and by whom: the shards count
    // them, at most one report per ps task per sync step; workers say none.
    j["step_reports"] = {{"from_ps_tasks", coord_->step_reports_by_shard()},
                         {"from_workers", step_messages_from_workers_.load()}};
  }
  return j.dump();
}

Status Shard::OpenMemory() {
  auto spec = ParseMemorySpec(options_.memory);
  if (!spec.ok()) return spec.status();
  if (is_coordinator_only()) spec = MemorySpec{};  // it holds no parameters
  auto memory = ParamMemory::Open(*spec);
  if (!memory.ok()) return memory.status();
  memory_ = std::move(*memory);
  arena_kind_ = spec->kind;
  if (memory_->is_host()) return Status::Ok();
  // Kernels run on the progress thread: the GPU must be current there.
  Status current = RunOnLoop(*ctx_, [this] { return memory_->MakeCurrent(); });
  if (!current.ok()) return current;
  // Can the fabric reach this GPU's memory? Asking is not enough (verbs
  // learns it from a registration): register a small allocation.
  Status reach = ctx_->CanRegister(transport::MemoryKind::kCuda);
  if (reach.ok()) reach = memory_->MakeCurrent();
  if (reach.ok()) {
    auto probe = ctx_->Allocate(4096, transport::MemoryKind::kCuda, transport::RemoteAccess::kRead);
    reach = probe.status();
  }
  if (reach.ok()) return Status::Ok();
  if (!options_.allow_host_staging) {
    return Status::FailedPrecondition(
        "memory " + spec->ToString() + ": the fabric cannot reach GPU memory: " + reach.message() +
        ". Allow staging through host memory (--allow-host-staging; every staged byte is "
        "counted), or use a fabric that can (docs/gpu.md)");
  }
  arena_kind_ = transport::MemoryKind::kHost;
  TLOG_WARN(
      "parameters in {}, but workers reach them through host memory (--allow-host-staging): {}",
      memory_->Describe(), reach.message());
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

Status Shard::Publish(Param& p) {
  if (!table_->staged()) return Status::Ok();
  host_staged_bytes_ += p.bytes;
  return memory_->ToHost(p.published, p.data, p.bytes);
}

Status Shard::ReadValue(const Param& p, void* host_dst) const {
  if (table_->staged()) {
    std::memcpy(host_dst, p.published, p.bytes);
    return Status::Ok();
  }
  return memory_->ToHost(host_dst, p.data, p.bytes);
}

void Shard::Stop() {
  if (!ctx_) return;
  if (checkpointer_) {
    // The final checkpoint, while the other shards still serve (`tessera
    // launch` stops the coordinator first).
    auto done = std::make_shared<std::promise<void>>();
    ctx_->Post([this, done] {
      checkpointer_->Save(coord::Checkpointer::Reason::kShutdown,
                          [done](const Result<coord::SavedCheckpoint>& r) {
                            if (!r.ok()) TLOG_INFO("no final checkpoint: {}", r.status().message());
                            done->set_value();
                          });
    });
    done->get_future().wait_for(options_.checkpoint_timeout + std::chrono::seconds(5));
  }
  SayBye();
  listener_.reset();
  // Peers' staging slots are freed only after the progress thread stopped:
  // over tcp a put arriving late is written by that thread.
  std::unordered_map<transport::Endpoint*, std::unique_ptr<Peer>> peers;
  std::promise<void> done;
  ctx_->Post([this, &done, &peers] {
    stopping_ = true;
    if (checkpointer_) {
      checkpointer_->Stop();
      checkpointer_.reset();  // on this thread: its callbacks run here
    }
    if (coord_link_) coord_link_->Close();
    snapshot_.reset();
    for (auto& [raw, peer] : peers_) peer->ep->Close();
    for (auto& [ep, deadline] : closing_) ep->Close();
    closing_.clear();
    peers.swap(peers_);
    leases_.clear();
    blocked_pushes_.clear();
    waiting_pulls_.clear();
    init_waiters_.clear();
    done.set_value();
  });
  done.get_future().wait();
  if (snapshot_writer_.joinable()) snapshot_writer_.join();
  ctx_.reset();    // stops progress: nothing writes into the arenas any more
  table_.reset();  // regions outlive their context safely (they hold the ucp context)
}

ServerStats Shard::stats() const {
  ServerStats s;
  s.tensors = tensors_;
  s.pushes_applied = pushes_applied_;
  s.pulls_served = pulls_served_;
  s.connections_refused = refused_;
  s.leases_revoked = leases_revoked_;
  s.sync_steps_applied = steps_applied_;
  s.stale_pushes_dropped = stale_dropped_;
  s.duplicate_pushes_dropped = duplicate_dropped_;
  s.chunks_restored = chunks_restored_;
  s.checkpoints_written = checkpoints_written_;
  s.checkpoint_rounds_failed = checkpoint_rounds_failed_;
  s.host_staged_bytes = host_staged_bytes_;
  s.cuda_ipc_workers = cuda_ipc_workers_;
  if (coord_) s.step_reports_from_ps = coord_->step_reports_by_shard();
  s.step_messages_from_workers = step_messages_from_workers_;
  return s;
}

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
  OnDisconnect(ep, why);  // nothing more it sends is read
  if (!tell) return ep->Close();
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
    closing_.front().first->Close();
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
    bye_acks_awaited_ = 0;
    bye_answered_ = answered;
    const auto bye = wire::Encode(wire::Bye{}, kByeRequestId);
    if (coord_link_ && joined_) {
      coord_link_->Send(kProtocolMsg, bye);
      bye_acks_awaited_++;
    }
    for (auto& [raw, peer] : peers_) {
      if (!peer->is_shard) continue;
      peer->ep->Send(kProtocolMsg, bye);
      bye_acks_awaited_++;
    }
    if (bye_acks_awaited_ == 0) OnByeAnswered();
  });
  answered->get_future().wait_for(kByeWait);
}

void Shard::OnByeAnswered() {
  if (bye_acks_awaited_ > 0 && --bye_acks_awaited_ > 0) return;
  if (bye_answered_) bye_answered_->set_value();
  bye_answered_.reset();
}

void Shard::OnDisconnect(const EndpointPtr& ep, const Status& why) {
  if (coord_link_ && ep.get() == coord_link_.get()) return OnLinkLost(why);
  std::erase_if(closing_, [&](const auto& c) { return c.first == ep; });
  auto it = peers_.find(ep.get());
  if (it == peers_.end()) return;
  Peer* peer = it->second.get();
  if (peer->is_shard) {
    const size_t k = peer->hello.worker_rank;
    if (peer->said_bye) {
      TLOG_INFO("{} stopped", peer->hello.task);
    } else {
      TLOG_WARN("{} left the coordinator: {}", peer->hello.task, why.message());
    }
    if (k < joined_shards_.size() && joined_shards_[k] == peer) joined_shards_[k] = nullptr;
    if (checkpointer_) checkpointer_->OnShardLost(static_cast<int>(k));
  } else if (peer->authenticated && !peer->is_observer) {
    if (peer->said_bye) {
      TLOG_INFO("{} left", peer->hello.task);
    } else {
      TLOG_INFO("{} disconnected: {}", peer->hello.task, why.message());
    }
    const uint32_t rank = peer->hello.worker_rank;
    if (--connected_ranks_[rank] == 0) departed_[rank] = peer->hello.task;
  }
  for (auto lit = leases_.begin(); lit != leases_.end();) {
    auto next = std::next(lit);
    if (lit->second.owner == ep.get()) EndLease(lit);
    lit = next;
  }
  std::erase_if(blocked_pushes_, [&](const PendingPush& p) { return p.peer == peer; });
  std::erase_if(waiting_pulls_, [&](const PendingPull& p) { return p.peer == peer; });
  std::erase_if(init_waiters_, [&](const auto& w) { return w.first == peer; });
  admission_->Forget(reinterpret_cast<uintptr_t>(ep.get()));
  peers_.erase(it);
  RetryWaiting();
}

void Shard::OnMessage(const EndpointPtr& ep, std::span<const uint8_t> frame) {
  if (coord_link_ && ep.get() == coord_link_.get()) return OnLinkFrame(frame);
  auto it = peers_.find(ep.get());
  if (it == peers_.end()) return;
  Peer& peer = *it->second;
  auto h = wire::DecodeHeader(frame);
  if (!h.ok()) return Drop(peer, h.status());

  if (!peer.authenticated) {
    Status st;
    if (h->opcode == wire::Opcode::kHello && !peer.handshake.said_hello()) {
      st = OnHello(peer, *h, frame);
    } else if (h->opcode == wire::Opcode::kAuth && peer.handshake.said_hello()) {
      st = OnAuth(peer, *h, frame);
    } else {
      st = Status::PermissionDenied(std::string(wire::OpcodeName(h->opcode)) +
                                    " before authentication");
    }
    if (!st.ok()) Drop(peer, st, h->request_id);
    return;
  }

  if (peer.is_shard) return OnShardPeerMessage(peer, *h, frame);
  if (peer.is_observer) {
    if (h->opcode == wire::Opcode::kPing) return Reply(peer, h->request_id, wire::Ack{});
    if (h->opcode == wire::Opcode::kStatus) {
      return Reply(peer, h->request_id, wire::StatusReply{StatusJson()});
    }
    return SendError(peer, h->request_id,
                     Status::PermissionDenied(std::string(wire::OpcodeName(h->opcode)) +
                                              " from an observer, which may only ask for status"));
  }

  // The transport delimits messages, so a body this shard cannot accept
  // (malformed, or valid bytes that say something invalid) costs the
  // authenticated peer that request only: it gets the error, and the
  // connection stays usable. Unknown opcodes close it.
  auto bad = [&](const Status& st) {
    SendError(peer, h->request_id,
              st.WithContext(std::string(wire::OpcodeName(h->opcode)) + " refused"));
  };
  const bool data_op = h->opcode == wire::Opcode::kCreate || h->opcode == wire::Opcode::kPush ||
                       h->opcode == wire::Opcode::kPull || h->opcode == wire::Opcode::kRelease ||
                       h->opcode == wire::Opcode::kSetHyper;
  if (data_op && is_coordinator_only()) {
    return SendError(
        peer, h->request_id,
        Status::FailedPrecondition(std::string(wire::OpcodeName(h->opcode)) +
                                   " sent to the coordinator, which holds no tensors"));
  }
  switch (h->opcode) {
    case wire::Opcode::kPing:
      return Reply(peer, h->request_id, wire::Ack{});
    case wire::Opcode::kBye:
      peer.said_bye = true;
      return Reply(peer, h->request_id, wire::Ack{});
    case wire::Opcode::kDeclare: {
      auto m = wire::DecodeBody<wire::Declare>(*h, frame);
      if (!m.ok()) return bad(m.status());
      if (!coord_) {
        return SendError(
            peer, h->request_id,
            Status::FailedPrecondition("declare sent to a shard that is not the coordinator"));
      }
      auto reply = coord_->Declare(*m, peer.hello.task, peer.hello.worker_rank == 0);
      if (!reply.ok()) return SendError(peer, h->request_id, reply.status());
      return Reply(peer, h->request_id, *reply);
    }
    case wire::Opcode::kCreate: {
      auto m = wire::DecodeBody<wire::Create>(*h, frame);
      if (!m.ok()) return bad(m.status());
      return OnCreate(peer, h->request_id, *m);
    }
    case wire::Opcode::kPush: {
      auto m = wire::DecodeBody<wire::Push>(*h, frame);
      if (!m.ok()) return bad(m.status());
      return OnPush(peer, h->request_id, h->flags, std::move(*m));
    }
    case wire::Opcode::kPull: {
      auto m = wire::DecodeBody<wire::Pull>(*h, frame);
      if (!m.ok()) return bad(m.status());
      return OnPull(peer, h->request_id, std::move(*m));
    }
    case wire::Opcode::kSetHyper: {
      auto m = wire::DecodeBody<wire::SetHyper>(*h, frame);
      if (!m.ok()) return bad(m.status());
      return OnSetHyper(peer, h->request_id, *m);
    }
    case wire::Opcode::kRelease: {
      auto m = wire::DecodeBody<wire::Release>(*h, frame);
      if (!m.ok()) return bad(m.status());
      return OnRelease(peer, *m);
    }
    case wire::Opcode::kGetStep:
      if (!coord_) {
        return SendError(
            peer, h->request_id,
            Status::FailedPrecondition("global step asked of a shard that is not the coordinator"));
      }
      return Reply(peer, h->request_id, wire::StepReply{coord_->global_step()});
    case wire::Opcode::kSaveCheckpoint:
      if (!coord_) {
        return SendError(peer, h->request_id,
                         Status::FailedPrecondition(
                             "save-checkpoint sent to a shard that is not the coordinator"));
      }
      return OnSaveCheckpoint(peer, h->request_id);
    case wire::Opcode::kInitDone:
    case wire::Opcode::kWaitInit: {
      if (!coord_) {
        return SendError(
            peer, h->request_id,
            Status::FailedPrecondition("init barrier sent to a shard that is not the coordinator"));
      }
      if (h->opcode == wire::Opcode::kInitDone) {
        if (peer.hello.worker_rank != 0) {
          return SendError(peer, h->request_id,
                           Status::PermissionDenied(peer.hello.task + " is not the chief"));
        }
        TLOG_INFO("chief {} initialised the parameters", peer.hello.task);
        coord_->MarkInitialized();
        Reply(peer, h->request_id, wire::Ack{});
        for (auto& [waiter, req] : init_waiters_) Reply(*waiter, req, wire::Ack{});
        init_waiters_.clear();
      } else if (coord_->initialized()) {
        Reply(peer, h->request_id, wire::Ack{});
      } else {
        init_waiters_.emplace_back(&peer, h->request_id);
      }
      return;
    }
    default:
      // The shards count steps: a worker has no step to report.
      if (h->opcode == wire::Opcode::kStepsApplied) step_messages_from_workers_++;
      return Drop(peer,
                  Status::InvalidArgument(std::string("unexpected ") + wire::OpcodeName(h->opcode) +
                                          " from a worker"),
                  h->request_id);
  }
}

void Shard::OnAccept(const EndpointPtr& ep) {
  auto owned = std::make_unique<Peer>(ep, options_.secret);
  Peer& peer = *owned;
  peers_[ep.get()] = std::move(owned);
  const auto now = std::chrono::steady_clock::now();
  auto d = admission_->Admit(reinterpret_cast<uintptr_t>(ep.get()), HostOfPeer(ep->peer()), now);
  if (d.evicted) {
    auto it = peers_.find(reinterpret_cast<transport::Endpoint*>(*d.evicted));
    if (it != peers_.end()) {
      Drop(*it->second,
           Status::Unavailable("did not authenticate, and " +
                               std::to_string(admission_->options().max_unauthenticated) +
                               " newer connections that had not either were waiting"));
    }
  }
  if (!d.admitted.ok()) return Drop(peer, d.admitted);
  ScheduleSweep(admission_->options().hello_deadline);
}

void Shard::DropOverdue() {
  overdue_sweep_scheduled_ = false;
  const auto now = std::chrono::steady_clock::now();
  while (!closing_.empty() && closing_.front().second <= now) {
    closing_.front().first->Close();
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
  return Status::Ok();
}

Status Shard::CheckClaims(const wire::Hello& m) const {
  if (m.task.empty()) return Status::InvalidArgument("hello without a task name");
  if (m.role == wire::PeerRole::kShard) {
    const int k = static_cast<int>(m.worker_rank);
    if (!hosts_coordinator()) {
      return Status::PermissionDenied(m.task + " tried to join a task that is not the coordinator");
    }
    if (k >= options_.cluster.num_tasks("ps") || m.task != TaskId{"ps", k}.ToString()) {
      return Status::PermissionDenied(m.task + " joins as ps task " + std::to_string(k) +
                                      ", which the cluster spec does not name so");
    }
  } else if (m.role == wire::PeerRole::kObserver) {
    return Status::Ok();  // no rank, no spec: an observer counts for nothing
  } else if (static_cast<int>(m.worker_rank) >= options_.cluster.num_workers()) {
    return Status::PermissionDenied(m.task + " claims worker rank " +
                                    std::to_string(m.worker_rank) + " but the cluster has " +
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
    admission_->NoteFailure(HostOfPeer(peer.ep->peer()), std::chrono::steady_clock::now());
    return proof;
  }
  admission_->Forget(conn);
  TESSERA_RETURN_IF_ERROR(CheckClaims(peer.handshake.hello()));
  peer.hello = peer.handshake.hello();
  peer.ep->MarkAuthenticated();
  wire::Welcome welcome;
  welcome.server_proof = peer.handshake.ServerProof();
  if (peer.hello.role == wire::PeerRole::kObserver) {
    peer.authenticated = true;
    peer.is_observer = true;
    Reply(peer, h.request_id, welcome);  // no staging slot, no keys
    return Status::Ok();
  }
  if (peer.hello.role == wire::PeerRole::kShard) {
    peer.authenticated = true;
    peer.is_shard = true;
    Reply(peer, h.request_id, welcome);  // no staging slot: shards write no tensors here
    return Status::Ok();
  }
  if (!is_coordinator_only()) {
    if (arena_kind_ != transport::MemoryKind::kHost) {
      TESSERA_RETURN_IF_ERROR(memory_->MakeCurrent());
    }
    auto staging = ctx_->Allocate(options_.staging_bytes_per_worker, arena_kind_,
                                  transport::RemoteAccess::kWrite);
    if (!staging.ok()) return staging.status().WithContext("staging slot for " + peer.hello.task);
    peer.staging = std::move(*staging);
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
  connected_ranks_[peer.hello.worker_rank]++;
  departed_.erase(peer.hello.worker_rank);  // a restarted worker is back
  TLOG_INFO("{} connected from {}", peer.hello.task, peer.ep->peer());
  Reply(peer, h.request_id, welcome);
  return Status::Ok();
}

void Shard::OnCreate(Peer& peer, uint64_t request_id, const wire::Create& msg) {
  if (!joined_) {
    // What to restore is known once the coordinator answered.
    deferred_creates_.emplace_back(peer.ep, request_id, msg);
    return;
  }
  wire::CreateReply reply;
  for (const auto& entry : msg.entries) {
    auto p = table_->Create(entry);
    if (!p.ok()) return SendError(peer, request_id, p.status());
    if (restore_ && !(*p)->initialized && (*p)->version == 0) RestoreChunk(**p);
    reply.keys.push_back(
        {(*p)->key_id, (*p)->arena_id, (*p)->arena_offset, (*p)->bytes, (*p)->version});
    if (peer.known_arenas.insert((*p)->arena_id).second) {
      wire::ArenaKey key{(*p)->arena_id, table_->DescribeArena((*p)->arena_id), {}};
      if (peer.ipc_slot != nullptr) {
        auto ipc = table_->ArenaIpcHandle((*p)->arena_id);
        if (ipc.ok()) {
          key.ipc = std::move(*ipc);
        } else {
          TLOG_WARN("arena {}: no CUDA IPC handle for {}: {}", (*p)->arena_id, peer.hello.task,
                    ipc.status().message());
        }
      }
      reply.arenas.push_back(std::move(key));
    }
  }
  tensors_ = table_->size();
  Reply(peer, request_id, reply);
}

Status Shard::ValidatePush(const Peer& peer, uint32_t flags, const wire::Push& msg) {
  // The bytes are inline, or in the sender's staging slot (fabric or IPC).
  const bool inline_bytes = !msg.payload.empty();
  if (!inline_bytes && (flags & wire::kFlagIpcSlot) && peer.ipc_slot == nullptr) {
    return Status::FailedPrecondition("push from the CUDA IPC slot, but " + peer.hello.task +
                                      " was offered none");
  }
  const bool then_pull = flags & wire::kFlagThenPull;
  if (then_pull && (!inline_bytes || (flags & wire::kFlagInit))) {
    return Status::InvalidArgument(
        "a push answered with the weights (push_pull) must carry its bytes inline and not "
        "initialise");
  }
  if (msg.step_parts > static_cast<uint32_t>(options_.cluster.num_tasks("ps"))) {
    return Status::InvalidArgument("push whose step spans " + std::to_string(msg.step_parts) +
                                   " shards, but the cluster has " +
                                   std::to_string(options_.cluster.num_tasks("ps")) + " ps tasks");
  }
  const uint64_t slot = inline_bytes ? msg.payload.size() : peer.staging->size();
  for (const auto& e : msg.entries) {
    const Param* p = table_->Find(e.key_id);
    if (p == nullptr) return Status::NotFound("push to unknown key id " + std::to_string(e.key_id));
    if (e.byte_length != p->bytes) {
      return Status::InvalidArgument("push to tensor '" + p->display_name + "' (" +
                                     DescribeTensor(p->entry.tensor.dtype, p->entry.tensor.shape) +
                                     ", " + std::to_string(p->bytes) + " bytes) carries " +
                                     std::to_string(e.byte_length) + " bytes");
    }
    if (e.staging_offset > slot || e.byte_length > slot - e.staging_offset) {
      return Status::OutOfRange(
          "push to tensor '" + p->display_name + "' reads [" + std::to_string(e.staging_offset) +
          ", +" + std::to_string(e.byte_length) + ") outside the " + std::to_string(slot) +
          (inline_bytes ? " inline bytes" : "-byte staging slot"));
    }
    if (!(flags & wire::kFlagInit) && !p->initialized) {
      return Status::FailedPrecondition("tensor '" + p->display_name +
                                        "' is not initialised yet (the chief initialises it)");
    }
    if (then_pull && p->entry.tensor.mode.kind == Consistency::kSync) {
      return Status::InvalidArgument("push_pull of tensor '" + p->display_name +
                                     "', which is sync: its weights change when the step "
                                     "applies; push, then pull after the step");
    }
  }
  return Status::Ok();
}

void Shard::OnPush(Peer& peer, uint64_t request_id, uint32_t flags, wire::Push msg) {
  Status st = ValidatePush(peer, flags, msg);
  if (!st.ok()) return SendError(peer, request_id, st);
  PendingPush push{&peer, request_id, flags, std::move(msg)};
  if (!TryApplyPush(push)) {
    blocked_pushes_.push_back(std::move(push));
    MarkWaitingWriters();
    return;
  }
  RetryWaiting();
}

bool Shard::NeedsNoLease(const Param& p, uint32_t flags) {
  // A sync push only adds to the step's sum; the parameter changes when the
  // step applies (ApplyAggregated), which waits for readers itself.
  return !(flags & wire::kFlagInit) && p.entry.tensor.mode.kind == Consistency::kSync;
}

bool Shard::TryApplyPush(PendingPush& push) {
  if (frozen_) return false;  // a checkpoint round is cutting the state
  const bool init = push.flags & wire::kFlagInit;
  for (const auto& e : push.msg.entries) {
    const Param* p = table_->Find(e.key_id);
    if (!init && !p->failure.ok()) {
      SendError(*push.peer, push.request_id, p->failure);
      return true;
    }
    if (NeedsNoLease(*p, push.flags)) {
      if (push.msg.step > p->step) return false;  // ahead of the cluster: wait for the step
    } else if (p->readers > 0) {
      return false;
    }
  }
  const uint32_t rank = push.peer->hello.worker_rank;
  const bool from_slot = push.msg.payload.empty();
  const bool from_ipc = from_slot && (push.flags & wire::kFlagIpcSlot);
  const auto* staging = !from_slot ? push.msg.payload.data()
                        : from_ipc ? push.peer->ipc_slot
                                   : static_cast<const uint8_t*>(push.peer->staging->data());
  wire::PushReply reply;
  reply.versions.reserve(push.msg.entries.size());
  reply.outcomes.reserve(push.msg.entries.size());
  for (const auto& e : push.msg.entries) {
    Param* p = table_->Find(e.key_id);
    const auto& t = p->entry.tensor;
    auto outcome = wire::PushOutcome::kApplied;
    // The gradient where the kernels can read it (copied to the GPU when it
    // came inline or through a host staging slot).
    auto reachable = memory_->Reachable(staging + e.staging_offset, e.byte_length);
    Status st = reachable.status();
    const void* grad = reachable.ok() ? *reachable : nullptr;
    if (from_slot && !from_ipc && table_->staged()) host_staged_bytes_ += e.byte_length;
    if (!st.ok()) {
      // Reported below.
    } else if (init) {
      // Initial value (or a restore): the optimizer starts afresh from it.
      st = memory_->ApplyUpdate(UpdateRule::kAssign, t.dtype, p->data, grad, p->entry.elem_count);
      if (st.ok()) {
        st = memory_->ResetRuleState(t.rule, p->hyper, t.dtype, p->data, p->entry.elem_count,
                                     p->rule_state());
      }
      if (st.ok()) st = Publish(*p);
      p->updates = 0;
      p->ResetAggregation();
      p->failure = Status::Ok();
      p->version++;
      p->initialized = true;
    } else if (t.mode.kind == Consistency::kSync) {
      if (push.msg.step < p->step || p->agg_count >= t.mode.replicas_to_aggregate) {
        // Its step was applied, or has its replicas and waits to apply: a
        // late worker or a backup worker. TensorFlow drops these too.
        outcome = wire::PushOutcome::kStale;
        stale_dropped_++;
      } else if (p->contributed[rank]) {
        outcome = wire::PushOutcome::kDuplicate;
        duplicate_dropped_++;
      } else {
        st = memory_->Accumulate(t.dtype, p->agg.data(), grad, p->entry.elem_count,
                                 p->agg_count == 0);
        p->contributed[rank] = true;
        if (++p->agg_count == t.mode.replicas_to_aggregate) pending_steps_.push_back(p->key_id);
      }
    } else {
      st = ApplyGradient(*p, grad);
      if (t.mode.kind == Consistency::kBounded && rank < p->pushed_steps.size()) {
        p->pushed_steps[rank] = std::max(p->pushed_steps[rank], push.msg.step + 1);
      }
    }
    if (!st.ok()) {
      SendError(*push.peer, push.request_id, st.WithContext("tensor '" + p->display_name + "'"));
      return true;
    }
    p->writer_waiting = false;
    reply.versions.push_back(p->version);
    reply.outcomes.push_back(static_cast<uint8_t>(outcome));
    if (options_.log_updates && p->entry.elem_count <= 8 &&
        outcome == wire::PushOutcome::kApplied && t.mode.kind != Consistency::kSync) {
      LogUpdate(*p, push.peer->hello.task);
    }
  }
  pushes_applied_++;
  if (push.flags & wire::kFlagThenPull) {
    ReplyWithWeights(push, reply.versions);
  } else {
    Reply(*push.peer, push.request_id, reply);
  }
  if (push.msg.step_parts > 0 && !init) CountStep(push);
  return true;
}

void Shard::ReplyWithWeights(const PendingPush& push, const std::vector<uint64_t>& versions) {
  // The pull half of a push_pull: the weights this push produced, inline
  // (the gradients came inline, and weights are as large).
  PendingPull pull{push.peer, push.request_id, {}, std::nullopt};
  pull.msg.inline_max = static_cast<uint32_t>(push.msg.payload.size());
  pull.msg.entries.reserve(push.msg.entries.size());
  for (size_t i = 0; i < push.msg.entries.size(); ++i) {
    pull.msg.entries.push_back({push.msg.entries[i].key_id, versions[i], 0});
  }
  if (!TryGrantPull(pull)) waiting_pulls_.push_back(std::move(pull));
}

void Shard::CountStep(const PendingPush& push) {
  const uint32_t rank = push.peer->hello.worker_rank;
  for (const auto& e : push.msg.entries) {
    const auto& mode = table_->Find(e.key_id)->entry.tensor.mode;
    if (mode.kind == Consistency::kSync) {
      step_counter_.CountSync(rank, push.msg.step, mode.replicas_to_aggregate, push.msg.step_parts);
      return ScheduleStepReport();
    }
  }
  step_counter_.CountAsync();
  ScheduleStepReport();
}

void Shard::ScheduleStepReport() {
  // Once per turn of the loop: the async steps of every push handled in
  // this turn travel in one report.
  if (step_report_posted_) return;
  step_report_posted_ = true;
  ctx_->Post([this] {
    step_report_posted_ = false;
    ReportSteps();
  });
}

void Shard::ReportSteps() {
  if (stopping_ || !step_counter_.has_reports()) return;
  if (hosts_coordinator()) {
    for (const auto& report : step_counter_.TakeReports()) {
      Status st = coord_->OnStepsApplied(options_.task_index, report);
      if (!st.ok()) TLOG_ERROR("{}", st.message());
    }
    if (checkpointer_) checkpointer_->OnGlobalStep(coord_->global_step());
    return;
  }
  // Without a joined link the steps wait in the counter, and go when it
  // (re)joins.
  if (!coord_link_ || !link_joined_) return;
  for (const auto& report : step_counter_.TakeReports()) {
    coord_link_->Send(kProtocolMsg, wire::Encode(report, 0));
  }
}

Status Shard::ApplyGradient(Param& p, const void* grad) {
  const auto& t = p.entry.tensor;
  Status st = IsOptimizer(t.rule)
                  ? memory_->ApplyOptimizer(t.rule, p.hyper, t.dtype, p.data, grad,
                                            p.entry.elem_count, p.rule_state(), ++p.updates)
                  : memory_->ApplyUpdate(t.rule, t.dtype, p.data, grad, p.entry.elem_count);
  if (st.ok()) st = Publish(p);
  if (st.ok()) p.version++;
  return st;
}

bool Shard::TryApplyStep(Param& p) {
  if (p.readers > 0 || frozen_) return false;
  const auto& mode = p.entry.tensor.mode;
  const double scale = mode.average ? 1.0 / mode.replicas_to_aggregate : 1.0;
  auto grad =
      memory_->FinishAccumulation(p.entry.tensor.dtype, p.agg.data(), p.entry.elem_count, scale);
  Status st = apply_step_failpoint_.Check();
  if (st.ok()) st = grad.ok() ? ApplyGradient(p, *grad) : grad.status();
  if (!st.ok()) {
    std::string pushers;
    for (size_t rank = 0; rank < p.contributed.size(); ++rank) {
      if (!p.contributed[rank]) continue;
      if (!pushers.empty()) pushers += ", ";
      pushers += WorkerName(static_cast<uint32_t>(rank));
    }
    p.failure = Status(st.code(), "tensor '" + p.display_name + "': sync step " +
                                      std::to_string(p.step) + " (pushed by " + pushers +
                                      ") could not be applied, so its value is not that step's: " +
                                      st.message() + "; restart from the last checkpoint to go on");
    TLOG_ERROR("{}", p.failure.message());
  }
  p.step++;
  steps_applied_++;
  p.ResetAggregation();
  p.writer_waiting = false;
  if (snapshot_ && p.step == snapshot_->step && snapshot_->behind.erase(p.key_id) > 0) {
    // This chunk just reached the checkpoint's step.
    if (Capture(p) && snapshot_->behind.empty()) StartSnapshotWriter();
  }
  if (options_.log_updates && p.entry.elem_count <= 8) {
    LogUpdate(p, "step " + std::to_string(p.step - 1) + " of " +
                     std::to_string(mode.replicas_to_aggregate) + " workers");
  }
  return true;
}

void Shard::MarkWaitingWriters() {
  // Writers have priority: a tensor with an update waiting for its readers
  // takes no new readers.
  for (const auto& push : blocked_pushes_) {
    for (const auto& e : push.msg.entries) {
      Param* p = table_->Find(e.key_id);
      if (!NeedsNoLease(*p, push.flags)) p->writer_waiting = true;
    }
  }
  for (uint32_t key : pending_steps_) table_->Find(key)->writer_waiting = true;
}

void Shard::LogUpdate(const Param& p, const std::string& by) const {
  std::vector<uint8_t> value(p.bytes);
  if (Status st = ReadValue(p, value.data()); !st.ok()) {
    TLOG_WARN("{}: cannot read its value to log it: {}", p.display_name, st.message());
    return;
  }
  TLOG_INFO("{} = {}  (version {}, {} by {})", p.display_name, FormatValues(p, value.data()),
            p.version, p.version == 1 ? "initialised" : UpdateRuleName(p.entry.tensor.rule), by);
}

void Shard::OnPull(Peer& peer, uint64_t request_id, wire::Pull msg) {
  for (const auto& e : msg.entries) {
    if (table_->Find(e.key_id) == nullptr) {
      return SendError(peer, request_id,
                       Status::NotFound("pull of unknown key id " + std::to_string(e.key_id)));
    }
  }
  PendingPull pull{&peer, request_id, std::move(msg)};
  if (TryGrantPull(pull)) return;
  Status st = StepReachable(pull);
  if (!st.ok()) return SendError(peer, request_id, st);
  if (pull.msg.wait_ms > 0) {
    pull.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(pull.msg.wait_ms);
  }
  waiting_pulls_.push_back(std::move(pull));
  if (waiting_pulls_.back().deadline) ScheduleWaitSweep();
}

void Shard::ScheduleWaitSweep() {
  if (wait_sweep_scheduled_ || stopping_) return;
  std::optional<std::chrono::steady_clock::time_point> earliest;
  for (const auto& p : waiting_pulls_) {
    if (p.deadline && (!earliest || *p.deadline < *earliest)) earliest = p.deadline;
  }
  if (!earliest) return;
  // At most 100 ms late, and never a wake-up more often while pulls wait.
  const auto in = std::chrono::duration_cast<std::chrono::milliseconds>(
      *earliest - std::chrono::steady_clock::now());
  wait_sweep_scheduled_ = true;
  ctx_->PostAfter(std::clamp(in, std::chrono::milliseconds(1), std::chrono::milliseconds(100)),
                  [this] {
                    wait_sweep_scheduled_ = false;
                    SweepWaitingPulls();
                  });
}

void Shard::SweepWaitingPulls() {
  if (stopping_) return;
  const auto now = std::chrono::steady_clock::now();
  for (auto it = waiting_pulls_.begin(); it != waiting_pulls_.end();) {
    if (!it->deadline || *it->deadline > now) {
      ++it;
      continue;
    }
    const std::string what = WhatPullWaitsFor(*it);
    TLOG_WARN("{}'s pull waited {} ms: {}", it->peer->hello.task, it->msg.wait_ms, what);
    SendError(
        *it->peer, it->request_id,
        Status::DeadlineExceeded("waited " + std::to_string(it->msg.wait_ms) + " ms: " + what));
    it = waiting_pulls_.erase(it);
  }
  ScheduleWaitSweep();
}

std::string Shard::WorkerName(uint32_t rank) const {
  auto task = options_.cluster.worker_task(static_cast<int>(rank));
  return task.ok() ? task->ToString() : "worker rank " + std::to_string(rank);
}

std::string Shard::WhatPullWaitsFor(const PendingPull& pull) const {
  for (const auto& e : pull.msg.entries) {
    const Param* p = table_->Find(e.key_id);
    const std::string name = "tensor '" + p->display_name + "'";
    if (!p->initialized) return name + " is not initialised yet (the chief has not pushed it)";
    const auto& mode = p->entry.tensor.mode;
    if (mode.kind == Consistency::kSync && p->step < e.min_step) {
      std::string pushed, missing;
      for (uint32_t rank = 0; rank < mode.total_num_replicas; ++rank) {
        std::string& list = rank < p->contributed.size() && p->contributed[rank] ? pushed : missing;
        list += (list.empty() ? "" : ", ") + WorkerName(rank);
      }
      return name + ": sync step " + std::to_string(p->step) + " has " +
             std::to_string(p->agg_count) + " of the " +
             std::to_string(mode.replicas_to_aggregate) + " gradients it needs; pushed by " +
             (pushed.empty() ? "no worker" : pushed) + "; not pushed by " +
             (missing.empty() ? "none" : missing) +
             (p->agg_count >= mode.replicas_to_aggregate ? " (it waits for readers to finish)"
                                                         : "");
    }
    if (mode.kind == Consistency::kBounded && p->StepReached() < e.min_step) {
      std::string behind;
      for (uint32_t rank = 0; rank < p->pushed_steps.size(); ++rank) {
        if (p->pushed_steps[rank] >= e.min_step) continue;
        behind += (behind.empty() ? "" : ", ") + WorkerName(rank) + " has pushed " +
                  std::to_string(p->pushed_steps[rank]) + " steps";
      }
      return name + ": step " + std::to_string(e.min_step) +
             " is not yet pushed by every worker (" + behind + ")";
    }
    if (p->version < e.min_version) {
      return name + " is at version " + std::to_string(p->version) + ", not yet " +
             std::to_string(e.min_version);
    }
    if (p->writer_waiting) return name + " has an update waiting for readers to finish";
  }
  return "nothing (it was about to be answered)";
}

Status Shard::StepReachable(const PendingPull& pull) const {
  for (const auto& e : pull.msg.entries) {
    const Param* p = table_->Find(e.key_id);
    const auto& mode = p->entry.tensor.mode;
    if (mode.kind != Consistency::kSync || p->StepReached() >= e.min_step) continue;
    if (p->agg_count >= mode.replicas_to_aggregate) continue;  // complete, waiting for readers
    // Workers that may still push this step: not yet counted, not gone.
    uint32_t possible = 0;
    std::string gone;
    for (uint32_t rank = 0; rank < mode.total_num_replicas; ++rank) {
      if (rank < p->contributed.size() && p->contributed[rank]) continue;
      auto d = departed_.find(rank);
      if (d == departed_.end()) {
        possible++;
      } else {
        gone += (gone.empty() ? "" : ", ") + d->second;
      }
    }
    const uint32_t needed = mode.replicas_to_aggregate - p->agg_count;
    if (possible < needed) {
      return Status::Unavailable("step " + std::to_string(p->step) + " of '" + p->display_name +
                                 "' cannot complete: it needs " + std::to_string(needed) +
                                 " more worker(s) and " + gone + " disconnected");
    }
  }
  return Status::Ok();
}

bool Shard::TryGrantPull(PendingPull& pull) {
  for (const auto& e : pull.msg.entries) {
    const Param* p = table_->Find(e.key_id);
    if (!p->failure.ok()) {
      SendError(*pull.peer, pull.request_id, p->failure);
      return true;
    }
    if (!p->initialized || p->version < e.min_version || p->StepReached() < e.min_step ||
        p->writer_waiting) {
      return false;
    }
  }
  wire::PullReply reply;
  // Small pulls get the bytes in the reply: one round trip, no lease (the
  // copy is made here, between updates, so it is never half-applied).
  uint64_t total = 0;
  for (const auto& e : pull.msg.entries) total += table_->Find(e.key_id)->bytes;
  if (total <= std::min<uint64_t>(pull.msg.inline_max, wire::kMaxInlineBytes)) {
    reply.data.resize(total);
    uint64_t at = 0;
    for (const auto& e : pull.msg.entries) {
      const Param* p = table_->Find(e.key_id);
      if (Status st = ReadValue(*p, reply.data.data() + at); !st.ok()) {
        SendError(*pull.peer, pull.request_id, st.WithContext("reading '" + p->display_name + "'"));
        return true;
      }
      at += p->bytes;
      reply.versions.push_back(p->version);
    }
    pulls_served_++;
    Reply(*pull.peer, pull.request_id, reply);
    return true;
  }
  reply.lease_id = next_lease_++;
  Lease lease{pull.peer->ep.get(),
              pull.peer->hello.task,
              {},
              std::chrono::steady_clock::now() + options_.lease_timeout};
  for (const auto& e : pull.msg.entries) {
    Param* p = table_->Find(e.key_id);
    p->readers++;
    lease.keys.push_back(e.key_id);
    reply.versions.push_back(p->version);
  }
  leases_[reply.lease_id] = std::move(lease);
  pulls_served_++;
  Reply(*pull.peer, pull.request_id, reply);
  return true;
}

void Shard::OnSetHyper(Peer& peer, uint64_t request_id, const wire::SetHyper& msg) {
  if (peer.hello.worker_rank != 0) {
    return SendError(peer, request_id,
                     Status::PermissionDenied(peer.hello.task + " is not the chief"));
  }
  for (uint32_t key : msg.key_ids) {
    if (table_->Find(key) == nullptr) {
      return SendError(peer, request_id,
                       Status::NotFound("set-hyper for unknown key id " + std::to_string(key)));
    }
  }
  for (uint32_t key : msg.key_ids) {
    Param* p = table_->Find(key);
    p->hyper = msg.hyper;
    TLOG_INFO("{}: learning rate {} from update {} on", p->display_name, msg.hyper.learning_rate,
              p->updates + 1);
  }
  Reply(peer, request_id, wire::Ack{});
}

void Shard::OnRelease(Peer& peer, const wire::Release& msg) {
  auto it = leases_.find(msg.lease_id);
  if (it == leases_.end() || it->second.owner != peer.ep.get()) {
    TLOG_WARN("{} released lease {} it does not hold", peer.hello.task, msg.lease_id);
    return;
  }
  EndLease(it);
  RetryWaiting();
}

void Shard::EndLease(std::unordered_map<uint64_t, Lease>::iterator it) {
  for (uint32_t key : it->second.keys) table_->Find(key)->readers--;
  leases_.erase(it);
}

void Shard::RevokeExpiredLeases() {
  if (stopping_) return;
  const auto now = std::chrono::steady_clock::now();
  bool revoked = false;
  for (auto it = leases_.begin(); it != leases_.end();) {
    auto next = std::next(it);
    if (it->second.expires <= now) {
      TLOG_WARN("{} held pull lease {} for longer than {} ms; revoked so updates can go on",
                it->second.task, it->first, options_.lease_timeout.count());
      leases_revoked_++;
      EndLease(it);
      revoked = true;
    }
    it = next;
  }
  if (revoked) RetryWaiting();
  ctx_->PostAfter(LeaseCheckInterval(), [this] { RevokeExpiredLeases(); });
}

void Shard::RetryWaiting() {
  // Updates first (writers have priority), then the pulls they unblock. An
  // applied sync step can unblock pushes for the next step, which can
  // complete that one: repeat until nothing moves.
  bool moved = true;
  while (moved) {
    moved = false;
    for (auto it = pending_steps_.begin(); it != pending_steps_.end();) {
      bool applied = TryApplyStep(*table_->Find(*it));
      moved |= applied;
      it = applied ? pending_steps_.erase(it) : std::next(it);
    }
    for (auto it = blocked_pushes_.begin(); it != blocked_pushes_.end();) {
      bool applied = TryApplyPush(*it);
      moved |= applied;
      it = applied ? blocked_pushes_.erase(it) : std::next(it);
    }
  }
  MarkWaitingWriters();
  for (auto it = waiting_pulls_.begin(); it != waiting_pulls_.end();) {
    if (TryGrantPull(*it)) {
      it = waiting_pulls_.erase(it);
      continue;
    }
    // A sync step that lost the workers it needs fails its waiters, naming
    // who is gone, instead of leaving them to time out.
    Status st = StepReachable(*it);
    if (!st.ok()) {
      SendError(*it->peer, it->request_id, st);
      it = waiting_pulls_.erase(it);
      continue;
    }
    ++it;
  }
}

}  // namespace tessera::server

namespace tessera {

class Server::Impl {
 public:
  explicit Impl(ServerOptions options) : shard(std::move(options)) {}
  server::Shard shard;
};

Result<std::unique_ptr<Server>> Server::Start(const ServerOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  TESSERA_RETURN_IF_ERROR(impl->shard.Start());
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Server::~Server() = default;
uint16_t Server::port() const { return impl_->shard.port(); }
ServerStats Server::stats() const { return impl_->shard.stats(); }
void Server::Stop() { impl_->shard.Stop(); }

}  // namespace tessera
