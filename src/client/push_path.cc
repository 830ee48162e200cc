// The push path: a push split by shard, its bytes inline or put one-sided
// into the staging slot, the outcome of each chunk.

#include <algorithm>
#include <cstring>

#include "client/client_impl.h"
#include "core/bytes.h"

namespace tessera {

void Client::Impl::NoteOutcomes(const std::vector<uint8_t>& outcomes, const ChunkIo* ios,
                                uint64_t step, Future::State* op) {
  for (size_t i = 0; i < outcomes.size(); ++i) {
    DroppedChunk::Why why;
    if (outcomes[i] == static_cast<uint8_t>(wire::PushOutcome::kStale)) {
      dropped_stale_++;
      why = DroppedChunk::Why::kStale;
    } else if (outcomes[i] == static_cast<uint8_t>(wire::PushOutcome::kDuplicate)) {
      dropped_duplicate_++;
      why = DroppedChunk::Why::kDuplicate;
    } else {
      continue;
    }
    if (op == nullptr) continue;
    const ChunkIo& io = ios[i];
    std::lock_guard<std::mutex> lock(op->mu);
    op->dropped.push_back({io.tensor->decl.name,
                           static_cast<uint32_t>(io.chunk - io.tensor->chunks.data()), step, why});
  }
}

Status Client::Impl::Refusals(const wire::PushReply& reply, const ChunkIo* ios) {
  if (reply.refusals.empty()) return Status::Ok();
  auto name = [&](size_t i) {
    const ChunkIo& io = ios[i];
    return "'" + io.tensor->decl.name + "' chunk " +
           std::to_string(io.chunk - io.tensor->chunks.data());
  };
  std::string why = std::to_string(reply.refusals.size()) + " of " +
                    std::to_string(reply.outcomes.size()) + " chunks of this push refused: ";
  for (size_t i = 0; i < reply.refusals.size(); ++i) {
    const auto& r = reply.refusals[i];
    why += (i ? "; " : "") + name(r.index) + ": " + r.message;
  }
  why += ". Applied:";
  for (size_t i = 0; i < reply.outcomes.size(); ++i) {
    if (reply.outcomes[i] == static_cast<uint8_t>(wire::PushOutcome::kRefused)) continue;
    why += " " + name(i) + " (version " + std::to_string(reply.versions[i]) + ")";
  }
  return Status(reply.refusals.front().code, why);
}

Client::Impl::ReplyFn Client::Impl::OnPushReply(ChunkIos sent, uint64_t step,
                                                std::shared_ptr<Future::State> op,
                                                PushDone finish) {
  return [this, step, op = std::move(op), sent = std::move(sent), finish = std::move(finish)](
             const Status& st, const wire::Header& h, std::span<const uint8_t> frame) {
    if (!st.ok()) return finish(st, {});
    wire::PushReply& reply = push_reply_scratch_;
    if (Status decoded = wire::DecodeBodyInto(h, frame, &reply); !decoded.ok()) {
      return finish(decoded, {});
    }
    if (reply.outcomes.size() > sent.size()) {
      return finish(Status::Internal("push reply does not match the request"), {});
    }
    NoteOutcomes(reply.outcomes, sent.data(), step, op.get());
    if (Status refused = Refusals(reply, sent.data()); !refused.ok()) return finish(refused, {});
    finish(Status::Ok(), reply.versions);
  };
}

Status Client::Impl::InlinePush(const ChunkIos& ios, PushStep tag, wire::Push* out) {
  uint64_t raw = 0;
  for (const auto& io : ios) raw += io.chunk->bytes;
  wire::Push& msg = *out;
  msg.step = tag.step;
  msg.step_parts = tag.parts;
  // Both lists sized once (the scratch message keeps their capacity), then
  // filled in place: a batch of small tensors costs a copy each, no more.
  msg.entries.resize(ios.size());
  msg.payload.resize(raw);
  bool from_gpu = false;
  uint64_t at = 0;
  for (size_t i = 0; i < ios.size(); ++i) {
    const ChunkIo& io = ios[i];
    msg.entries[i] = {io.chunk->key_id, at, io.chunk->bytes};
    uint8_t* into = msg.payload.data() + at;
    at += io.chunk->bytes;
    if (!io.on_gpu) {
      std::memcpy(into, io.local, io.chunk->bytes);
      continue;
    }
    if (Status st = GpuCopyAsync(into, io.local, io.chunk->bytes); !st.ok()) {
      return st.WithContext("push from GPU memory");
    }
    gpu_inline_bytes_ += io.chunk->bytes;
    from_gpu = true;
  }
  if (from_gpu) TESSERA_RETURN_IF_ERROR(GpuWait().WithContext("push from GPU memory"));
  return Status::Ok();
}

// A push larger than its shard's staging slot: the longest run of chunks
// that fits the slot, then (once it is answered and the slot is free again)
// the next. Only the first part counts the step. The call's state comes from
// the pool and each part's completion holds only it, so that the parts
// allocate nothing of their own.
struct Client::Impl::PushInParts {
  int shard = 0;
  uint32_t flags = 0;
  PushStep tag;
  std::shared_ptr<Future::State> op;
  PushDone done;
  ChunkIos ios;
  size_t next = 0;  // the first chunk not yet sent
  std::vector<uint64_t, PoolAllocator<uint64_t>> versions;
};

void Client::Impl::PushNextPart(const std::shared_ptr<PushInParts>& parts) {
  const uint64_t slot = shards_[parts->shard].alloc.size();
  ChunkIos part;
  uint64_t used = 0;
  size_t end = parts->next;
  for (; end < parts->ios.size(); ++end) {
    const uint64_t b = AlignUp(parts->ios[end].chunk->bytes, 64);
    if (used + b > slot) break;
    used += b;
  }
  part.assign(parts->ios.begin() + static_cast<std::ptrdiff_t>(parts->next),
              parts->ios.begin() + static_cast<std::ptrdiff_t>(end));
  const PushStep tag{parts->tag.step, parts->next == 0 ? parts->tag.parts : 0};
  parts->next = end;
  PushToShard(parts->shard, std::move(part), parts->flags, tag, parts->op,
              [this, parts](const Status& st, std::span<const uint64_t> v) {
                if (!st.ok()) return parts->done(st, {});
                parts->versions.insert(parts->versions.end(), v.begin(), v.end());
                if (parts->next < parts->ios.size()) return PushNextPart(parts);
                parts->done(Status::Ok(), parts->versions);
              });
}

void Client::Impl::PushToShard(int shard, ChunkIos ios, uint32_t flags, PushStep tag,
                               const std::shared_ptr<Future::State>& op, PushDone done) {
  const uint64_t step = tag.step;
  ShardConn& s = shards_[shard];
  if (!s.dead.ok()) {
    Reconnect(shard);  // fails this call; a later one may succeed
    return done(s.dead, {});
  }
  if (TravelsInline(ios)) {
    // Small: the bytes ride in the push-done itself.
    if (Status st = InlinePush(ios, tag, &push_scratch_); !st.ok()) return done(st, {});
    Request(shard, push_scratch_, flags, OnPushReply(std::move(ios), step, op, std::move(done)));
    return;
  }
  if (Status st = GpuPathTo(s, ios); !st.ok()) return done(st.WithContext("push"), {});
  uint64_t total = 0;
  for (const auto& io : ios) total += AlignUp(io.chunk->bytes, 64);
  if (total > s.alloc.size()) {
    // Larger than the whole slot: in parts, each within the slot.
    for (const auto& io : ios) {
      if (AlignUp(io.chunk->bytes, 64) > s.alloc.size()) {
        return done(Status::InvalidArgument("a chunk of " + std::to_string(io.chunk->bytes) +
                                            " bytes exceeds the staging slot on " + s.name()),
                    {});
      }
    }
    auto parts = std::allocate_shared<PushInParts>(PoolAllocator<PushInParts>());
    parts->shard = shard;
    parts->flags = flags;
    parts->tag = tag;
    parts->op = op;
    parts->done = std::move(done);
    parts->ios = std::move(ios);
    parts->versions.reserve(parts->ios.size());
    return PushNextPart(parts);
  }
  auto offset = s.alloc.Allocate(total);
  if (!offset) {
    // Wait for earlier pushes to this shard to free their staging space.
    s.waiting_for_staging.push_back(
        [this, shard, ios = std::move(ios), flags, tag, op, done]() mutable {
          PushToShard(shard, std::move(ios), flags, tag, op, std::move(done));
        });
    return;
  }
  PushThroughSlot(shard, std::move(ios), flags, tag, op, *offset, done);
}

void Client::Impl::PushThroughSlot(int shard, ChunkIos ios, uint32_t flags, PushStep tag,
                                   const std::shared_ptr<Future::State>& op, uint64_t offset,
                                   const PushDone& done) {
  const uint64_t step = tag.step;
  ShardConn& s = shards_[shard];
  // Pipelined: the entries go in groups of about kGroupBytes (never splitting
  // a tensor, whose chunks here must apply at once), and each group's
  // push-done is sent as soon as its puts are complete at the shard, so the
  // shard applies one group while the next is still on the wire.
  constexpr uint64_t kGroupBytes = 1u << 20;
  struct Group {
    wire::Push msg;
    size_t first = 0;  // index of its first entry among `ios`
    int outstanding = 0;
    // Sends its push-done (below), held here so that a put's completion
    // need only hold the group.
    InlineFunction<void(const std::shared_ptr<Group>&), 64> send;
  };
  // What the call's groups and puts share, from the pool (object and count
  // in one block): each put's completion holds only `this`, this and its
  // group, and so stays inside its Completion (no allocation per put).
  struct Progress {
    size_t groups_left = 0;
    Status status;
    bool finished = false;
    int shard = 0;
    uint32_t flags = 0;
    uint64_t step = 0;
    uint64_t op_id = 0;
    uint64_t offset = 0;
    std::shared_ptr<Future::State> op;
    PushDone done;
    std::vector<uint64_t, PoolAllocator<uint64_t>> versions;
    ChunkIos sent;  // `ios`, once the groups are laid out
    // GPU chunks copied to host memory first (a fabric that cannot reach
    // GPU memory, and the user allowed staging); read by the puts.
    std::vector<uint8_t> bounce;
  };
  auto progress = std::allocate_shared<Progress>(PoolAllocator<Progress>());
  progress->shard = shard;
  progress->flags = flags;
  progress->step = step;
  progress->op_id = s.next_op++;
  progress->offset = offset;
  progress->op = op;
  progress->done = done;
  progress->versions.resize(ios.size());
  const uint64_t base = s.staging->base();
  // Runs once: when every group is answered, on a failure, or when the shard
  // is lost.
  auto finish = [this, progress](const Status& st, std::span<const uint64_t> versions) {
    if (progress->finished) return;
    progress->finished = true;
    ShardConn& conn = shards_[progress->shard];
    conn.in_flight.erase(progress->op_id);
    conn.alloc.Free(progress->offset);
    if (!conn.waiting_for_staging.empty()) {
      auto next = std::move(conn.waiting_for_staging.front());
      conn.waiting_for_staging.pop_front();
      next();
    }
    progress->done(st, versions);
  };
  s.in_flight[progress->op_id] = [finish](const Status& why) { finish(why, {}); };

  if (s.ipc_slot.data() != nullptr) {
    // Same node, GPU shard: copy straight into the mapped slot (from GPU or
    // host memory), wait for the copies, then say so in one push-done.
    wire::Push msg;
    msg.step = step;
    msg.step_parts = tag.parts;
    uint64_t rel = offset, bytes = 0;
    Status st;
    for (const auto& io : ios) {
      msg.entries.push_back({io.chunk->key_id, rel, io.chunk->bytes});
      if (st.ok()) st = GpuCopyAsync(s.ipc_slot.data() + rel, io.local, io.chunk->bytes);
      rel += AlignUp(io.chunk->bytes, 64);
      bytes += io.chunk->bytes;
    }
    if (st.ok()) st = GpuWait();
    if (!st.ok())
      return finish(st.WithContext("copying into the CUDA IPC slot of " + s.name()), {});
    ipc_bytes_ += bytes;
    Request(shard, msg, flags | wire::kFlagIpcSlot,
            OnPushReply(std::move(ios), step, op,
                        [finish](const Status& st2, std::span<const uint64_t> versions) {
                          finish(st2, versions);
                        }));
    return;
  }
  if (!fabric_gpu_.ok()) {
    uint64_t need = 0;
    for (const auto& io : ios) need += io.on_gpu ? io.chunk->bytes : 0;
    if (need > 0) {
      progress->bounce.resize(need);
      uint64_t at = 0;
      Status st;
      for (auto& io : ios) {
        if (!io.on_gpu) continue;
        uint8_t* host = progress->bounce.data() + at;
        if (st.ok()) st = GpuCopyAsync(host, io.local, io.chunk->bytes);
        io.local = host;
        at += io.chunk->bytes;
      }
      if (st.ok()) st = GpuWait();
      if (!st.ok()) return finish(st.WithContext("staging a GPU buffer through host memory"), {});
      staged_bytes_ += need;
    }
  }

  progress->sent = std::move(ios);
  const ChunkIos& sent = progress->sent;
  std::vector<std::shared_ptr<Group>, PoolAllocator<std::shared_ptr<Group>>> groups;
  uint64_t rel = offset;
  for (size_t i = 0; i < sent.size();) {
    // A group: whole tensors up to about kGroupBytes, its entries' list
    // sized at once.
    size_t end = i;
    for (uint64_t group_bytes = 0; end < sent.size(); ++end) {
      const bool same_tensor = end > i && sent[end].tensor == sent[end - 1].tensor;
      if (group_bytes >= kGroupBytes && !same_tensor) break;
      group_bytes += sent[end].chunk->bytes;
    }
    auto& g = groups.emplace_back(std::allocate_shared<Group>(PoolAllocator<Group>()));
    g->msg.step = step;
    g->msg.step_parts = groups.size() == 1 ? tag.parts : 0;
    g->first = i;
    g->msg.entries.reserve(end - i);
    for (; i < end; ++i) {
      g->msg.entries.push_back({sent[i].chunk->key_id, rel, sent[i].chunk->bytes});
      rel += AlignUp(sent[i].chunk->bytes, 64);
    }
  }
  progress->groups_left = groups.size();
  // A group's push-done, once its puts are complete at the shard.
  auto send = [this, progress, finish](const std::shared_ptr<Group>& g) {
    if (progress->finished) return;
    const int to = progress->shard;
    if (!progress->status.ok()) return finish(ShardError(to, progress->status), {});
    Request(to, g->msg, progress->flags,
            [this, progress, finish, g](const Status& st, const wire::Header& h,
                                        std::span<const uint8_t> frame) {
              if (!st.ok()) return finish(st, {});
              wire::PushReply& reply = push_reply_scratch_;
              if (Status decoded = wire::DecodeBodyInto(h, frame, &reply); !decoded.ok()) {
                return finish(decoded, {});
              }
              if (reply.versions.size() != g->msg.entries.size() ||
                  reply.outcomes.size() > g->msg.entries.size()) {
                return finish(Status::Internal("push reply does not match the request"), {});
              }
              NoteOutcomes(reply.outcomes, &progress->sent[g->first], progress->step,
                           progress->op.get());
              if (Status refused = Refusals(reply, &progress->sent[g->first]); !refused.ok()) {
                return finish(refused, {});
              }
              std::copy(reply.versions.begin(), reply.versions.end(),
                        progress->versions.begin() + static_cast<std::ptrdiff_t>(g->first));
              if (--progress->groups_left == 0) finish(Status::Ok(), progress->versions);
            });
  };
  // The shard reads the slot once the push message arrives: this group's
  // puts (and every earlier one) must have landed by then. On an endpoint
  // that serves its stream in order they have, and the message follows the
  // puts at once; elsewhere a flush waits for them first. Either way the
  // reply comes after the puts' completions, so the buffers they read
  // (`progress->bounce`, if any) outlive them.
  const bool ordered = s.ep->PutsLandBeforeLaterMessages();
  for (const auto& g : groups) {
    // Ordered: one count for the push-done's turn. Otherwise also one for
    // the flush, and one per put (added as each is issued: how many there
    // are depends on what could be gathered).
    g->outstanding = ordered ? 1 : 2;
    g->send = send;
    auto one_done = [progress, g](const Status& st) {
      if (!st.ok() && progress->status.ok()) progress->status = st;
      if (--g->outstanding == 0) g->send(g);
    };
    // The completion of one put, or of the group's puts not gathered (one
    // PutMany). `gathered`: the gather buffer's space the put reads, given
    // back once it completed. It holds what it needs and no more (48 bytes:
    // kept inside its Completion, no allocation per put); `counted` is the
    // group when its push-done waits for this put.
    auto put_done = [&](const uint8_t* gathered) -> transport::Completion {
      if (!ordered) g->outstanding++;
      std::shared_ptr<Group> counted = ordered ? nullptr : g;
      return [this, progress, counted = std::move(counted), gathered](const Status& st) {
        if (gathered != nullptr) shards_[progress->shard].gather.Give(gathered);
        if (!st.ok() && progress->status.ok()) progress->status = st;
        if (counted && --counted->outstanding == 0) counted->send(counted);
      };
    };
    // Chunks that go as they are: one batch, so that a fabric that copies
    // them itself copies them back to back (Endpoint::PutMany).
    std::vector<transport::RmaPiece, PoolAllocator<transport::RmaPiece>> pieces;
    const auto& entries = g->msg.entries;
    pieces.reserve(entries.size());
    const uint64_t gather_up_to = s.ep->GatherUpTo();
    for (size_t k = 0; k < entries.size();) {
      // A run of small host chunks, side by side in the slot, travels as one
      // put from the gather buffer: the bytes between them are padding the
      // shard never reads.
      const auto run = client::GatherBuffer::RunFrom(
          k, entries.size(), gather_up_to, [&](size_t i) -> std::optional<client::PeerSpan> {
            if (sent[g->first + i].on_gpu) return std::nullopt;
            return client::PeerSpan{entries[i].staging_offset, entries[i].byte_length};
          });
      uint8_t* gathered = run.end - k >= 2 ? s.gather.Take(*ctx_, run.span) : nullptr;
      if (gathered == nullptr) {
        pieces.push_back(
            {sent[g->first + k].local, entries[k].byte_length, base + entries[k].staging_offset});
        ++k;
        continue;
      }
      for (size_t i = k; i < run.end; ++i) {
        std::memcpy(gathered + (entries[i].staging_offset - entries[k].staging_offset),
                    sent[g->first + i].local, entries[i].byte_length);
      }
      s.ep->Put(gathered, run.span, *s.staging, base + entries[k].staging_offset,
                put_done(gathered));
      k = run.end;
    }
    if (!pieces.empty()) s.ep->PutMany(pieces, *s.staging, put_done(nullptr));
    if (ordered) {
      one_done(Status::Ok());
    } else {
      s.ep->Flush(one_done);
      one_done(Status::Ok());
    }
  }
}

Future Client::Impl::Push(const std::vector<PushItem>& items, uint32_t flags,
                          std::optional<uint64_t> tagged_step, const CallOptions& call) {
  if (options_.read_only) return FailedFuture(ReadOnlyRefusal("push"));
  const uint64_t step = tagged_step.value_or(0);
  // Untagged, a sync push would count as step 0, and the worker's real
  // step-0 push would then be dropped as stale.
  RefuseSync refuse_untagged = [](const TensorEntry& e) {
    return Status::InvalidArgument(
        "push to tensor '" + e.decl.name + "', which is " + ConsistencyName(e.decl.mode.kind) +
        ", without a step: use Push(items, step) with the worker's step");
  };
  const bool sync_allowed = tagged_step || (flags & wire::kFlagInit);
  auto by_shard = SplitByShard(items, "push", sync_allowed ? nullptr : refuse_untagged);
  if (!by_shard.ok()) return FailedFuture(by_shard.status());
  // The shards count the global step (never the chief's init): an async
  // push on the part to its lowest-numbered shard, a sync push on every part
  // holding a sync tensor, each saying how many there are.
  auto holds_sync = [](const ChunkIos& ios) {
    return std::any_of(ios.begin(), ios.end(), [](const ChunkIo& io) {
      return io.tensor->decl.mode.kind == Consistency::kSync;
    });
  };
  auto all_sync = [](const ChunkIos& ios) {
    return std::all_of(ios.begin(), ios.end(), [](const ChunkIo& io) {
      return io.tensor->decl.mode.kind == Consistency::kSync;
    });
  };
  const bool counts = !(flags & wire::kFlagInit);
  const auto sync_parts =
      static_cast<uint32_t>(std::count_if(by_shard->begin(), by_shard->end(), holds_sync));
  const auto first = static_cast<int>(
      std::find_if(by_shard->begin(), by_shard->end(), [](const auto& l) { return !l.empty(); }) -
      by_shard->begin());
  return FanOut(
      std::move(*by_shard),
      [this, flags, step, counts, sync_parts, first, holds_sync, all_sync](
          int shard, ChunkIos ios, const std::shared_ptr<Future::State>& op) {
        uint32_t parts = 0;
        if (counts) parts = sync_parts > 0 ? (holds_sync(ios) ? sync_parts : 0) : shard == first;
        // A step's second push of a sync chunk is dropped as a duplicate;
        // any other push may have been applied before the shard was lost.
        const bool retryable = counts && all_sync(ios);
        IssuePart(
            shard, std::move(ios), op, retryable,
            [this, shard, flags, tag = PushStep{step, parts}, op](ChunkIos part, PartDone done) {
              PushToShard(shard, std::move(part), flags, tag, op,
                          [done = std::move(done)](const Status& st, std::span<const uint64_t>) {
                            done(st);
                          });
            });
      },
      call);
}

}  // namespace tessera
