// Sends one shard's part of a push: its bytes inline in the push message
// when small (inline_route.h), else into the worker's staging slot on the
// shard (copied into the CUDA IPC slot, or put one-sided: slot_push.cc), in
// parts when larger than the slot; then each chunk's outcome, as the shard
// reports it. Loop thread.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "client/call_counters.h"
#include "client/chunk_io.h"
#include "client/future_state.h"
#include "client/gpu_access.h"
#include "client/inline_route.h"
#include "client/ipc_route.h"
#include "client/shard_links.h"
#include "transport/transport.h"
#include "wire/messages.h"

namespace tessera::client {

class PushSender {
 public:
  // `inline_bytes`: the most a push to one shard carries inside its message
  // (ClientOptions::inline_bytes).
  PushSender(ShardLinks& links, GpuAccess& gpu, CallCounters& counts, transport::Context& ctx,
             uint64_t inline_bytes)
      : links_(links),
        gpu_(gpu),
        counts_(counts),
        ctx_(ctx),
        inline_bytes_(inline_bytes),
        inline_(gpu, counts),
        ipc_(gpu, counts) {}

  // Whether a push of these chunks to one shard carries their bytes inside
  // its message.
  bool TravelsInline(const ChunkIos& ios) const {
    if (ios.empty()) return false;
    uint64_t raw = 0;
    for (const auto& io : ios) raw += io.chunk->bytes;
    return raw <= inline_bytes_;
  }
  // Pushes `ios` to `shard`; `op` (may be null) hears of the chunks the
  // shard dropped, `done` of the end and the versions produced.
  void Send(int shard, ChunkIos ios, uint32_t flags, PushStep tag,
            const std::shared_ptr<Future::State>& op, PushDone done);
  // The push message carrying these chunks' bytes (TravelsInline), copied
  // from GPU memory where they are there. The message is this sender's
  // scratch (its vectors keep their capacity): encode it at once.
  Result<const wire::Push*> InlineMessage(const ChunkIos& ios, PushStep tag);

 private:
  struct InParts;
  struct SlotPush;
  // A push larger than the whole staging slot, sent in parts one after
  // another, each within the slot.
  void SendNextPart(const std::shared_ptr<InParts>& parts);
  // The rest of a push too large to travel inline, once `offset` in the
  // shard's staging slot is ours (slot_push.cc).
  void SendThroughSlot(int shard, ChunkIos ios, uint32_t flags, PushStep tag,
                       const std::shared_ptr<Future::State>& op, uint64_t offset,
                       const PushDone& done);
  // Handles a push-reply: each chunk's outcome (NoteOutcomes), then `finish`.
  ReplyFn OnReply(ChunkIos sent, uint64_t step, std::shared_ptr<Future::State> op, PushDone finish);
  // Ok, or the error naming each chunk the shard refused and each it
  // applied, with its version (a batch is applied entry by entry).
  static Status Refusals(const wire::PushReply& reply, const ChunkIo* ios);
  // Counts what the shard did with each pushed chunk, and tells `op` which
  // it dropped.
  void NoteOutcomes(const std::vector<uint8_t>& outcomes, const ChunkIo* ios, uint64_t step,
                    Future::State* op);

  ShardLinks& links_;
  GpuAccess& gpu_;
  CallCounters& counts_;
  transport::Context& ctx_;
  const uint64_t inline_bytes_;
  InlineRoute inline_;
  IpcRoute ipc_;
  // The last push built and the last reply decoded. Each is used up before
  // the next is made (a request is encoded as soon as it is built; a
  // reply's versions are read before anything else runs), so reusing them
  // saves their allocations on every call.
  wire::Push scratch_;
  wire::PushReply reply_scratch_;
};

}  // namespace tessera::client
