// push_pull: one round trip where a part travels inline, else a push then a
// pull of the version it produced.

#include "client/client_impl.h"

namespace tessera {

void Client::Impl::PushThenPullInline(int shard, const ChunkIos& gradients, ChunkIos weights,
                                      PartDone done) {
  ShardConn& s = shards_[shard];
  if (!s.dead.ok()) {
    Reconnect(shard);  // fails this call; a later one may succeed
    return done(s.dead);
  }
  if (Status st = InlinePush(gradients, PushStep{}, &push_scratch_); !st.ok()) return done(st);
  Request(shard, push_scratch_, wire::kFlagThenPull,
          [this, shard, weights = std::move(weights), done = std::move(done)](
              const Status& st, const wire::Header& h, std::span<const uint8_t> frame) mutable {
            if (!st.ok()) return done(st);
            wire::PullReply& reply = pull_reply_scratch_;
            if (Status decoded = wire::DecodeBodyInto(h, frame, &reply); !decoded.ok()) {
              return done(decoded);
            }
            AcceptPullReply(shard, std::move(weights), reply, done);
          });
}

Future Client::Impl::PushPull(const std::vector<PushPullItem>& items, const CallOptions& call) {
  if (options_.read_only) return FailedFuture(ReadOnlyRefusal("push_pull"));
  auto by_shard = SplitByShard(items, "push_pull", [](const TensorEntry& e) {
    // Its gradient counts towards a step, which push_pull does not carry:
    // the shard would drop it as stale. Refused rather than lost.
    return Status::InvalidArgument(
        "push_pull of tensor '" + e.decl.name +
        "', which is sync: push it with the worker's step (Push(items, step)), then pull it "
        "after that step (PullItem::AfterStep(..., step + 1))");
  });
  if (!by_shard.ok()) return FailedFuture(by_shard.status());
  return FanOut(
      std::move(*by_shard),
      [this](int shard, ChunkIos push, const std::shared_ptr<Future::State>& op) {
        auto done = [op](const Status& st) { op->Finish(st); };
        // The same chunks, read back into the weights' buffer.
        ChunkIos pull;
        pull.reserve(push.size());
        for (const auto& io : push)
          pull.push_back({io.chunk, io.out, 0, 0, io.tensor, io.out_on_gpu});
        if (TravelsInline(push)) {
          // One round trip: the shard answers the push with the weights.
          return PushThenPullInline(shard, push, std::move(pull), done);
        }
        // Larger: the push, then a pull of at least the version it produced.
        PushToShard(shard, std::move(push), 0, PushStep{}, op,
                    [this, shard, pull = std::move(pull), done](
                        const Status& st, std::span<const uint64_t> versions) mutable {
                      if (!st.ok()) return done(st);
                      for (size_t i = 0; i < pull.size() && i < versions.size(); ++i) {
                        pull[i].min_version = versions[i];
                      }
                      PullFromShard(shard, std::move(pull), done);
                    });
      },
      call);
}

}  // namespace tessera
