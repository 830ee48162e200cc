// The shard's life (open, serve, stop), its requests by opcode, creates and
// hyper-parameters. The rest of the shard: shard_workers (a worker's arrival
// and end), shard_checkpoint (joins, restore, checkpoint rounds),
// shard_status; its units: ShardMemory, PushApplier, PullServer,
// OptimizerStateAccess, CheckpointParticipant.
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

Shard::~Shard() = default;

Status Shard::Open() {
  auto memory = ShardMemory::Open(options_, *ctx_);
  if (!memory.ok()) return memory.status();
  memory_ = std::move(*memory);
  table_ = std::make_unique<ParamTable>(ctx_, &memory_->memory(), memory_->arena_kind(),
                                        options_.arena_bytes, options_.cluster.num_workers());
  checkpoints_ = std::make_unique<CheckpointParticipant>(
      *table_, memory_->memory(), *ctx_,
      CheckpointParticipant::Options{
          .task = TaskId{"ps", options_.task_index}.ToString(),
          .round_timeout = options_.checkpoint_timeout,
          .send_to_coordinator = [this](MessageBytes f) { SendToCoordinator(std::move(f)); },
          .resumed = [this] { RetryWaiting(); }});
  state_.emplace(*table_, memory_->memory(), *sessions_, *checkpoints_);
  if (!options_.checkpoint_dir.empty()) {
    // Every ps task writes its own file there: found out now, not when the
    // first round fails (a read-only or missing mount used to go unnoticed
    // until the end of training).
    TESSERA_RETURN_IF_ERROR(ckpt::CheckWritableDirectory(options_.checkpoint_dir));
  }
  if (lent_.hosted == nullptr) OpenCoordinatorLink();
  steps_.emplace(*ctx_, *coordinator());
  pulls_.emplace(PullServer::Lent{.ctx = ctx_,
                                  .sessions = sessions_,
                                  .table = table_.get(),
                                  .target = memory_->target(),
                                  .lease_timeout = options_.lease_timeout,
                                  .readers_left = [this] { RetryWaiting(); }},
                 *lent_.roster, options_.cluster);
  pushes_.emplace(PushApplier::Lent{.options = &options_,
                                    .sessions = sessions_,
                                    .table = table_.get(),
                                    .target = memory_->target(),
                                    .checkpoints = checkpoints_.get(),
                                    .steps = &*steps_,
                                    .pulls = &*pulls_});
  return Status::Ok();
}

void Shard::Begin() {
  pulls_->Begin();
  if (link_) ctx_->Post([this] { link_->Connect(); });
}

std::string Shard::DescribeMemory() const { return memory_->Describe(); }

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
      return decoded_into_spare(pushes_->spares(), [&](wire::Push m) {
        if (pushes_->Serve(peer, h.request_id, h.flags, std::move(m))) RetryWaiting();
      });
    case wire::Opcode::kPull:
      return decoded_into_spare(pulls_->spares(),
                                [&](wire::Pull m) { OnPull(peer, h.request_id, std::move(m)); });
    case wire::Opcode::kSetHyper:
      return decoded.operator()<wire::SetHyper>(
          [&](const wire::SetHyper& m) { OnSetHyper(peer, h.request_id, m); });
    case wire::Opcode::kRelease:
      return decoded.operator()<wire::Release>([&](const wire::Release& m) {
        if (pulls_->Release(peer, m)) RetryWaiting();
      });
    case wire::Opcode::kGetState:
      return decoded.operator()<wire::GetState>(
          [&](const wire::GetState& m) { state_->Get(peer, h.request_id, m); });
    case wire::Opcode::kSetState:
      return decoded.operator()<wire::SetState>(
          [&](const wire::SetState& m) { state_->Set(peer, h.request_id, m); });
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

void Shard::StopServing() {
  stopping_ = true;
  if (steps_) steps_->Stop();
  if (link_) link_->Stop();
  if (checkpoints_) checkpoints_->Stop();
  if (pulls_) pulls_->Stop();
  if (pushes_) pushes_->Stop();
}

void Shard::JoinWriter() {
  if (checkpoints_) checkpoints_->JoinWriter();
}

void Shard::Release() {
  link_.reset();
  checkpoints_.reset();
  // The push applier and pull server stay, holding nothing but their
  // counters: stats() may read them after the server stopped.
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
    Status room =
        table_->CheckRoom(msg.entries, memory_->budget(), wire::DeclareLimits{}.max_chunks);
    if (!room.ok()) return sessions_->SendError(peer, request_id, room);
  }
  wire::CreateReply reply;
  wire::Join created;  // for the coordinator hosted here
  const bool tell_coordinator = coordinator()->hosted();
  for (const auto& entry : msg.entries) {
    auto p = peer.is_reader ? FindForReader(entry) : table_->Create(entry);
    if (!p.ok()) return sessions_->SendError(peer, request_id, p.status());
    if (restorer_ && !(*p)->initialized && (*p)->version == 0 &&
        restorer_->Restore(**p, memory_->target())) {
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

void Shard::OnPull(Peer& peer, uint64_t request_id, wire::Pull msg) {
  if (Status st = pulls_->CheckKeys(msg); !st.ok()) {
    pulls_->spares().Give(std::move(msg));
    return sessions_->SendError(peer, request_id, st);
  }
  if (pushes_->ResumeForPull(peer, msg)) RetryWaiting();  // what waits for that step
  pulls_->Serve(peer, request_id, std::move(msg));
}

void Shard::RetryWaiting() {
  pushes_->ApplyWaiting();
  pulls_->GrantWaiting();
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
