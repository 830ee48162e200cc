// The shard's life (start, stop), its memory, creates and hyper-parameters.
// server.cc routes each peer's messages to the parts that serve them:
// shard_session (admission, handshake), shard_apply (pushes), shard_pull
// (pulls, leases), shard_checkpoint (joins, restore, checkpoint rounds),
// shard_status, and the coordinator's service when it is hosted here.
#include "server/shard.h"

#include <sys/resource.h>

#include <algorithm>
#include <cstring>
#include <future>
#include <set>

#include "core/dtype.h"
#include "core/log.h"
#include "core/node_id.h"
#include "core/timeouts.h"
#include "gpu/cuda.h"
#include "kernels/update.h"
#include "transport/run_on_loop.h"
#include "transport/sockaddr.h"
#include "wire/limits.h"

namespace tessera::server {

std::chrono::milliseconds Shard::LeaseCheckInterval() const {
  return std::clamp(options_.lease_timeout / 4, std::chrono::milliseconds(10),
                    std::chrono::milliseconds(1000));
}

Shard::~Shard() { Stop(); }

namespace {

std::string DescribeSessionProtection(SessionProtection protection, bool can) {
  if (!can) return "sessions unprotected: this fabric cannot protect them (docs/security.md)";
  switch (protection) {
    case SessionProtection::kOn:
      return "every session authenticated and encrypted after its handshake "
             "(session protection on)";
    case SessionProtection::kOff:
      return "sessions unprotected (session protection off)";
    case SessionProtection::kIntegrity:
      return "every session authenticated, not encrypted, after its handshake "
             "(session protection integrity)";
    default:
      return "sessions that leave the host authenticated and encrypted, loopback ones not "
             "(session protection auto)";
  }
}

}  // namespace

Status Shard::OpenSessions() {
  PeerSessions::Options o{.server = &options_,
                          .reader_key = ReaderKey(options_.secret),
                          .hello_index = is_coordinator_only()
                                             ? wire::kCoordinatorIndex
                                             : static_cast<uint32_t>(options_.task_index),
                          .hosts_coordinator = hosts_coordinator()};
  PeerSessions::Events events{
      .worker_joins = [this](Peer& peer,
                             wire::Welcome* welcome) { return OnWorkerJoins(peer, welcome); },
      .ended = [this](const EndpointPtr& ep, const Status& why) { OnDisconnect(ep, why); }};
  sessions_ = std::make_unique<PeerSessions>(*ctx_, std::move(o), std::move(events));
  return sessions_->Open();
}

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
  if (IsReaderKey(options_.secret)) {
    return Status::InvalidArgument(
        "the secret given is a reader key, which lets read-only clients in; a " + options_.job +
        " task needs the cluster secret it was derived from");
  }
  auto checkpoint_key = ckpt::CheckpointKeyFor(options_.secret);
  if (!checkpoint_key.ok()) return checkpoint_key.status();
  checkpoint_key_ = *checkpoint_key;
  TESSERA_RETURN_IF_ERROR(LogLevelFromEnv().status());

  transport::ContextOptions topts;
  topts.backend = options_.transport;
  topts.name = options_.job + std::to_string(options_.task_index);
  topts.busy_poll = options_.busy_poll;
  topts.spin_before_sleep = options_.spin_before_sleep;
  auto ctx = transport::Context::Open(topts);
  if (!ctx.ok()) return ctx.status();
  ctx_ = std::move(*ctx);
  if (options_.session_protection == SessionProtection::kOn && !ctx_->CanProtectSessions()) {
    return Status::FailedPrecondition(
        "session protection on needs --transport tcp: " + ctx_->Describe() +
        " cannot authenticate or encrypt sessions (docs/security.md)");
  }
  TESSERA_RETURN_IF_ERROR(OpenMemory());
  TESSERA_RETURN_IF_ERROR(SetMemoryBudget());
  table_ = std::make_unique<ParamTable>(ctx_.get(), memory_.get(), arena_kind_,
                                        options_.arena_bytes, options_.cluster.num_workers());
  checkpoints_ = std::make_unique<CheckpointParticipant>(
      *table_, *memory_, *ctx_,
      CheckpointParticipant::Options{
          .task = TaskId{"ps", options_.task_index}.ToString(),
          .round_timeout = options_.checkpoint_timeout,
          .send_to_coordinator = [this](MessageBytes f) { SendToCoordinator(std::move(f)); },
          .resumed = [this] { RetryWaiting(); }});
  if (options_.stop_when_workers_leave) {
    presence_.emplace(options_.cluster.num_workers(), options_.workers_grace,
                      std::chrono::steady_clock::now());
  }
  if (!options_.checkpoint_dir.empty()) {
    // Every ps task writes its own file there: found out now, not when the
    // first round fails (a read-only or missing mount used to go unnoticed
    // until the end of training).
    TESSERA_RETURN_IF_ERROR(ckpt::CheckWritableDirectory(options_.checkpoint_dir));
  }
  if (HostsCoordinator(role_) != (hosted_ != nullptr)) {
    return Status::Internal(self.ToString() + ": the server's roles and its coordinator disagree");
  }
  if (hosted_) TESSERA_RETURN_IF_ERROR(OpenHostedCoordinator());

  ctx_->SetHandler(kProtocolMsg, [this](const EndpointPtr& ep, std::span<const uint8_t> frame) {
    OnMessage(ep, frame);
  });
  ctx_->SetDisconnectHandler(
      [this](const EndpointPtr& ep, const Status& why) { OnDisconnect(ep, why); });
  const std::string host = options_.bind_host.empty() ? addr->host : options_.bind_host;
  TESSERA_RETURN_IF_ERROR(OpenSessions());
  if (!hosts_coordinator()) OpenCoordinatorLink();
  const uint16_t port = options_.bind_port != 0 ? options_.bind_port : addr->port;
  auto listener =
      ctx_->Listen(host, port, [this](const EndpointPtr& ep) { sessions_->Accept(ep); });
  if (!listener.ok()) {
    return listener.status().WithContext(self.ToString());
  }
  listener_ = std::move(*listener);
  ctx_->PostAfter(LeaseCheckInterval(), [this] { RevokeExpiredLeases(); });
  if (hosts_coordinator()) {
    ctx_->Post([this] {
      if (is_coordinator_only()) return hosted_->Start(nullptr);
      hosted_->Start([this](const wire::JoinReply& reply) {
        if (!stopping_) FirstJoined(reply);
      });
    });
  } else {
    ctx_->Post([this] { link_->Connect(); });
  }
  // A job whose workers never come ends too, after the grace time.
  if (presence_) ctx_->Post([this] { CheckPresence(); });
  TLOG_INFO("{} serving on {}:{} over {}{}; parameters in {}{}; {}", self.ToString(), host,
            listener_->port(), ctx_->Describe(),
            hosts_coordinator() && !is_coordinator_only() ? " (and the coordinator)" : "",
            memory_->Describe(), table_->staged() ? ", staged through host memory" : "",
            DescribeSessionProtection(options_.session_protection, ctx_->CanProtectSessions()));
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

Status Shard::SetMemoryBudget() {
  if (options_.memory_limit_bytes != 0) {
    memory_budget_ = options_.memory_limit_bytes;
    return Status::Ok();
  }
  auto free_bytes = memory_->FreeBytes();
  if (!free_bytes.ok()) return free_bytes.status().WithContext("asking " + memory_->Describe());
  // Unknown (0): no bound but the limits on chunks.
  memory_budget_ = *free_bytes == 0 ? UINT64_MAX : *free_bytes;
  return Status::Ok();
}

Status Shard::Publish(Param& p) { return apply::Publish(ApplyTarget(), p); }

Status Shard::ReadValue(const Param& p, void* host_dst) const {
  if (table_->staged()) {
    std::memcpy(host_dst, p.published, p.bytes);
    return Status::Ok();
  }
  return memory_->ToHost(host_dst, p.data, p.bytes);
}

void Shard::Stop() {
  {
    // Whoever waits for the workers to leave hears of the stop instead.
    end_.Decide(Status::Aborted("the server was stopped"));
  }
  if (!ctx_) return;
  if (hosted_ && !options_.checkpoint_dir.empty()) {
    // The final checkpoint, while the other shards still serve (`tessera
    // launch` stops the coordinator first).
    auto done = std::make_shared<std::promise<void>>();
    ctx_->Post([this, done] { hosted_->SaveFinal([done] { done->set_value(); }); });
    done->get_future().wait_for(options_.checkpoint_timeout + std::chrono::seconds(5));
  }
  SayBye();
  listener_.reset();
  // Peers' staging slots are freed only after the progress thread stopped:
  // over tcp a put arriving late is written by that thread.
  std::unordered_map<transport::Endpoint*, std::unique_ptr<Peer>> peers;  // freed last
  std::promise<void> done;
  ctx_->Post([this, &done, &peers] {
    stopping_ = true;
    // On this thread: its checkpointer's callbacks run here. The service
    // itself stays until the shard goes: stats() may read it meanwhile.
    if (hosted_) hosted_->Stop();
    if (link_) link_->Stop();
    if (checkpoints_) checkpoints_->Stop();
    if (sessions_) peers = sessions_->CloseAll();
    leases_.Clear();
    blocked_pushes_.clear();
    waiting_pulls_.clear();
    done.set_value();
  });
  done.get_future().wait();
  if (checkpoints_) checkpoints_->JoinWriter();
  ctx_.reset();  // stops progress: nothing writes into the arenas any more
  link_.reset();
  checkpoints_.reset();
  table_.reset();  // regions outlive their context safely (they hold the ucp context)
}

void Shard::OnCreate(Peer& peer, uint64_t request_id, const wire::Create& msg) {
  if (!joined_) {
    // What to restore is known once the coordinator answered.
    deferred_creates_.emplace_back(peer.ep, request_id, msg);
    return;
  }
  if (!peer.is_reader) {
    // Before any is made: a batch that does not fit takes no memory at all.
    Status room = table_->CheckRoom(msg.entries, memory_budget_, wire::DeclareLimits{}.max_chunks);
    if (!room.ok()) return sessions_->SendError(peer, request_id, room);
  }
  wire::CreateReply reply;
  wire::Join created;  // for the coordinator hosted here
  const bool tell_coordinator = coordinator()->hosted();
  for (const auto& entry : msg.entries) {
    auto p = peer.is_reader ? FindForReader(entry) : table_->Create(entry);
    if (!p.ok()) return sessions_->SendError(peer, request_id, p.status());
    if (restore_ && !(*p)->initialized && (*p)->version == 0) RestoreChunk(**p);
    if (tell_coordinator) {
      created.chunks.push_back((*p)->entry);
      created.initialized.push_back((*p)->initialized ? 1 : 0);
    }
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
  // A coordinator restarted with this task learns its placement back here.
  if (tell_coordinator) coordinator()->ChunksCreated(created);
  Reply(peer, request_id, reply);
}

Result<Param*> Shard::FindForReader(const wire::CreateEntry& entry) {
  const auto& t = entry.tensor;
  Param* p = table_->Find(t.name, entry.chunk_index);
  if (p == nullptr) {
    return Status::NotFound("tensor '" + t.name + "' chunk " + std::to_string(entry.chunk_index) +
                            " is not held by " +
                            TaskId{options_.job, options_.task_index}.ToString() +
                            " (a reader finds tensors; it creates none)");
  }
  const auto& have = p->entry;
  if (have.tensor.dtype != t.dtype || have.tensor.shape != t.shape ||
      have.num_chunks != entry.num_chunks || have.elem_offset != entry.elem_offset ||
      have.elem_count != entry.elem_count) {
    return Status::FailedPrecondition(
        "tensor '" + t.name + "' is held as " +
        DescribeTensor(have.tensor.dtype, have.tensor.shape) + " in " +
        std::to_string(have.num_chunks) + " chunks, but a reader asked for " +
        DescribeTensor(t.dtype, t.shape) + " in " + std::to_string(entry.num_chunks));
  }
  return p;
}

void Shard::OnSetHyper(Peer& peer, uint64_t request_id, const wire::SetHyper& msg) {
  if (peer.hello.task_index != 0) {
    return sessions_->SendError(peer, request_id,
                                Status::PermissionDenied(peer.hello.task + " is not the chief"));
  }
  for (uint32_t key : msg.key_ids) {
    if (table_->Find(key) == nullptr) {
      return sessions_->SendError(
          peer, request_id,
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
