// The shard's life (open, serve, stop), its memory, its requests by opcode,
// creates and hyper-parameters. The rest of the shard: shard_workers (a
// worker's arrival and end), shard_apply (pushes), shard_pull (pulls,
// leases), shard_state (optimizer state), shard_checkpoint (joins, restore,
// checkpoint rounds), shard_status.
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

Shard::~Shard() = default;

Status Shard::Open() {
  TESSERA_RETURN_IF_ERROR(OpenMemory());
  TESSERA_RETURN_IF_ERROR(SetMemoryBudget());
  table_ = std::make_unique<ParamTable>(ctx_, memory_.get(), arena_kind_, options_.arena_bytes,
                                        options_.cluster.num_workers());
  waits_.emplace(*table_, *lent_.roster, options_.cluster);
  checkpoints_ = std::make_unique<CheckpointParticipant>(
      *table_, *memory_, *ctx_,
      CheckpointParticipant::Options{
          .task = TaskId{"ps", options_.task_index}.ToString(),
          .round_timeout = options_.checkpoint_timeout,
          .send_to_coordinator = [this](MessageBytes f) { SendToCoordinator(std::move(f)); },
          .resumed = [this] { RetryWaiting(); }});
  if (!options_.checkpoint_dir.empty()) {
    // Every ps task writes its own file there: found out now, not when the
    // first round fails (a read-only or missing mount used to go unnoticed
    // until the end of training).
    TESSERA_RETURN_IF_ERROR(ckpt::CheckWritableDirectory(options_.checkpoint_dir));
  }
  if (lent_.hosted == nullptr) OpenCoordinatorLink();
  steps_.emplace(*ctx_, *coordinator());
  return Status::Ok();
}

void Shard::Begin() {
  ctx_->PostAfter(LeaseCheckInterval(), [this] { RevokeExpiredLeases(); });
  if (link_) ctx_->Post([this] { link_->Connect(); });
}

std::string Shard::DescribeMemory() const {
  return memory_->Describe() + (table_->staged() ? ", staged through host memory" : "");
}

bool Shard::Serves(wire::Opcode op) {
  switch (op) {
    case wire::Opcode::kCreate:
    case wire::Opcode::kPush:
    case wire::Opcode::kPull:
    case wire::Opcode::kRelease:
    case wire::Opcode::kSetHyper:
    case wire::Opcode::kGetState:
    case wire::Opcode::kSetState:
    case wire::Opcode::kSyncStep:
      return true;
    default:
      return false;
  }
}

void Shard::OnRequest(Peer& peer, const wire::Header& h, std::span<const uint8_t> frame) {
  // The transport delimits messages, so a body this shard cannot accept
  // (malformed, or valid bytes that say something invalid) costs the
  // authenticated peer that request only: it gets the error, and the
  // connection stays usable.
  auto refused = [&](const Status& st) {
    sessions_->SendError(peer, h.request_id,
                         st.WithContext(std::string(wire::OpcodeName(h.opcode)) + " refused"));
  };
  // The body decoded as Msg and handed to `serve`, or its error.
  auto decoded = [&]<typename Msg>(auto serve) {
    auto m = wire::DecodeBody<Msg>(h, frame);
    if (!m.ok()) return refused(m.status());
    serve(std::move(*m));
  };
  // The same, decoded into a message an earlier call of its kind handed
  // back (`spares`), so that its vectors keep their capacity.
  auto decoded_into_spare = [&]<typename Msg>(Spares<Msg>& spares, auto serve) {
    Msg m = spares.Take();
    Status st = wire::DecodeBodyInto(h, frame, &m);
    if (!st.ok()) {
      spares.Give(std::move(m));
      return refused(st);
    }
    serve(std::move(m));
  };
  switch (h.opcode) {
    case wire::Opcode::kCreate:
      return decoded.operator()<wire::Create>(
          [&](const wire::Create& m) { OnCreate(peer, h.request_id, m); });
    case wire::Opcode::kPush:
      return decoded_into_spare(
          spare_pushes_, [&](wire::Push m) { OnPush(peer, h.request_id, h.flags, std::move(m)); });
    case wire::Opcode::kPull:
      return decoded_into_spare(spare_pulls_,
                                [&](wire::Pull m) { OnPull(peer, h.request_id, std::move(m)); });
    case wire::Opcode::kSetHyper:
      return decoded.operator()<wire::SetHyper>(
          [&](const wire::SetHyper& m) { OnSetHyper(peer, h.request_id, m); });
    case wire::Opcode::kRelease:
      return decoded.operator()<wire::Release>([&](const wire::Release& m) { OnRelease(peer, m); });
    case wire::Opcode::kGetState:
      return decoded.operator()<wire::GetState>(
          [&](const wire::GetState& m) { OnGetState(peer, h.request_id, m); });
    case wire::Opcode::kSetState:
      return decoded.operator()<wire::SetState>(
          [&](const wire::SetState& m) { OnSetState(peer, h.request_id, m); });
    case wire::Opcode::kSyncStep:
      return decoded.operator()<wire::SyncStep>(
          [&](wire::SyncStep) { Reply(peer, h.request_id, wire::StepReply{SyncStepReached()}); });
    default:
      return sessions_->Drop(peer,
                             Status::Internal(std::string(wire::OpcodeName(h.opcode)) +
                                              " routed to the shard, which does not serve it"),
                             h.request_id);
  }
}

Status Shard::OpenMemory() {
  auto spec = ParseMemorySpec(options_.memory);
  if (!spec.ok()) return spec.status();
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

void Shard::StopServing() {
  stopping_ = true;
  if (steps_) steps_->Stop();
  if (link_) link_->Stop();
  if (checkpoints_) checkpoints_->Stop();
  leases_.Clear();
  blocked_pushes_.clear();
  waiting_pulls_.clear();
}

void Shard::JoinWriter() {
  if (checkpoints_) checkpoints_->JoinWriter();
}

void Shard::Release() {
  link_.reset();
  checkpoints_.reset();
  waits_.reset();
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
    if (restorer_ && !(*p)->initialized && (*p)->version == 0 &&
        restorer_->Restore(**p, ApplyTarget())) {
      chunks_restored_++;
    }
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
