// A client's links to its shards (one per ps task, then the coordinator
// where it runs apart), and the requests waiting for their answers: a
// request sent on a link, its reply (or the link's loss) handed to whoever
// waits for it. Joining a link is ShardJoiner's; this holds the table of
// links, fixed once the client starts. Loop thread, except the Call forms
// (any thread but the loop's).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "client/call_counters.h"
#include "client/coordinator_reach.h"
#include "client/pending_requests.h"
#include "client/shard_link.h"
#include "core/inline_function.h"
#include "transport/transport.h"
#include "wire/messages.h"

namespace tessera::client {

// Hears a request's reply frame, or why there is none. Held in place
// (core/inline_function.h): a small call's handler, with its chunks and
// completion, costs no allocation.
using ReplyFn = InlineFunction<void(Status, const wire::Header&, std::span<const uint8_t>), 160>;

class ShardLinks {
 public:
  // `links`: each shard's task and address; the coordinator's is at
  // `coordinator_index` (ps task 0 where it runs inside it).
  ShardLinks(transport::Context& ctx, std::vector<ShardLink> links, int coordinator_index,
             CallCounters& counts);
  // Who tries a lost shard again (ShardJoiner::Reconnect); set before the
  // first request.
  void SetReconnect(std::function<void(int shard)> reconnect) { reconnect_ = std::move(reconnect); }

  size_t size() const { return links_.size(); }
  ShardLink& operator[](int shard) { return links_[shard]; }
  const ShardLink& operator[](int shard) const { return links_[shard]; }
  int coordinator_index() const { return coordinator_index_; }
  // Whether the coordinator is reached; the joiner notes when it is.
  CoordinatorReach& coordinator() { return coordinator_; }
  // The client closes: nothing is joined or tried again any more.
  bool stopping() const { return stopping_; }

  // Returns the request's id, or 0 when it failed at once (`fn` then ran).
  template <typename Msg>
  uint64_t Request(int shard, const Msg& msg, uint32_t flags, ReplyFn fn);
  // Nobody waits for request `id` any more (0: none).
  void Forget(uint64_t id) { pending_.Erase(id); }
  // The link's connection is `ep` from now on (a new one replaces the old).
  void Bind(int shard, std::shared_ptr<transport::Endpoint> ep);
  // Its connection given up: aborted and forgotten.
  void Unbind(int shard);
  void OnFrame(const std::shared_ptr<transport::Endpoint>& ep, std::span<const uint8_t> frame);
  void OnDisconnect(const std::shared_ptr<transport::Endpoint>& ep, const Status& why);
  // The shard is lost: said once, its connection aborted, its calls failed.
  void Lost(int shard, const Status& why);
  // Tries a lost shard again, paced by the joiner.
  void Reconnect(int shard) { reconnect_(shard); }

  // Tells every shard still connected that this worker leaves on purpose,
  // and waits briefly for their answers, so that none logs a lost worker.
  // Not on the loop thread.
  void SayBye();
  // The client closes (loop thread): each connection closed (aborted when
  // one-sided work is in flight, so that none lands in a caller's buffer
  // later), every call waiting on it failed, `also_fail(shard, why)` told,
  // and the regions let go (before the context goes).
  void CloseAll(const std::function<void(int shard, const Status& why)>& also_fail);

  // Any thread but the loop's: sends what `make()` builds on the loop
  // thread (where chunk keys may be read: a re-create changes them there)
  // and waits for the reply.
  template <typename ReplyMsg, typename Make>
  Result<ReplyMsg> CallMade(int shard, Make make, std::chrono::milliseconds timeout,
                            uint32_t flags = 0);
  template <typename Msg, typename ReplyMsg>
  Result<ReplyMsg> Call(int shard, const Msg& msg, std::chrono::milliseconds timeout,
                        uint32_t flags = 0) {
    return CallMade<ReplyMsg>(
        shard, [msg] { return msg; }, timeout, flags);
  }
  // A Call to the coordinator that rides out its restart: while this worker
  // has lost it, the call waits (within `timeout`) until it is reached again
  // and is sent once more. Every coordinator request may be repeated.
  template <typename Msg, typename ReplyMsg>
  Result<ReplyMsg> CallCoordinator(const Msg& msg, std::chrono::milliseconds timeout);

 private:
  // Fails the calls waiting on a shard: its requests, one-sided operations
  // and those waiting for staging memory.
  void FailCallsOf(int shard, const Status& why);
  // An answer nobody waits for: a pull's lease handed back, a refusal
  // before the hello answering the handshake under way.
  void OnUnclaimed(int shard, const std::shared_ptr<transport::Endpoint>& ep, const wire::Header& h,
                   std::span<const uint8_t> frame);

  transport::Context& ctx_;
  std::vector<ShardLink> links_;
  const int coordinator_index_;
  CallCounters& counts_;
  std::unordered_map<transport::Endpoint*, int> shard_of_;
  PendingRequests<ReplyFn> pending_;
  CoordinatorReach coordinator_;
  std::function<void(int shard)> reconnect_;
  bool stopping_ = false;
};

template <typename Msg>
uint64_t ShardLinks::Request(int shard, const Msg& msg, uint32_t flags, ReplyFn fn) {
  ShardLink& s = links_[shard];
  wire::Header none;
  if ((!s.dead.ok() && !s.joining.reconnecting) || !s.ep) {
    if (!s.dead.ok()) Reconnect(shard);  // fails this call; a later one may succeed
    fn(s.dead.ok() ? Status::Unavailable(s.name() + " is not connected") : s.dead, none, {});
    return 0;
  }
  const uint64_t id = pending_.Add(shard, std::move(fn));
  s.ep->Send(wire::kProtocolMsg, wire::Encode(msg, id, flags), [this, id](const Status& st) {
    if (st.ok()) return;
    ReplyFn cb;
    if (pending_.Take(id, &cb)) cb(st, wire::Header{}, {});
  });
  return id;
}

template <typename ReplyMsg, typename Make>
Result<ReplyMsg> ShardLinks::CallMade(int shard, Make make, std::chrono::milliseconds timeout,
                                      uint32_t flags) {
  using Msg = decltype(make());
  auto promise = std::make_shared<std::promise<Result<ReplyMsg>>>();
  auto future = promise->get_future();
  auto request_id = std::make_shared<std::atomic<uint64_t>>(0);
  ctx_.Post([=, this] {
    request_id->store(
        Request(shard, make(), flags,
                [promise](const Status& st, const wire::Header& h, std::span<const uint8_t> frame) {
                  if (!st.ok()) return promise->set_value(st);
                  promise->set_value(wire::DecodeBody<ReplyMsg>(h, frame));
                }));
  });
  if (future.wait_for(timeout) != std::future_status::ready) {
    ctx_.Post([this, request_id] { pending_.Erase(request_id->load()); });
    return Status::DeadlineExceeded(std::string(wire::OpcodeName(Msg::kOpcode)) + " to " +
                                    links_[shard].name() + " got no answer within " +
                                    std::to_string(timeout.count()) + " ms");
  }
  return future.get();
}

template <typename Msg, typename ReplyMsg>
Result<ReplyMsg> ShardLinks::CallCoordinator(const Msg& msg, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  using Wait = CoordinatorReach::Wait;
  while (true) {
    const uint64_t reached = coordinator_.reached();
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    auto r =
        Call<Msg, ReplyMsg>(coordinator_index_, msg, std::max(left, std::chrono::milliseconds(1)));
    if (r.ok() || r.status().code() != StatusCode::kUnavailable) return r;
    switch (coordinator_.WaitForReturn(reached, deadline)) {
      case Wait::kItSaidSo:
        return r;
      case Wait::kClosing:
        return Status::Aborted("the client was destroyed before this call completed");
      case Wait::kTimedOut:
        return Status::Unavailable(r.status().message() + "; not reached again within " +
                                   std::to_string(timeout.count()) + " ms");
      case Wait::kBack:
        break;
    }
  }
}

}  // namespace tessera::client
