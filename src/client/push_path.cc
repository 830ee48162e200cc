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
      counts_.dropped_stale++;
      why = DroppedChunk::Why::kStale;
    } else if (outcomes[i] == static_cast<uint8_t>(wire::PushOutcome::kDuplicate)) {
      counts_.dropped_duplicate++;
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
    counts_.gpu_inline_bytes += io.chunk->bytes;
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
