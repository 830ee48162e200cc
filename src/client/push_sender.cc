// Sending one shard's part of a push: inline, or through the staging slot
// (slot_push.cc) in parts when larger than it; each chunk's outcome.

#include "client/push_sender.h"

#include <algorithm>

#include "core/bytes.h"

namespace tessera::client {

void PushSender::NoteOutcomes(const std::vector<uint8_t>& outcomes, const ChunkIo* ios,
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

Status PushSender::Refusals(const wire::PushReply& reply, const ChunkIo* ios) {
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

ReplyFn PushSender::OnReply(ChunkIos sent, uint64_t step, std::shared_ptr<Future::State> op,
                            PushDone finish) {
  return [this, step, op = std::move(op), sent = std::move(sent), finish = std::move(finish)](
             const Status& st, const wire::Header& h, std::span<const uint8_t> frame) {
    if (!st.ok()) return finish(st, {});
    wire::PushReply& reply = reply_scratch_;
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

Result<const wire::Push*> PushSender::InlineMessage(const ChunkIos& ios, PushStep tag) {
  wire::Push& msg = scratch_;
  msg.step = tag.step;
  msg.step_parts = tag.parts;
  TESSERA_RETURN_IF_ERROR(inline_.Pack(ios, msg));
  return &msg;
}

// A push larger than its shard's staging slot: the longest run of chunks
// that fits the slot, then (once it is answered and the slot is free again)
// the next. Only the first part counts the step. The call's state comes from
// the pool and each part's completion holds only it, so that the parts
// allocate nothing of their own.
struct PushSender::InParts {
  int shard = 0;
  uint32_t flags = 0;
  PushStep tag;
  std::shared_ptr<Future::State> op;
  PushDone done;
  ChunkIos ios;
  size_t next = 0;  // the first chunk not yet sent
  std::vector<uint64_t, PoolAllocator<uint64_t>> versions;
};

void PushSender::SendNextPart(const std::shared_ptr<InParts>& parts) {
  const uint64_t slot = links_[parts->shard].alloc.size();
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
  Send(parts->shard, std::move(part), parts->flags, tag, parts->op,
       [this, parts](const Status& st, std::span<const uint64_t> v) {
         if (!st.ok()) return parts->done(st, {});
         parts->versions.insert(parts->versions.end(), v.begin(), v.end());
         if (parts->next < parts->ios.size()) return SendNextPart(parts);
         parts->done(Status::Ok(), parts->versions);
       });
}

void PushSender::Send(int shard, ChunkIos ios, uint32_t flags, PushStep tag,
                      const std::shared_ptr<Future::State>& op, PushDone done) {
  const uint64_t step = tag.step;
  ShardLink& s = links_[shard];
  if (!s.dead.ok()) {
    links_.Reconnect(shard);  // fails this call; a later one may succeed
    return done(s.dead, {});
  }
  if (TravelsInline(ios)) {
    // Small: the bytes ride in the push-done itself.
    auto msg = InlineMessage(ios, tag);
    if (!msg.ok()) return done(msg.status(), {});
    links_.Request(shard, **msg, flags, OnReply(std::move(ios), step, op, std::move(done)));
    return;
  }
  if (Status st = gpu_.PathTo(s, ios); !st.ok()) return done(st.WithContext("push"), {});
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
    auto parts = std::allocate_shared<InParts>(PoolAllocator<InParts>());
    parts->shard = shard;
    parts->flags = flags;
    parts->tag = tag;
    parts->op = op;
    parts->done = std::move(done);
    parts->ios = std::move(ios);
    parts->versions.reserve(parts->ios.size());
    return SendNextPart(parts);
  }
  auto offset = s.alloc.Allocate(total);
  if (!offset) {
    // Wait for earlier pushes to this shard to free their staging space.
    s.waiting_for_staging.push_back(
        [this, shard, ios = std::move(ios), flags, tag, op, done]() mutable {
          Send(shard, std::move(ios), flags, tag, op, std::move(done));
        });
    return;
  }
  SendThroughSlot(shard, std::move(ios), flags, tag, op, *offset, done);
}

}  // namespace tessera::client
