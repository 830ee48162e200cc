// The one fan-out of Push, Pull and PushPull: a call's chunks, split by
// shard (split_by_shard.h), issued as one part per shard on the loop
// thread, and one Future that finishes when every part did. Owns what the
// calls' futures use: the progress driver a waiter drives the loop with, the
// poster that starts a call ordered on a CUDA stream, and the retry of parts
// over a lost shard's restart.
#pragma once

#include <chrono>
#include <functional>
#include <memory>

#include "client/chunk_io.h"
#include "client/future_state.h"
#include "client/lost_shard_retry.h"
#include "core/pool_allocator.h"
#include "tessera/client.h"
#include "transport/transport.h"

namespace tessera::client {

class FanOut {
 public:
  FanOut(transport::Context& ctx, std::chrono::milliseconds op_timeout)
      : ctx_(ctx),
        op_timeout_(op_timeout),
        driver_(std::make_shared<ProgressDriver>(&ctx)),
        poster_(std::make_shared<LoopPoster>(&ctx)) {}

  // Parts that fail because their shard was lost are held over its restart
  // (ClientOptions::retry_lost_shard_within); null: they fail.
  void SetRetry(std::unique_ptr<LostShardRetry> retry) { retry_ = std::move(retry); }
  LostShardRetry* retry() { return retry_.get(); }
  // A call's state, from the pool, as the lists of chunks.
  std::shared_ptr<Future::State> NewOp() const {
    auto st = std::allocate_shared<Future::State>(PoolAllocator<Future::State>());
    st->timeout = op_timeout_;
    st->driver = driver_;
    return st;
  }

  // Issues each shard's part on the loop thread, `issue(shard, ios, op)`,
  // which finishes `op` once (op->Finish) when that part is done; returns
  // the future that finishes when all did. A template, and the op itself
  // rather than a wrapped callback: no allocation per call or part for it.
  // Ordered on a CUDA stream (`call`), the parts are issued once the stream
  // reaches the call.
  template <typename Issue>
  Future Start(ByShard by_shard, Issue issue, const CallOptions& call);
  // Issues one shard's part of a call, `issue(ios, done)`, and finishes `op`
  // with its outcome, except that with `retryable` (the part may be sent
  // twice) and a retry set, a part that failed because the shard was lost
  // waits for the shard's return and is issued again, until its bound
  // passes. Without a retry this costs nothing beyond the call itself.
  template <typename Issue>
  void IssuePart(int shard, ChunkIos ios, const std::shared_ptr<Future::State>& op, bool retryable,
                 Issue issue);

  // The client closes: a stream-ordered call whose stream reaches it from
  // now on fails at once.
  void StopStreamOrdered() { poster_->Close(); }
  // Before the context goes: waiters no longer drive it.
  void StopDriving() { driver_->Close(); }

 private:
  // Runs `start` on the loop thread once `stream` reached it, and makes the
  // stream's later work wait until `op` completed (src/gpu/stream_order.h).
  Status OrderOnStream(void* stream, const std::shared_ptr<Future::State>& op,
                       std::function<void()> start);

  transport::Context& ctx_;
  const std::chrono::milliseconds op_timeout_;
  std::shared_ptr<ProgressDriver> driver_;  // for Future::Wait
  std::shared_ptr<LoopPoster> poster_;      // for CUDA's host functions
  std::unique_ptr<LostShardRetry> retry_;   // loop thread
};

template <typename Issue>
Future FanOut::Start(ByShard by_shard, Issue issue, const CallOptions& call) {
  auto op = NewOp();
  op->Add(1);                                  // held until every part is issued
  op->start = Future::State::Start::kPending;  // cancellable until it is issued
  auto start = [op, by_shard = std::move(by_shard), issue = std::move(issue)]() mutable {
    if (!op->TryStart()) return;  // cancelled: Cancel finished it
    for (size_t s = 0; s < by_shard.size(); ++s) {
      if (by_shard[s].empty()) continue;
      op->Add(1);
      issue(static_cast<int>(s), std::move(by_shard[s]), op);
    }
    op->Finish(Status::Ok());
  };
  if (call.cuda_stream == nullptr) {
    // A blocking call issues itself when no other thread drives the loop:
    // posting would wake the progress thread (a system call and, on a
    // shared core, a context switch) only for the caller to drive anyway.
    if (!call.caller_waits) {
      ctx_.Post(std::move(start));
    } else if (transport::Task task(std::move(start)); !ctx_.RunHere(task)) {
      ctx_.Post(std::move(task));
    }
  } else if (Status st = OrderOnStream(call.cuda_stream, op, std::move(start)); !st.ok()) {
    if (op->TryStart()) op->Finish(st);
  }
  return Future(op);
}

template <typename Issue>
void FanOut::IssuePart(int shard, ChunkIos ios, const std::shared_ptr<Future::State>& op,
                       bool retryable, Issue issue) {
  if (!retryable || !retry_) {
    return issue(std::move(ios), PartDone([op](const Status& st) { op->Finish(st); }));
  }
  retry_->IssuePart(shard, op,
                    [ios = std::move(ios), issue = std::move(issue)](PartDone done) mutable {
                      issue(ios, std::move(done));
                    });
}

}  // namespace tessera::client
