// The shard's life (start, stop), its memory, and the routing of each
// authenticated peer's messages to the parts that serve them: shard_session
// (admission, handshake), shard_apply (pushes), shard_pull (pulls, leases),
// shard_checkpoint (joins, restore, checkpoint rounds), shard_status.
#include "server/shard.h"

#include <algorithm>
#include <cstring>
#include <future>

#include "core/dtype.h"
#include "core/log.h"
#include "core/node_id.h"
#include "core/timeouts.h"
#include "gpu/cuda.h"
#include "kernels/update.h"
#include "transport/run_on_loop.h"

namespace tessera::server {

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
    leases_.Clear();
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
    case wire::Opcode::kUpdateHyper: {
      if (!coord_) {
        return SendError(
            peer, h->request_id,
            Status::FailedPrecondition("update-hyper sent to a shard that is not the coordinator"));
      }
      if (peer.hello.worker_rank != 0) {
        return SendError(peer, h->request_id,
                         Status::PermissionDenied(peer.hello.task + " is not the chief"));
      }
      auto m = wire::DecodeBody<wire::UpdateHyper>(*h, frame);
      if (!m.ok()) return bad(m.status());
      Status st = coord_->UpdateHyper(*m);
      if (!st.ok()) return SendError(peer, h->request_id, st);
      return Reply(peer, h->request_id, wire::Ack{});
    }
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
