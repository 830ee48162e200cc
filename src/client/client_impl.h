// Client::Impl, the worker's side, shared by the files that implement it:
// future.cc (waiting), shard_link.cc (connections: connect, handshake,
// heartbeats, reconnect, re-create), declare.cc (declares; the tensors are
// a client::TensorTable),
// push_path.cc, pull_path.cc, push_pull.cc, gpu_path.cc (GPU buffers),
// coordinator_calls.cc (init barrier, global step, hyper-parameters), and
// client.cc (the public API). Everything marked "loop thread" runs on the
// transport's progress thread (or a waiter driving it).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "client/call_counters.h"
#include "client/control_queue.h"
#include "client/coordinator_reach.h"
#include "client/future_state.h"
#include "client/gather_buffer.h"
#include "client/lost_shard_retry.h"
#include "client/pending_requests.h"
#include "client/silence_meter.h"
#include "client/staging_allocator.h"
#include "client/startup_waiter.h"
#include "client/tensor_table.h"
#include "core/inline_function.h"
#include "core/log.h"
#include "core/pool_allocator.h"
#include "gpu/cuda.h"
#include "tessera/client.h"
#include "transport/transport.h"
#include "wire/handshake.h"
#include "wire/messages.h"

namespace tessera {

using wire::kProtocolMsg;

class Client::Impl {
 public:
  explicit Impl(ClientOptions options) : options_(std::move(options)) {}
  ~Impl();

  // This client's id (Client::id()), which its Tensors carry.
  const uint32_t id_ = NextId();
  static uint32_t NextId();

  Status Start();
  // The control calls, on the control queue (control_queue.h): blocking
  // forms wait for theirs, so that both are ordered alike.
  Result<std::vector<Tensor>> DeclareMany(const std::vector<TensorSpec>& specs);
  Future DeclareManyAsync(std::vector<TensorSpec> specs, std::vector<Tensor>* tensors);
  Status Initialize() {
    return control_.Submit([this] { return InitializeNow(); }).Wait();
  }
  Future InitializeAsync() {
    return control_.Submit([this] { return InitializeNow(); });
  }
  Status WaitForInit(std::chrono::milliseconds timeout) { return WaitForInitAsync(timeout).Wait(); }
  Future WaitForInitAsync(std::chrono::milliseconds timeout) {
    return control_.Submit([this, timeout] { return WaitForInitNow(timeout); });
  }
  Status SetHyperparams(Tensor t, const Hyperparams& hyper);
  // optimizer_state.cc: a tensor's optimizer state, chunk by chunk.
  Result<Client::OptimizerState> ReadOptimizerState(Tensor t, Client::StateSlot slot);
  Status WriteOptimizerState(Tensor t, Client::StateSlot slot, const Client::OptimizerState& state);
  Result<uint64_t> GlobalStep();
  // Where the tensors the chief initialises now start (InitializeNow).
  Result<uint64_t> StepToStartAt();
  Result<Client::CheckpointInfo> SaveCheckpoint(std::chrono::milliseconds timeout) {
    if (options_.read_only) return ReadOnlyRefusal("ask for a checkpoint");
    auto saved = CallCoordinator<wire::SaveCheckpoint, wire::CheckpointSaved>(
        wire::SaveCheckpoint{}, timeout);
    if (!saved.ok()) return saved.status();
    return Client::CheckpointInfo{saved->global_step, saved->path};
  }
  // `step`: the worker's step; none for a push without one, which sync
  // tensors refuse.
  Future Push(const std::vector<PushItem>& items, uint32_t flags, std::optional<uint64_t> step,
              const CallOptions& call);
  Future Pull(const std::vector<PullItem>& items, const CallOptions& call);
  Future PushPull(const std::vector<PushPullItem>& items, const CallOptions& call);

  using Chunk = client::Chunk;
  using TensorEntry = client::TensorEntry;
  using TensorHot = client::TensorHot;

  ClientOptions options_;
  // When the next heartbeat is due (loop thread): a later one shows that
  // the progress loop was held up.
  std::chrono::steady_clock::time_point next_heartbeat_{};
  TaskId task_;
  int worker_rank_ = 0;
  std::unique_ptr<transport::Context> ctx_;
  std::shared_ptr<ProgressDriver> driver_;  // over ctx_, for Future::Wait
  std::shared_ptr<LoopPoster> poster_;      // over ctx_, for CUDA's host functions

  client::ControlQueue control_;
  client::CallCounters counts_;
  // GPU buffers.
  Status fabric_gpu_;        // whether the fabric reaches GPU memory, else why not
  std::string ipc_node_id_;  // sent in hellos when this worker can use CUDA IPC
  gpu::Stream stream_;       // loop thread; created on first use
  client::TensorTable tensors_{id_};

 private:
  // The control calls themselves, on the control queue's thread.
  Result<std::vector<Tensor>> DeclareNow(const std::vector<TensorSpec>& specs);
  Status InitializeNow();
  Status WaitForInitNow(std::chrono::milliseconds timeout);

  using Frame = MessageBytes;
  // Held in place (core/inline_function.h): a small call's reply handler,
  // with its chunks and completion, costs no allocation.
  using ReplyFn = InlineFunction<void(Status, const wire::Header&, std::span<const uint8_t>), 160>;

  struct ShardConn {
    // Joining the shard, at the start and after it was lost (loop thread).
    struct Joining {
      int attempts = 0;           // turned away or unanswered so far
      uint64_t request = 0;       // the handshake's request waiting, if any
      bool reconnecting = false;  // a restarted shard is being joined again
      std::chrono::steady_clock::time_point next_reconnect;
    };
    // A GPU shard on this node: its slot for this worker and its arenas,
    // mapped with CUDA IPC (pushes and pulls are device copies then).
    struct IpcMaps {
      gpu::IpcMapping slot;
      std::unordered_map<uint32_t, gpu::IpcMapping> arenas;
    };
    // One-sided work in flight, failed by OnShardLost: a fabric may never
    // complete operations towards a peer that hangs. An entry per large
    // call: its node from the pool, its abort held in place.
    struct InFlight {
      using Abort = InlineFunction<void(const Status&), 160>;
      std::unordered_map<uint64_t, Abort, std::hash<uint64_t>, std::equal_to<>,
                         PoolAllocator<std::pair<const uint64_t, Abort>>>
          ops;
      uint64_t next_id = 1;
    };

    TaskId task;
    TaskAddress addr;
    std::shared_ptr<transport::Endpoint> ep;
    Joining joining;
    std::unique_ptr<transport::RemoteRegion> staging;
    client::StagingAllocator alloc;
    // Where small chunks are gathered into one put (loop thread).
    client::GatherBuffer gather;
    std::unordered_map<uint32_t, std::unique_ptr<transport::RemoteRegion>> arenas;
    IpcMaps ipc;
    std::deque<std::function<void()>> waiting_for_staging;
    Status dead;  // non-OK once the connection is gone
    // Listening time without any traffic from the shard (heartbeats).
    SilenceMeter silence;
    InFlight in_flight;
    std::string name() const { return task.ToString() + " (" + addr.ToString() + ")"; }
  };

  // Loop thread. Returns the request's id, or 0 when it failed at once
  // (`fn` then ran).
  template <typename Msg>
  uint64_t Request(int shard, const Msg& msg, uint32_t flags, ReplyFn fn);
  // Tells every shard still connected that this worker leaves on purpose,
  // and waits briefly for their answers, so that none logs a lost worker.
  void SayBye();
  void OnFrame(const std::shared_ptr<transport::Endpoint>& ep, std::span<const uint8_t> frame);
  void OnShardLost(int shard, const Status& why);
  // Fails the calls waiting on a shard: its requests, one-sided operations
  // and those waiting for staging memory.
  void FailCallsOf(int shard, const Status& why);
  void ConnectShard(int shard, std::chrono::steady_clock::time_point deadline);
  // A start's handshake with `shard` ended with `st`: connected, failed, or
  // tried again after a pause while `deadline` allows.
  void OnStartHandshake(int shard, std::chrono::steady_clock::time_point deadline,
                        const Status& st);
  void Heartbeat();
  // What a failed one-sided operation on a shard reports: why the shard was
  // lost if it was, else the fabric's error naming the shard.
  Status ShardError(int shard, const Status& st) const {
    const ShardConn& s = shards_[shard];
    return s.dead.ok() ? st.WithContext(s.name()) : s.dead;
  }
  void Handshake(int shard, std::function<void(Status)> done);
  // The handshake's last step: the shard's welcome (its staging slot, the
  // session's protection, a CUDA IPC slot) taken.
  Status AcceptWelcome(int shard, const wire::Welcome& welcome,
                       const wire::ClientHandshake& handshake);
  // A lost ps task or coordinator is tried again now and then; once it
  // answers, this worker's chunks are created on it again (a restarted
  // shard restores them from the newest checkpoint) and calls succeed again.
  void Reconnect(int shard);
  void ReCreate(int shard);

  // Any thread: sends what `make()` builds on the loop thread (where chunk
  // keys may be read: ReCreate changes them there) and waits for the reply.
  template <typename ReplyMsg, typename Make>
  Result<ReplyMsg> CallMade(int shard, Make make, std::chrono::milliseconds timeout,
                            uint32_t flags = 0);
  // Any thread: sends and waits for the reply frame.
  template <typename Msg, typename ReplyMsg>
  Result<ReplyMsg> Call(int shard, const Msg& msg, std::chrono::milliseconds timeout,
                        uint32_t flags = 0);
  // A Call to the coordinator that rides out its restart: while this worker
  // has lost it, the call waits (within `timeout`) until it is reached again
  // and is sent once more. Every coordinator request may be repeated.
  template <typename Msg, typename ReplyMsg>
  Result<ReplyMsg> CallCoordinator(const Msg& msg, std::chrono::milliseconds timeout);

  struct ChunkIo {
    const Chunk* chunk;
    uint8_t* local;  // source (push) or destination (pull)
    uint64_t min_version = 0;
    uint64_t min_step = 0;
    // The tensor the chunk belongs to. A tensor's chunks on one shard travel
    // in one push-done, so that they are applied together.
    const TensorEntry* tensor = nullptr;
    bool on_gpu = false;  // `local` is GPU memory
    // push_pull: where the chunk's weights go after the push.
    uint8_t* out = nullptr;
    bool out_on_gpu = false;
  };
  // From the pool (core/pool_allocator.h): a call's lists of chunks cost no
  // allocation in steady state.
  using ChunkIos = std::vector<ChunkIo, PoolAllocator<ChunkIo>>;
  using ByShard = std::vector<ChunkIos, PoolAllocator<ChunkIos>>;

  // The one fan-out of Push, Pull and PushPull. An item of any of them, as
  // the split sees it.
  struct ItemView {
    Tensor tensor;
    size_t bytes;
    std::optional<DType> dtype;
    BufferMemory memory;
    ChunkPart chunks;
    const void* data;
    void* out = nullptr;
    uint64_t min_version = 0, min_step = 0;
    bool has_out = false;  // a push_pull's: `out` is where its weights go
  };
  static ItemView ViewOf(const PushItem& i) {
    return {i.tensor, i.bytes, i.dtype, i.memory, i.chunks, i.data};
  }
  static ItemView ViewOf(const PullItem& i) {
    return {i.tensor, i.bytes, i.dtype,       i.memory,  i.chunks,
            i.data,   nullptr, i.min_version, i.min_step};
  }
  static ItemView ViewOf(const PushPullItem& i) {
    return {i.tensor, i.bytes, i.dtype, i.memory, i.chunks, i.gradient, i.weights, 0, 0, true};
  }
  // Splits a call's items into each shard's chunks (the items' ChunkParts
  // only), after checking each item's buffer, size and dtype; a sync tensor
  // is refused with `refuse_sync(entry)`'s error unless that is null. `what`
  // names the call in errors. (A plain function, called for sync tensors
  // only: nothing per item beyond the checks themselves.)
  using RefuseSync = Status (*)(const TensorEntry&);
  // The error for an item whose buffer is a null pointer (the tensor table locked).
  Status NullBuffer(const ItemView& v, const char* what) const;
  template <typename Item>
  Result<ByShard> SplitByShard(const std::vector<Item>& items, const char* what,
                               RefuseSync refuse_sync);
  // Issues each shard's part on the loop thread, `issue(shard, ios, op)`,
  // which finishes `op` once (op->Finish) when that part is done; returns
  // the future that finishes when all did. A template, and the op itself
  // rather than a wrapped callback: no allocation per call or part for it.
  // Ordered on a CUDA stream (`call`), the parts are issued once the stream
  // reaches the call (OrderOnStream).
  template <typename Issue>
  Future FanOut(ByShard by_shard, Issue issue, const CallOptions& call) {
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
        ctx_->Post(std::move(start));
      } else if (transport::Task task(std::move(start)); !ctx_->RunHere(task)) {
        ctx_->Post(std::move(task));
      }
    } else if (Status st = OrderOnStream(call.cuda_stream, op, std::move(start)); !st.ok()) {
      if (op->TryStart()) op->Finish(st);
    }
    return Future(op);
  }
  // Runs `start` on the loop thread once `stream` reached it, and makes the
  // stream's later work wait until `op` completed (src/gpu/stream_order.h).
  Status OrderOnStream(void* stream, const std::shared_ptr<Future::State>& op,
                       std::function<void()> start);
  // What a call says of an item whose ChunkPart names no part.
  static Status PartError(const ChunkPart& p, const TensorEntry& e) {
    return Status::InvalidArgument("tensor '" + e.decl.name + "': chunk part " +
                                   std::to_string(p.part) + " of " + std::to_string(p.parts));
  }
  // Whether `ptr` is GPU memory, checked against what the caller said.
  static Result<bool> OnGpu(const void* ptr, BufferMemory said);
  // Device copies (any direction) on this client's stream, on the loop
  // thread; GpuWait waits for them and reports their error.
  Status GpuCopyAsync(void* dst, const void* src, size_t bytes);
  Status GpuWait();
  // Why GPU chunks cannot move to or from shard `s` one-sided, or OK.
  Status GpuPathTo(const ShardConn& s, const ChunkIos& ios) const;
  // Maps an arena of a GPU shard on this node (loop thread).
  void MapArena(ShardConn& s, const wire::ArenaKey& a);
  void UnmapShard(ShardConn& s);
  // Whether a push of these chunks to one shard carries their bytes inside
  // its message (ClientOptions::inline_bytes).
  bool TravelsInline(const ChunkIos& ios) const {
    if (ios.empty()) return false;
    uint64_t raw = 0;
    for (const auto& io : ios) raw += io.chunk->bytes;
    return raw <= std::min(options_.inline_bytes, wire::kMaxInlineBytes);
  }
  // A push's step, and whether this part counts it (wire::Push::step_parts;
  // only the first message of the part carries it).
  struct PushStep {
    uint64_t step = 0;
    uint32_t parts = 0;
  };
  // Hears how a push to one shard ended, and the versions it produced.
  using PushDone = InlineFunction<void(Status, std::span<const uint64_t>), 64>;
  // `op` (may be null) hears of the chunks the shard dropped.
  void PushToShard(int shard, ChunkIos ios, uint32_t flags, PushStep tag,
                   const std::shared_ptr<Future::State>& op, PushDone done);
  // A push larger than the whole staging slot, sent in parts one after
  // another, each within the slot (push_path.cc).
  struct PushInParts;
  void PushNextPart(const std::shared_ptr<PushInParts>& parts);
  // The rest of a push too large to travel inline, once `offset` in the
  // shard's staging slot is ours: into the CUDA IPC slot, or put one-sided
  // in groups, each group's push-done sent as its puts land (slot_push.cc).
  struct SlotPush;
  void PushThroughSlot(int shard, ChunkIos ios, uint32_t flags, PushStep tag,
                       const std::shared_ptr<Future::State>& op, uint64_t offset,
                       const PushDone& done);
  // Handles a push-reply: each chunk's outcome (NoteOutcomes), then `finish`.
  ReplyFn OnPushReply(ChunkIos sent, uint64_t step, std::shared_ptr<Future::State> op,
                      PushDone finish);
  // Counts what the shard did with each pushed chunk, and tells `op` which
  // it dropped.
  // Ok, or the error naming each chunk the shard refused and each it
  // applied, with its version (a batch is applied entry by entry).
  static Status Refusals(const wire::PushReply& reply, const ChunkIo* ios);
  void NoteOutcomes(const std::vector<uint8_t>& outcomes, const ChunkIo* ios, uint64_t step,
                    Future::State* op);
  // A push message carrying its bytes (TravelsInline), copied from GPU
  // memory where they are there.
  // Fills `msg`, whose vectors keep their capacity (the loop thread's
  // push_scratch_, which the caller encodes at once).
  Status InlinePush(const ChunkIos& ios, PushStep tag, wire::Push* msg);
  // How one shard's part of a pull or push_pull ended.
  using PartDone = client::PartDone;

  // Issues one shard's part of a call, `issue(ios, done)`, and finishes `op`
  // with its outcome, except that with `retryable` (the part may be sent
  // twice) and retry_lost_shard_within set, a part that failed because the
  // shard was lost waits for the shard's return and is issued again
  // (client::LostShardRetry), until its bound passes. Without the option
  // this costs nothing beyond the call itself.
  template <typename Issue>
  void IssuePart(int shard, ChunkIos ios, const std::shared_ptr<Future::State>& op, bool retryable,
                 Issue issue) {
    if (!retryable || !retry_) {
      return issue(std::move(ios), PartDone([op](const Status& st) { op->Finish(st); }));
    }
    retry_->IssuePart(shard, op,
                      [ios = std::move(ios), issue = std::move(issue)](PartDone done) mutable {
                        issue(ios, std::move(done));
                      });
  }

  void PullFromShard(int shard, ChunkIos ios, const PartDone& done);
  // push_pull's one round trip to a shard, for gradients that travel inline:
  // the shard answers the push with the weights it produced.
  void PushThenPullInline(int shard, const ChunkIos& gradients, ChunkIos weights, PartDone done);
  // Lands a pull reply's bytes in `ios`: copied from the reply when inline,
  // else read out of the arenas under its lease, which is then released
  // (arena_pull.cc).
  struct ArenaPull;
  void AcceptPullReply(int shard, ChunkIos ios, const wire::PullReply& reply, const PartDone& done);
  // What a read-only client says when asked to write: `what` ("push").
  Status ReadOnlyRefusal(const std::string& what) const {
    return Status::FailedPrecondition(task_.ToString() + " is a read-only client: it cannot " +
                                      what + " (ClientOptions::read_only)");
  }
  std::shared_ptr<Future::State> NewOp() const {
    // From the pool, as the lists of chunks.
    auto st = std::allocate_shared<Future::State>(PoolAllocator<Future::State>());
    st->timeout = options_.op_timeout;
    st->driver = driver_;
    return st;
  }

  // One per ps task, then the coordinator when it runs separately. The task
  // and address are fixed by Start(); the rest belongs to the loop thread.
  std::vector<ShardConn> shards_;
  int coord_index_ = 0;
  client::CoordinatorReach coordinator_;
  std::unordered_map<transport::Endpoint*, int> shard_of_;
  client::PendingRequests<ReplyFn> pending_;
  // Loop thread: the last push and pull built and the last replies to
  // them decoded. Each is used up before the next is made (a request is
  // encoded as soon as it is built; a reply's versions and bytes are read
  // before anything else runs), so reusing them saves their allocations
  // on every call.
  wire::Push push_scratch_;
  wire::PushReply push_reply_scratch_;
  wire::Pull pull_scratch_;
  wire::PullReply pull_reply_scratch_;

  // What Start waits for; it stays while the loop may still report to it.
  std::unique_ptr<client::StartupWaiter> startup_;
  // Parts held over a lost shard's restart (null: retry_lost_shard_within
  // is off). Loop thread.
  std::unique_ptr<client::LostShardRetry> retry_;
  bool stopping_ = false;
  // How long a shard may take to answer the handshake: the shard's own
  // hello deadline (TESSERA_HELLO_TIMEOUT_MS), after which it would have
  // closed the connection anyway.
  std::chrono::milliseconds handshake_timeout_{5000};
};

template <typename Msg>
uint64_t Client::Impl::Request(int shard, const Msg& msg, uint32_t flags, ReplyFn fn) {
  ShardConn& s = shards_[shard];
  wire::Header none;
  if ((!s.dead.ok() && !s.joining.reconnecting) || !s.ep) {
    if (!s.dead.ok()) Reconnect(shard);  // fails this call; a later one may succeed
    fn(s.dead.ok() ? Status::Unavailable(s.name() + " is not connected") : s.dead, none, {});
    return 0;
  }
  const uint64_t id = pending_.Add(shard, std::move(fn));
  s.ep->Send(kProtocolMsg, wire::Encode(msg, id, flags), [this, id](const Status& st) {
    if (st.ok()) return;
    ReplyFn cb;
    if (pending_.Take(id, &cb)) cb(st, wire::Header{}, {});
  });
  return id;
}

template <typename ReplyMsg, typename Make>
Result<ReplyMsg> Client::Impl::CallMade(int shard, Make make, std::chrono::milliseconds timeout,
                                        uint32_t flags) {
  using Msg = decltype(make());
  auto promise = std::make_shared<std::promise<Result<ReplyMsg>>>();
  auto future = promise->get_future();
  auto request_id = std::make_shared<std::atomic<uint64_t>>(0);
  ctx_->Post([=, this] {
    request_id->store(
        Request(shard, make(), flags,
                [promise](const Status& st, const wire::Header& h, std::span<const uint8_t> frame) {
                  if (!st.ok()) return promise->set_value(st);
                  promise->set_value(wire::DecodeBody<ReplyMsg>(h, frame));
                }));
  });
  if (future.wait_for(timeout) != std::future_status::ready) {
    ctx_->Post([this, request_id] { pending_.Erase(request_id->load()); });
    return Status::DeadlineExceeded(std::string(wire::OpcodeName(Msg::kOpcode)) + " to " +
                                    shards_[shard].name() + " got no answer within " +
                                    std::to_string(timeout.count()) + " ms");
  }
  return future.get();
}

template <typename Msg, typename ReplyMsg>
Result<ReplyMsg> Client::Impl::Call(int shard, const Msg& msg, std::chrono::milliseconds timeout,
                                    uint32_t flags) {
  return CallMade<ReplyMsg>(
      shard, [msg] { return msg; }, timeout, flags);
}

template <typename Msg, typename ReplyMsg>
Result<ReplyMsg> Client::Impl::CallCoordinator(const Msg& msg, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  using Wait = client::CoordinatorReach::Wait;
  while (true) {
    const uint64_t reached = coordinator_.reached();
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    auto r = Call<Msg, ReplyMsg>(coord_index_, msg, std::max(left, std::chrono::milliseconds(1)));
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

}  // namespace tessera
