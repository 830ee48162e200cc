// The data calls: a call's items split by shard, then each shard's part
// issued (FanOut) and moved (PushSender, PullReceiver).

#include <algorithm>

#include "client/client_impl.h"
#include "client/split_by_shard.h"

namespace tessera {

Future Client::Impl::Push(const std::vector<PushItem>& items, uint32_t flags,
                          std::optional<uint64_t> tagged_step, const CallOptions& call) {
  if (options_.read_only) return FailedFuture(ReadOnlyRefusal("push"));
  const uint64_t step = tagged_step.value_or(0);
  // Untagged, a sync push would count as step 0, and the worker's real
  // step-0 push would then be dropped as stale.
  client::RefuseSync refuse_untagged = [](const client::TensorEntry& e) {
    return Status::InvalidArgument(
        "push to tensor '" + e.decl.name + "', which is " + ConsistencyName(e.decl.mode.kind) +
        ", without a step: use Push(items, step) with the worker's step");
  };
  const bool sync_allowed = tagged_step || (flags & wire::kFlagInit);
  auto by_shard = client::SplitByShard(tensors_, links_->size(), items, "push",
                                       sync_allowed ? nullptr : refuse_untagged);
  if (!by_shard.ok()) return FailedFuture(by_shard.status());
  // The shards count the global step (never the chief's init): an async
  // push on the part to its lowest-numbered shard, a sync push on every part
  // holding a sync tensor, each saying how many there are.
  auto holds_sync = [](const client::ChunkIos& ios) {
    return std::any_of(ios.begin(), ios.end(), [](const client::ChunkIo& io) {
      return io.tensor->decl.mode.kind == Consistency::kSync;
    });
  };
  auto all_sync = [](const client::ChunkIos& ios) {
    return std::all_of(ios.begin(), ios.end(), [](const client::ChunkIo& io) {
      return io.tensor->decl.mode.kind == Consistency::kSync;
    });
  };
  const bool counts = !(flags & wire::kFlagInit);
  const auto sync_parts =
      static_cast<uint32_t>(std::count_if(by_shard->begin(), by_shard->end(), holds_sync));
  const auto first = static_cast<int>(
      std::find_if(by_shard->begin(), by_shard->end(), [](const auto& l) { return !l.empty(); }) -
      by_shard->begin());
  return fan_out_->Start(
      std::move(*by_shard),
      [this, flags, step, counts, sync_parts, first, holds_sync, all_sync](
          int shard, client::ChunkIos ios, const std::shared_ptr<Future::State>& op) {
        uint32_t parts = 0;
        if (counts) parts = sync_parts > 0 ? (holds_sync(ios) ? sync_parts : 0) : shard == first;
        // A step's second push of a sync chunk is dropped as a duplicate;
        // any other push may have been applied before the shard was lost.
        const bool retryable = counts && all_sync(ios);
        fan_out_->IssuePart(shard, std::move(ios), op, retryable,
                            [this, shard, flags, tag = client::PushStep{step, parts}, op](
                                client::ChunkIos part, client::PartDone done) {
                              sender_->Send(
                                  shard, std::move(part), flags, tag, op,
                                  [done = std::move(done)](
                                      const Status& st, std::span<const uint64_t>) { done(st); });
                            });
      },
      call);
}

Future Client::Impl::Pull(const std::vector<PullItem>& items, const CallOptions& call) {
  auto by_shard = client::SplitByShard(tensors_, links_->size(), items, "pull", nullptr);
  if (!by_shard.ok()) return FailedFuture(by_shard.status());
  return fan_out_->Start(
      std::move(*by_shard),
      [this](int shard, client::ChunkIos ios, const std::shared_ptr<Future::State>& op) {
        // A pull may always be sent again.
        fan_out_->IssuePart(shard, std::move(ios), op, /*retryable=*/true,
                            [this, shard](client::ChunkIos part, const client::PartDone& done) {
                              receiver_->Pull(shard, std::move(part), done);
                            });
      },
      call);
}

Future Client::Impl::PushPull(const std::vector<PushPullItem>& items, const CallOptions& call) {
  if (options_.read_only) return FailedFuture(ReadOnlyRefusal("push_pull"));
  auto by_shard = client::SplitByShard(
      tensors_, links_->size(), items, "push_pull", [](const client::TensorEntry& e) {
        // Its gradient counts towards a step, which push_pull does not carry:
        // the shard would drop it as stale. Refused rather than lost.
        return Status::InvalidArgument(
            "push_pull of tensor '" + e.decl.name +
            "', which is sync: push it with the worker's step (Push(items, step)), then pull it "
            "after that step (PullItem::AfterStep(..., step + 1))");
      });
  if (!by_shard.ok()) return FailedFuture(by_shard.status());
  return fan_out_->Start(
      std::move(*by_shard),
      [this](int shard, client::ChunkIos push, const std::shared_ptr<Future::State>& op) {
        auto done = [op](const Status& st) { op->Finish(st); };
        // The same chunks, read back into the weights' buffer.
        client::ChunkIos pull;
        pull.reserve(push.size());
        for (const auto& io : push)
          pull.push_back({io.chunk, io.out, 0, 0, io.tensor, io.out_on_gpu});
        if (sender_->TravelsInline(push)) {
          // One round trip: the shard answers the push with the weights.
          auto msg = sender_->InlineMessage(push, client::PushStep{});
          if (!msg.ok()) return done(msg.status());
          return receiver_->PushThenPull(shard, **msg, std::move(pull), done);
        }
        // Larger: the push, then a pull of at least the version it produced.
        sender_->Send(shard, std::move(push), 0, client::PushStep{}, op,
                      [this, shard, pull = std::move(pull), done](
                          const Status& st, std::span<const uint64_t> versions) mutable {
                        if (!st.ok()) return done(st);
                        for (size_t i = 0; i < pull.size() && i < versions.size(); ++i) {
                          pull[i].min_version = versions[i];
                        }
                        receiver_->Pull(shard, std::move(pull), done);
                      });
      },
      call);
}

}  // namespace tessera
