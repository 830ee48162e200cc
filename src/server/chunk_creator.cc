#include "server/chunk_creator.h"

#include "core/log.h"
#include "core/node_id.h"
#include "wire/limits.h"

namespace tessera::server {

void ChunkCreator::Serve(Peer& peer, uint64_t request_id, const wire::Create& msg) {
  if (!ready_) {
    // What to restore is known once the coordinator answered.
    held_.emplace_back(peer.ep, request_id, msg);
    return;
  }
  Create(peer, request_id, msg);
}

void ChunkCreator::Ready(const wire::JoinReply& reply) {
  if (!reply.restore_path.empty()) {
    Status st = OpenRestore(reply.restore_path, reply.global_step);
    if (!st.ok()) {
      TLOG_ERROR("cannot restore from {}: {}; tensors start uninitialised", reply.restore_path,
                 st.message());
    }
  }
  ready_ = true;
  auto held = std::move(held_);
  held_.clear();
  for (auto& [ep, request_id, msg] : held) {
    if (Peer* peer = lent_.sessions->Find(ep.get())) Create(*peer, request_id, msg);
  }
}

void ChunkCreator::Create(Peer& peer, uint64_t request_id, const wire::Create& msg) {
  if (!peer.is_reader) {
    // Before any is made: a batch that does not fit takes no memory at all.
    Status room = lent_.table->CheckRoom(msg.entries, lent_.memory->budget(),
                                         wire::DeclareLimits{}.max_chunks);
    if (!room.ok()) return lent_.sessions->SendError(peer, request_id, room);
  }
  wire::CreateReply reply;
  wire::Join created;  // for the coordinator hosted here
  const bool tell_coordinator = lent_.hosted != nullptr;
  for (const auto& entry : msg.entries) {
    auto p = peer.is_reader ? FindForReader(entry) : lent_.table->Create(entry);
    if (!p.ok()) return lent_.sessions->SendError(peer, request_id, p.status());
    if (restorer_ && !(*p)->initialized && (*p)->version == 0 &&
        restorer_->Restore(**p, lent_.memory->target())) {
      chunks_restored_++;
    }
    if (tell_coordinator) {
      created.chunks.push_back((*p)->entry);
      created.initialized.push_back((*p)->initialized ? 1 : 0);
    }
    reply.keys.push_back(
        {(*p)->key_id, (*p)->arena_id, (*p)->arena_offset, (*p)->bytes, (*p)->version});
    if (peer.known_arenas.insert((*p)->arena_id).second) {
      wire::ArenaKey key{(*p)->arena_id, lent_.table->DescribeArena((*p)->arena_id), {}};
      if (peer.ipc_slot != nullptr) {
        auto ipc = lent_.table->ArenaIpcHandle((*p)->arena_id);
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
  tensors_ = lent_.table->size();
  // A coordinator restarted with this task learns its placement back here.
  if (tell_coordinator) lent_.hosted->ChunksCreated(created);
  peer.ep->Send(wire::kProtocolMsg, wire::Encode(reply, request_id));
}

Result<Param*> ChunkCreator::FindForReader(const wire::CreateEntry& entry) {
  const auto& t = entry.tensor;
  Param* p = lent_.table->Find(t.name, entry.chunk_index);
  if (p == nullptr) {
    return Status::NotFound("tensor '" + t.name + "' chunk " + std::to_string(entry.chunk_index) +
                            " is not held by " +
                            TaskId{lent_.options->job, lent_.options->task_index}.ToString() +
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

Status ChunkCreator::OpenRestore(const std::string& path, uint64_t step) {
  auto restorer = ChunkRestorer::Open(path, step,
                                      {.verify_data = false,
                                       .accept_legacy = lent_.options->accept_legacy_checkpoints,
                                       .key = lent_.checkpoint_key});
  if (!restorer.ok()) return restorer.status();
  restorer_ = std::move(*restorer);
  TLOG_INFO("tensors are restored from {} as they are created (sync tensors resume at step {})",
            path, step);
  return Status::Ok();
}

void ChunkCreator::AddStats(ServerStats* s) const {
  s->tensors = tensors_;
  s->chunks_restored = chunks_restored_;
}

}  // namespace tessera::server
