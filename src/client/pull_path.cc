// The pull path: a pull split by shard, the bytes inline in the reply or
// read one-sided under a lease.

#include <algorithm>
#include <cstring>

#include "client/arena_pull.h"
#include "client/client_impl.h"

namespace tessera {
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

void Client::Impl::PullFromShard(int shard, ChunkIos ios, const PartDone& done) {
  if (const ShardConn& s = shards_[shard]; !s.dead.ok()) {
    // Lost, or being joined again: nothing may go to it before its
    // handshake and re-create are done.
    Reconnect(shard);  // fails this call; a later one may succeed
    return done(s.dead);
  }
  if (Status st = GpuPathTo(shards_[shard], ios); !st.ok()) return done(st.WithContext("pull"));
  wire::Pull& msg = pull_scratch_;  // encoded at once by Request
  msg.entries.clear();
  for (const auto& io : ios) msg.entries.push_back({io.chunk->key_id, io.min_version, io.min_step});
  msg.inline_max = static_cast<uint32_t>(std::min(options_.inline_bytes, wire::kMaxInlineBytes));
  msg.wait_ms = ShardWaitMs(options_.op_timeout);
  Request(shard, msg, 0,
          // `done` copied as a PartDone, not a const one: a const member
          // would make the handler's move a copy, which keeps it off the
          // inline buffer (see core/inline_function.h).
          [this, shard, ios = std::move(ios), done = PartDone(done)](
              const Status& st, const wire::Header& h, std::span<const uint8_t> frame) mutable {
            if (!st.ok()) return done(st);
            wire::PullReply& reply = pull_reply_scratch_;
            if (Status decoded = wire::DecodeBodyInto(h, frame, &reply); !decoded.ok()) {
              return done(decoded);
            }
            AcceptPullReply(shard, std::move(ios), reply, done);
          });
}

void Client::Impl::AcceptPullReply(int shard, ChunkIos ios, const wire::PullReply& reply,
                                   const PartDone& done) {
  if (reply.lease_id == 0) {
    // The bytes came inline: no lease to give back.
    uint64_t total = 0;
    for (const auto& io : ios) total += io.chunk->bytes;
    if (total != reply.data.size()) {
      return done(Status::Internal("inline pull reply of " + std::to_string(reply.data.size()) +
                                   " bytes for " + std::to_string(total)));
    }
    const uint8_t* src = reply.data.data();
    bool to_gpu = false;
    for (const auto& io : ios) {
      if (io.on_gpu) {
        if (Status st2 = GpuCopyAsync(io.local, src, io.chunk->bytes); !st2.ok()) {
          return done(st2.WithContext("pull into GPU memory"));
        }
        counts_.gpu_inline_bytes += io.chunk->bytes;
        to_gpu = true;
      } else {
        std::memcpy(io.local, src, io.chunk->bytes);
      }
      src += io.chunk->bytes;
    }
    // The reply's bytes must stay until the copies are done.
    return done(to_gpu ? GpuWait().WithContext("pull into GPU memory") : Status::Ok());
  }
  ArenaPull::Start(this, shard, std::move(ios), reply.lease_id, done);
}

Future Client::Impl::Pull(const std::vector<PullItem>& items, const CallOptions& call) {
  auto by_shard = SplitByShard(items, "pull", nullptr);
  if (!by_shard.ok()) return FailedFuture(by_shard.status());
  return FanOut(
      std::move(*by_shard),
      [this](int shard, ChunkIos ios, const std::shared_ptr<Future::State>& op) {
        // A pull may always be sent again.
        IssuePart(shard, std::move(ios), op, /*retryable=*/true,
                  [this, shard](ChunkIos part, const PartDone& done) {
                    PullFromShard(shard, std::move(part), done);
                  });
      },
      call);
}

}  // namespace tessera
