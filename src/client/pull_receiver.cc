// A pull's part on one shard: asked for, and its reply's bytes landed.

#include "client/pull_receiver.h"

#include <algorithm>

#include "client/arena_pull.h"

namespace tessera::client {
namespace {

// How long a shard may hold a pull before answering what it still waits for
// (who has not pushed a sync step): a little less than the op timeout, so
// that its answer, not the bare timeout, reaches the caller.
uint32_t ShardWaitMs(std::chrono::milliseconds op_timeout) {
  const auto margin =
      std::clamp(op_timeout / 5, std::chrono::milliseconds(10), std::chrono::milliseconds(2000));
  const auto wait = std::max(op_timeout - margin, std::chrono::milliseconds(1));
  return static_cast<uint32_t>(std::min<int64_t>(wait.count(), UINT32_MAX));
}

}  // namespace

PullReceiver::PullReceiver(ShardLinks& links, GpuAccess& gpu, CallCounters& counts,
                           transport::Context& ctx, uint64_t inline_bytes,
                           std::chrono::milliseconds op_timeout)
    : links_(links),
      gpu_(gpu),
      counts_(counts),
      ctx_(ctx),
      inline_max_(static_cast<uint32_t>(std::min(inline_bytes, wire::kMaxInlineBytes))),
      wait_ms_(ShardWaitMs(op_timeout)),
      inline_(gpu, counts),
      ipc_(gpu, counts) {}

bool PullReceiver::Reachable(int shard, const PartDone& done) {
  const ShardLink& s = links_[shard];
  if (s.dead.ok()) return true;
  // Lost, or being joined again: nothing may go to it before its handshake
  // and re-create are done.
  links_.Reconnect(shard);  // fails this call; a later one may succeed
  done(s.dead);
  return false;
}

void PullReceiver::Pull(int shard, ChunkIos ios, const PartDone& done) {
  if (!Reachable(shard, done)) return;
  if (Status st = gpu_.PathTo(links_[shard], ios); !st.ok()) return done(st.WithContext("pull"));
  wire::Pull& msg = scratch_;  // encoded at once by Request
  msg.entries.clear();
  for (const auto& io : ios) msg.entries.push_back({io.chunk->key_id, io.min_version, io.min_step});
  msg.inline_max = inline_max_;
  msg.wait_ms = wait_ms_;
  links_.Request(shard, msg, 0, OnReply(shard, std::move(ios), done));
}

void PullReceiver::PushThenPull(int shard, const wire::Push& push, ChunkIos weights,
                                PartDone done) {
  if (!Reachable(shard, done)) return;
  links_.Request(shard, push, wire::kFlagThenPull,
                 OnReply(shard, std::move(weights), std::move(done)));
}

ReplyFn PullReceiver::OnReply(int shard, ChunkIos ios, PartDone done) {
  return [this, shard, ios = std::move(ios), done = std::move(done)](
             const Status& st, const wire::Header& h, std::span<const uint8_t> frame) mutable {
    if (!st.ok()) return done(st);
    wire::PullReply& reply = reply_scratch_;
    if (Status decoded = wire::DecodeBodyInto(h, frame, &reply); !decoded.ok()) {
      return done(decoded);
    }
    Accept(shard, std::move(ios), reply, done);
  };
}

void PullReceiver::Accept(int shard, ChunkIos ios, const wire::PullReply& reply,
                          const PartDone& done) {
  // Inline: no lease to give back.
  if (reply.lease_id == 0) return done(inline_.Unpack(ios, reply.data));
  ArenaPull::Start(this, shard, std::move(ios), reply.lease_id, done);
}

}  // namespace tessera::client
