// push_pull: one round trip where a part travels inline, else a push then a
// pull of the version it produced.

#include "client/client_impl.h"

namespace tessera {

void Client::Impl::PushThenPullInline(int shard, const std::vector<ChunkIo>& gradients,
                                      std::vector<ChunkIo> weights,
                                      std::function<void(Status)> done) {
  ShardConn& s = shards_[shard];
  if (!s.dead.ok()) {
    Reconnect(shard);  // fails this call; a later one may succeed
    return done(s.dead);
  }
  auto msg = InlinePush(gradients, PushStep{});
  if (!msg.ok()) return done(msg.status());
  Request(shard, *msg, wire::kFlagThenPull,
          [this, shard, weights = std::move(weights), done = std::move(done)](
              const Status& st, const wire::Header& h, std::span<const uint8_t> frame) mutable {
            if (!st.ok()) return done(st);
            auto reply = wire::DecodeBody<wire::PullReply>(h, frame);
            if (!reply.ok()) return done(reply.status());
            AcceptPullReply(shard, std::move(weights), std::move(*reply), done);
          });
}

Future Client::Impl::PushPull(const std::vector<PushPullItem>& items) {
  std::vector<std::vector<ChunkIo>> push(shards_.size()), pull(shards_.size());
  for (const auto& item : items) {
    auto grad_gpu = OnGpu(item.gradient, item.memory);
    auto weights_gpu = OnGpu(item.weights, item.memory);
    if (!grad_gpu.ok()) return FailedFuture(grad_gpu.status().WithContext("push_pull (gradient)"));
    if (!weights_gpu.ok()) {
      return FailedFuture(weights_gpu.status().WithContext("push_pull (weights)"));
    }
    auto e = Lookup(item.tensor, item.bytes, item.dtype);
    if (!e.ok()) {
      return FailedFuture(
          e.status().WithContext(*grad_gpu ? "push_pull from GPU memory" : "push_pull"));
    }
    if ((*e)->spec.mode.kind == Consistency::kSync) {
      // Its gradient counts towards a step, which push_pull does not carry:
      // the shard would drop it as stale. Refused rather than lost.
      return FailedFuture(Status::InvalidArgument(
          "push_pull of tensor '" + (*e)->spec.name +
          "', which is sync: push it with the worker's step (Push(items, step)), then pull "
          "it after that step (PullItem::AfterStep(..., step + 1))"));
    }
    for (const auto& c : (*e)->chunks) {
      push[c.shard].push_back(
          {&c, const_cast<uint8_t*>(static_cast<const uint8_t*>(item.gradient)) + c.byte_offset, 0,
           0, *e, *grad_gpu});
      pull[c.shard].push_back(
          {&c, static_cast<uint8_t*>(item.weights) + c.byte_offset, 0, 0, nullptr, *weights_gpu});
    }
  }
  auto op = NewOp();
  op->Add(1);
  ctx_->Post([this, op, push = std::move(push), pull = std::move(pull)]() mutable {
    for (size_t s = 0; s < push.size(); ++s) {
      if (push[s].empty()) continue;
      op->Add(1);
      if (TravelsInline(push[s])) {
        // One round trip: the shard answers the push with the weights.
        PushThenPullInline(static_cast<int>(s), push[s], std::move(pull[s]),
                           [op](const Status& st) { op->Finish(st); });
        continue;
      }
      // Larger: the push, then a pull of at least the version it produced.
      PushToShard(static_cast<int>(s), std::move(push[s]), 0, PushStep{}, op,
                  [this, op, s, ios = std::move(pull[s])](const Status& st,
                                                          std::vector<uint64_t> versions) mutable {
                    if (!st.ok()) return op->Finish(st);
                    // Read back at least the version this push produced.
                    for (size_t i = 0; i < ios.size() && i < versions.size(); ++i)
                      ios[i].min_version = versions[i];
                    PullFromShard(static_cast<int>(s), std::move(ios),
                                  [op](const Status& st2) { op->Finish(st2); });
                  });
    }
    op->Finish(Status::Ok());
  });
  return Future(op);
}

}  // namespace tessera
