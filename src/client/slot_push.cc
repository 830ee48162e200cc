// One push through the worker's staging slot on one shard, once its space
// in the slot is ours. Its chunks take one route: copied into the CUDA IPC
// slot (same node, GPU shard: ipc_route.h), or put one-sided
// (one_sided_moves.h), GPU chunks first copied to host memory where the
// fabric cannot reach GPU memory (host_bounce.h).

#include <algorithm>

#include "client/host_bounce.h"
#include "client/one_sided_moves.h"
#include "client/push_sender.h"
#include "core/bytes.h"

namespace tessera::client {

// What the call's groups and puts share, from the pool (object and count in
// one block): each put's completion holds only this and its group, and so
// stays inside its Completion (no allocation per put).
struct PushSender::SlotPush {
  // Pipelined: the entries go in groups of about kGroupBytes (never
  // splitting a tensor, whose chunks here must apply at once), and each
  // group's push-done is sent as soon as its puts are complete at the shard,
  // so the shard applies one group while the next is still on the wire.
  static constexpr uint64_t kGroupBytes = 1u << 20;
  struct Group {
    wire::Push msg;
    size_t first = 0;  // index of its first entry among `sent`
    int outstanding = 0;
  };
  using Ptr = std::shared_ptr<SlotPush>;
  using GroupPtr = std::shared_ptr<Group>;

  PushSender* sender = nullptr;
  int shard = 0;
  uint32_t flags = 0;
  PushStep tag;
  uint64_t op_id = 0;
  uint64_t offset = 0;  // of its space in the staging slot
  std::shared_ptr<Future::State> op;
  PushDone done;
  size_t groups_left = 0;
  Status status;
  bool finished = false;
  std::vector<uint64_t, PoolAllocator<uint64_t>> versions;
  ChunkIos sent;
  // GPU chunks copied to host memory first (a fabric that cannot reach GPU
  // memory, and the user allowed staging); read by the puts.
  HostBounce bounce;

  // Runs once: when every group is answered, on a failure, or when the shard
  // is lost. Frees the slot's space for the next push waiting for it.
  void Finish(const Status& st, std::span<const uint64_t> result) {
    if (finished) return;
    finished = true;
    ShardLink& conn = sender->links_[shard];
    conn.in_flight.ops.erase(op_id);
    conn.alloc.Free(offset);
    if (!conn.waiting_for_staging.empty()) {
      auto next = std::move(conn.waiting_for_staging.front());
      conn.waiting_for_staging.pop_front();
      next();
    }
    done(st, result);
  }
  void IntoIpcSlot(const Ptr& self);
  std::vector<GroupPtr, PoolAllocator<GroupPtr>> LayOutGroups() const;
  void PutGroup(const Ptr& self, const GroupPtr& g, bool ordered);
  void SendPushDone(const Ptr& self, const GroupPtr& g);
  void OnGroupReply(const Group& g, const wire::Header& h, std::span<const uint8_t> frame);
};

void PushSender::SendThroughSlot(int shard, ChunkIos ios, uint32_t flags, PushStep tag,
                                 const std::shared_ptr<Future::State>& op, uint64_t offset,
                                 const PushDone& done) {
  ShardLink& s = links_[shard];
  auto push = std::allocate_shared<SlotPush>(PoolAllocator<SlotPush>());
  push->sender = this;
  push->shard = shard;
  push->flags = flags;
  push->tag = tag;
  push->op_id = s.in_flight.next_id++;
  push->offset = offset;
  push->op = op;
  push->done = done;
  push->versions.resize(ios.size());
  push->sent = std::move(ios);
  s.in_flight.ops[push->op_id] = [push](const Status& why) { push->Finish(why, {}); };
  if (IpcRoute::SlotMapped(s)) return push->IntoIpcSlot(push);
  if (!gpu_.fabric_reaches()) {
    if (Status st = push->bounce.Down(gpu_, counts_, push->sent); !st.ok()) {
      return push->Finish(st, {});
    }
  }
  auto groups = push->LayOutGroups();
  push->groups_left = groups.size();
  const bool ordered = s.ep->PutsLandBeforeLaterMessages();
  for (const auto& g : groups) push->PutGroup(push, g, ordered);
}

// Same node, GPU shard: copy straight into the mapped slot (from GPU or host
// memory), wait for the copies, then say so in one push-done.
void PushSender::SlotPush::IntoIpcSlot(const Ptr& self) {
  wire::Push msg;
  msg.step = tag.step;
  msg.step_parts = tag.parts;
  uint64_t rel = offset;
  for (const auto& io : sent) {
    msg.entries.push_back({io.chunk->key_id, rel, io.chunk->bytes});
    rel += AlignUp(io.chunk->bytes, 64);
  }
  if (Status st = sender->ipc_.IntoSlot(sender->links_[shard], sent, msg.entries); !st.ok()) {
    return Finish(st, {});
  }
  sender->links_.Request(shard, msg, flags | wire::kFlagIpcSlot,
                         sender->OnReply(std::move(sent), tag.step, op,
                                         [self](const Status& st2, std::span<const uint64_t> v) {
                                           self->Finish(st2, v);
                                         }));
}

// Whole tensors up to about kGroupBytes a group, each entry's place in the
// slot after the one before it.
auto PushSender::SlotPush::LayOutGroups() const -> std::vector<GroupPtr, PoolAllocator<GroupPtr>> {
  std::vector<GroupPtr, PoolAllocator<GroupPtr>> groups;
  uint64_t rel = offset;
  for (size_t i = 0; i < sent.size();) {
    size_t end = i;
    for (uint64_t group_bytes = 0; end < sent.size(); ++end) {
      const bool same_tensor = end > i && sent[end].tensor == sent[end - 1].tensor;
      if (group_bytes >= kGroupBytes && !same_tensor) break;
      group_bytes += sent[end].chunk->bytes;
    }
    auto& g = groups.emplace_back(std::allocate_shared<Group>(PoolAllocator<Group>()));
    g->msg.step = tag.step;
    g->msg.step_parts = groups.size() == 1 ? tag.parts : 0;
    g->first = i;
    g->msg.entries.reserve(end - i);
    for (; i < end; ++i) {
      g->msg.entries.push_back({sent[i].chunk->key_id, rel, sent[i].chunk->bytes});
      rel += AlignUp(sent[i].chunk->bytes, 64);
    }
  }
  return groups;
}

// The group's chunks into the slot (one_sided_moves.h).
//
// The shard reads the slot once the push-done arrives: this group's puts
// (and every earlier one) must have landed by then. On an endpoint that
// serves its stream in order (`ordered`) they have, and the message follows
// the puts at once; elsewhere a flush waits for them first. Either way the
// reply comes after the puts' completions, so the buffers they read
// (`bounce`) outlive them.
void PushSender::SlotPush::PutGroup(const Ptr& self, const GroupPtr& g, bool ordered) {
  ShardLink& s = sender->links_[shard];
  // Ordered: one count for the push-done's turn. Otherwise also one for the
  // flush, and one per put (added as each is issued).
  g->outstanding = ordered ? 1 : 2;
  // The completion of one put, or of a batch. `gathered`: the gather
  // buffer's space it read, given back. It holds what it needs and no more
  // (40 bytes: inside its Completion); `counted` is the group when its
  // push-done waits for this put.
  auto put_done = [&](const uint8_t* gathered) -> transport::Completion {
    if (!ordered) g->outstanding++;
    GroupPtr counted = ordered ? nullptr : g;
    return [self, counted = std::move(counted), gathered](const Status& st) {
      if (gathered != nullptr) self->sender->links_[self->shard].gather.Give(gathered);
      if (!st.ok() && self->status.ok()) self->status = st;
      if (counted && --counted->outstanding == 0) self->SendPushDone(self, counted);
    };
  };
  const auto& entries = g->msg.entries;
  const ChunkIo* ios = &sent[g->first];
  auto at = [&](size_t i) {
    return OneSidedChunk{ios[i].local, entries[i].byte_length, s.staging.get(),
                         entries[i].staging_offset, ios[i].on_gpu};
  };
  ForEachOneSidedMove(
      s, sender->ctx_, entries.size(), at,
      [&](size_t first, size_t end, uint8_t* buffer, uint64_t span,
          const transport::RemoteRegion& region, uint64_t addr) {
        CopyRunIn(buffer, at, first, end);
        s.ep->Put(buffer, span, region, addr, put_done(buffer));
      },
      [&](size_t, std::span<const transport::RmaPiece> pieces,
          const transport::RemoteRegion& region) {
        s.ep->PutMany(pieces, region, put_done(nullptr));
      },
      [](size_t) {});  // the slot is always lent
  auto turn_done = [self, g](const Status& st) {
    if (!st.ok() && self->status.ok()) self->status = st;
    if (--g->outstanding == 0) self->SendPushDone(self, g);
  };
  if (!ordered) s.ep->Flush(turn_done);
  turn_done(Status::Ok());
}

// A group's push-done, once its puts are complete at the shard.
void PushSender::SlotPush::SendPushDone(const Ptr& self, const GroupPtr& g) {
  if (finished) return;
  if (!status.ok()) return Finish(sender->links_[shard].Error(status), {});
  sender->links_.Request(
      shard, g->msg, flags,
      [self, g](const Status& st, const wire::Header& h, std::span<const uint8_t> frame) {
        if (!st.ok()) return self->Finish(st, {});
        self->OnGroupReply(*g, h, frame);
      });
}

void PushSender::SlotPush::OnGroupReply(const Group& g, const wire::Header& h,
                                        std::span<const uint8_t> frame) {
  wire::PushReply& reply = sender->reply_scratch_;
  if (Status decoded = wire::DecodeBodyInto(h, frame, &reply); !decoded.ok()) {
    return Finish(decoded, {});
  }
  if (reply.versions.size() != g.msg.entries.size() ||
      reply.outcomes.size() > g.msg.entries.size()) {
    return Finish(Status::Internal("push reply does not match the request"), {});
  }
  sender->NoteOutcomes(reply.outcomes, &sent[g.first], tag.step, op.get());
  if (Status refused = Refusals(reply, &sent[g.first]); !refused.ok()) {
    return Finish(refused, {});
  }
  std::copy(reply.versions.begin(), reply.versions.end(),
            versions.begin() + static_cast<std::ptrdiff_t>(g.first));
  if (--groups_left == 0) Finish(Status::Ok(), versions);
}

}  // namespace tessera::client
