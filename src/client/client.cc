#include "tessera/client.h"

#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "ckpt/checkpoint.h"
#include "client/silence_meter.h"
#include "client/staging_allocator.h"
#include "core/bytes.h"
#include "core/log.h"
#include "core/node_id.h"
#include "core/placement.h"
#include "core/secret.h"
#include "core/spin.h"
#include "core/timeouts.h"
#include "gpu/cuda.h"
#include "transport/transport.h"
#include "wire/handshake.h"
#include "wire/messages.h"

namespace tessera {

// ---------------------------------------------------------------------------
// Future

// Lets a thread that waits on a Future drive the client's progress itself,
// for as long as the client exists: the reply is then received on the
// waiting thread instead of being handed over by the progress thread.
class ProgressDriver {
 public:
  explicit ProgressDriver(transport::Context* ctx) : ctx_(ctx) {}

  // One turn of the client's progress engine, if no other thread is in it.
  bool Drive() {
    users_.fetch_add(1);
    const bool worked = !closed_.load() && ctx_->Drive();
    users_.fetch_sub(1);
    return worked;
  }
  void StopDriving() {
    users_.fetch_add(1);
    if (!closed_.load()) ctx_->StopDriving();
    users_.fetch_sub(1);
  }
  // Called before the context goes: later Drive calls do nothing, and the
  // ones already inside it have left when this returns.
  void Close() {
    closed_.store(true);
    while (users_.load() != 0) std::this_thread::yield();
  }

 private:
  transport::Context* const ctx_;
  // Sequentially consistent, so that Close and Drive cannot miss each other.
  std::atomic<int> users_{0};
  std::atomic<bool> closed_{false};
};

struct Future::State {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;  // every part finished: the status is final
  // Done, and the continuations (Then) have run: only now do waiters go on,
  // so that what a continuation sends (the worker's step report) is on its
  // way before anything the waiter does next. Set under mu.
  std::atomic<bool> ready{false};
  Status status;
  int remaining = 0;  // parts still running
  std::vector<std::function<void(Status)>> then;
  std::vector<DroppedChunk> dropped;  // a push's, guarded by mu
  std::chrono::milliseconds timeout{60'000};
  std::shared_ptr<ProgressDriver> driver;  // null for futures failed at once

  void Add(int n = 1) {
    std::lock_guard<std::mutex> lock(mu);
    remaining += n;
  }
  // One part finished; the first error wins.
  void Finish(const Status& st) {
    std::vector<std::function<void(Status)>> run;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (done) return;
      if (!st.ok() && status.ok()) status = st;
      if (--remaining > 0) return;
      done = true;
      run.swap(then);
      if (run.empty()) ready.store(true, std::memory_order_release);
    }
    if (!run.empty()) {
      for (auto& fn : run) fn(status);
      std::lock_guard<std::mutex> lock(mu);
      ready.store(true, std::memory_order_release);
    }
    cv.notify_all();
  }
};

Status Future::Wait() const {
  if (!state_) return Status::FailedPrecondition("waiting on an empty Future");
  return WaitFor(state_->timeout);
}

Status Future::WaitFor(std::chrono::milliseconds limit) const {
  if (!state_) return Status::FailedPrecondition("waiting on an empty Future");
  // A small call completes within microseconds: drive the client's progress
  // from this thread while work keeps coming, and for a moment after, before
  // paying for a sleep and a wake-up on the condition variable. The spin
  // never yields its core (beside a CPU hog that costs a whole slice) and
  // ends once this thread was descheduled (see core/spin.h).
  constexpr auto kSpin = std::chrono::microseconds(50);
  SpinWindow spin(kSpin);
  while (!state_->ready.load(std::memory_order_acquire)) {
    if (state_->driver && state_->driver->Drive()) {
      spin.Restart();
    } else if (!spin.Continue()) {
      break;
    }
  }
  // Hand progress back to the client's progress thread now, whether the
  // answer came or this thread is about to sleep: nothing then waits for
  // the progress thread to notice that nobody drives any more.
  if (state_->driver) state_->driver->StopDriving();
  std::unique_lock<std::mutex> lock(state_->mu);
  if (!state_->cv.wait_for(lock, limit, [&] { return state_->ready.load(); })) {
    return Status::DeadlineExceeded("operation did not complete within " +
                                    std::to_string(limit.count()) + " ms");
  }
  return state_->status;
}

std::vector<DroppedChunk> Future::dropped() const {
  if (!state_) return {};
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->ready.load() ? state_->dropped : std::vector<DroppedChunk>{};
}

bool Future::ready() const { return state_ && state_->ready.load(std::memory_order_acquire); }

void Future::Then(std::function<void(Status)> fn) const {
  Status st;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (!state_->done) {
      state_->then.push_back(std::move(fn));
      return;
    }
    st = state_->status;
  }
  fn(st);
}

namespace {

using wire::kProtocolMsg;

Future FailedFuture(const Status& st) {
  auto state = std::make_shared<Future::State>();
  state->remaining = 1;
  state->Finish(st);
  return Future(state);
}

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

// ---------------------------------------------------------------------------
// Client::Impl

class Client::Impl {
 public:
  explicit Impl(ClientOptions options) : options_(std::move(options)) {}
  ~Impl();

  Status Start();
  Result<std::vector<Tensor>> DeclareMany(const std::vector<TensorSpec>& specs);
  Status Initialize();
  Status WaitForInit(std::chrono::milliseconds timeout);
  Status SetHyperparams(Tensor t, const Hyperparams& hyper);
  Result<uint64_t> GlobalStep();
  Result<Client::CheckpointInfo> SaveCheckpoint(std::chrono::milliseconds timeout) {
    auto saved = Call<wire::SaveCheckpoint, wire::CheckpointSaved>(coord_index_,
                                                                   wire::SaveCheckpoint{}, timeout);
    if (!saved.ok()) return saved.status();
    return Client::CheckpointInfo{saved->global_step, saved->path};
  }
  // `step`: the worker's step; none for a push without one, which sync
  // tensors refuse.
  Future Push(const std::vector<PushItem>& items, uint32_t flags, std::optional<uint64_t> step);
  Future Pull(const std::vector<PullItem>& items);
  Future PushPull(const std::vector<PushPullItem>& items);

  struct Chunk {
    int shard;
    uint64_t elem_offset, elem_count, byte_offset, bytes;
    uint32_t key_id = 0, arena_id = 0;
    uint64_t arena_offset = 0;
  };
  struct TensorEntry {
    TensorSpec spec;
    uint64_t bytes;
    std::vector<Chunk> chunks;
    bool restored = false;     // the shards loaded it from a checkpoint
    bool initialized = false;  // the chief initialised it already
    wire::TensorDecl decl;     // as declared (modes filled in), for re-creating
  };

  ClientOptions options_;
  // When the next heartbeat is due (loop thread): a later one shows that
  // the progress loop was held up.
  std::chrono::steady_clock::time_point next_heartbeat_{};
  TaskId task_;
  int worker_rank_ = 0;
  std::unique_ptr<transport::Context> ctx_;
  std::shared_ptr<ProgressDriver> driver_;  // over ctx_, for Future::Wait

  std::atomic<uint64_t> dropped_stale_{0}, dropped_duplicate_{0};  // sync push outcomes
  // GPU buffers (see ClientCounters).
  Status fabric_gpu_;        // whether the fabric reaches GPU memory, else why not
  std::string ipc_node_id_;  // sent in hellos when this worker can use CUDA IPC
  gpu::Stream stream_;       // loop thread; created on first use
  std::atomic<uint64_t> ipc_bytes_{0}, staged_bytes_{0}, gpu_inline_bytes_{0};
  std::atomic<int> ipc_shards_{0};
  // From the coordinator's declare replies.
  std::optional<uint64_t> restored_step_;  // under tensors_mu_

  mutable std::mutex tensors_mu_;
  std::deque<TensorEntry>
      tensors_;  // index = Tensor::index; append-only, so chunk pointers stay valid
  std::unordered_map<std::string, uint32_t> by_name_;

 private:
  using Frame = std::vector<uint8_t>;
  using ReplyFn = std::function<void(Status, const wire::Header&, std::span<const uint8_t>)>;

  struct ShardConn {
    TaskId task;
    TaskAddress addr;
    std::shared_ptr<transport::Endpoint> ep;
    std::unique_ptr<transport::RemoteRegion> staging;
    client::StagingAllocator alloc;
    std::unordered_map<uint32_t, std::unique_ptr<transport::RemoteRegion>> arenas;
    // A GPU shard on this node: its slot for this worker and its arenas,
    // mapped with CUDA IPC (pushes and pulls are device copies then).
    gpu::IpcMapping ipc_slot;
    std::unordered_map<uint32_t, gpu::IpcMapping> ipc_arenas;
    std::deque<std::function<void()>> waiting_for_staging;
    Status dead;                // non-OK once the connection is gone
    bool reconnecting = false;  // a restarted shard is being joined again
    std::chrono::steady_clock::time_point next_reconnect;
    // Listening time without any traffic from the shard (heartbeats).
    SilenceMeter silence;
    // One-sided work in flight, failed by OnShardLost: a fabric may never
    // complete operations towards a peer that hangs.
    std::unordered_map<uint64_t, std::function<void(const Status&)>> in_flight;
    uint64_t next_op = 1;
    std::string name() const { return task.ToString() + " (" + addr.ToString() + ")"; }
  };
  struct PendingRequest {
    int shard;
    ReplyFn fn;
  };

  // Loop thread.
  template <typename Msg>
  void Request(int shard, const Msg& msg, uint32_t flags, ReplyFn fn);
  // Tells every shard still connected that this worker leaves on purpose,
  // and waits briefly for their answers, so that none logs a lost worker.
  void SayBye();
  void OnFrame(const std::shared_ptr<transport::Endpoint>& ep, std::span<const uint8_t> frame);
  void OnShardLost(int shard, const Status& why);
  void ConnectShard(int shard, std::chrono::steady_clock::time_point deadline);
  void Heartbeat();
  // What a failed one-sided operation on a shard reports: why the shard was
  // lost if it was, else the fabric's error naming the shard.
  Status ShardError(int shard, const Status& st) const {
    const ShardConn& s = shards_[shard];
    return s.dead.ok() ? st.WithContext(s.name()) : s.dead;
  }
  void Handshake(int shard, std::function<void(Status)> done);
  // A lost ps task (not the coordinator) is tried again now and then; once
  // it answers, this worker's chunks are created on it again (a restarted
  // shard restores them from the newest checkpoint) and calls succeed again.
  void Reconnect(int shard);
  void ReCreate(int shard);

  // Any thread: sends and waits for the reply frame.
  template <typename Msg, typename ReplyMsg>
  Result<ReplyMsg> Call(int shard, const Msg& msg, std::chrono::milliseconds timeout,
                        uint32_t flags = 0);

  struct ChunkIo {
    const Chunk* chunk;
    uint8_t* local;  // source (push) or destination (pull)
    uint64_t min_version = 0;
    uint64_t min_step = 0;
    // Push: the tensor the chunk belongs to. A tensor's chunks on one shard
    // travel in one push-done, so that they are applied together.
    const TensorEntry* tensor = nullptr;
    bool on_gpu = false;  // `local` is GPU memory
  };
  static Status CheckPart(const ChunkPart& p, const TensorEntry& e) {
    if (p.parts == 0 || p.part >= p.parts) {
      return Status::InvalidArgument("tensor '" + e.spec.name + "': chunk part " +
                                     std::to_string(p.part) + " of " + std::to_string(p.parts));
    }
    return Status::Ok();
  }
  // Whether `ptr` is GPU memory, checked against what the caller said.
  static Result<bool> OnGpu(const void* ptr, BufferMemory said);
  // Device copies (any direction) on this client's stream, on the loop
  // thread; GpuWait waits for them and reports their error.
  Status GpuCopyAsync(void* dst, const void* src, size_t bytes);
  Status GpuWait();
  // Why GPU chunks cannot move to or from shard `s` one-sided, or OK.
  Status GpuPathTo(const ShardConn& s, const std::vector<ChunkIo>& ios) const;
  // Maps an arena of a GPU shard on this node (loop thread).
  void MapArena(ShardConn& s, const wire::ArenaKey& a);
  void UnmapShard(ShardConn& s);
  // Whether a push of these chunks to one shard carries their bytes inside
  // its message (ClientOptions::inline_bytes).
  bool TravelsInline(const std::vector<ChunkIo>& ios) const {
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
  // `op` (may be null) hears of the chunks the shard dropped.
  void PushToShard(int shard, std::vector<ChunkIo> ios, uint32_t flags, PushStep tag,
                   std::shared_ptr<Future::State> op,
                   std::function<void(Status, std::vector<uint64_t>)> done);
  // Counts what the shard did with each pushed chunk, and tells `op` which
  // it dropped.
  void NoteOutcomes(const std::vector<uint8_t>& outcomes, const ChunkIo* ios, uint64_t step,
                    Future::State* op);
  // A push message carrying its bytes (TravelsInline), copied from GPU
  // memory where they are there.
  Result<wire::Push> InlinePush(const std::vector<ChunkIo>& ios, PushStep tag);
  void PullFromShard(int shard, std::vector<ChunkIo> ios, const std::function<void(Status)>& done);
  // push_pull's one round trip to a shard, for gradients that travel inline:
  // the shard answers the push with the weights it produced.
  void PushThenPullInline(int shard, std::vector<ChunkIo> gradients, std::vector<ChunkIo> weights,
                          std::function<void(Status)> done);
  // Lands a pull reply's bytes in `ios`: copied from the reply when inline,
  // else read one-sided under its lease, which is then released.
  void AcceptPullReply(int shard, std::vector<ChunkIo> ios, wire::PullReply reply,
                       const std::function<void(Status)>& done);
  Result<const TensorEntry*> Lookup(Tensor t, size_t bytes, std::optional<DType> dtype,
                                    bool check_bytes = true) const;
  // The same with tensors_mu_ held by the caller (one lock for a whole batch).
  Result<const TensorEntry*> LookupLocked(Tensor t, size_t bytes, std::optional<DType> dtype,
                                          bool check_bytes = true) const;
  std::shared_ptr<Future::State> NewOp() const {
    auto st = std::make_shared<Future::State>();
    st->timeout = options_.op_timeout;
    st->driver = driver_;
    return st;
  }

  // One per ps task, then the coordinator when it runs separately. The task
  // and address are fixed by Start(); the rest belongs to the loop thread.
  std::vector<ShardConn> shards_;
  int coord_index_ = 0;
  std::unordered_map<transport::Endpoint*, int> shard_of_;
  std::unordered_map<uint64_t, PendingRequest> pending_;
  uint64_t next_request_ = 1;

  // Start-up progress, shared with the thread in Start().
  std::mutex start_mu_;
  std::condition_variable start_cv_;
  std::vector<int> start_state_;  // 0 connecting, 1 ready, -1 failed for good
  std::vector<std::string> start_error_;
  StatusCode start_code_ = StatusCode::kUnavailable;
  bool stopping_ = false;
};

Client::Impl::~Impl() {
  if (!ctx_) return;
  SayBye();
  std::promise<void> closed;
  ctx_->Post([this, &closed] {
    stopping_ = true;
    for (auto& s : shards_) {
      if (s.ep) s.ep->Close();
    }
    pending_.clear();
    // Remote regions must go before the context.
    for (auto& s : shards_) {
      s.staging.reset();
      s.arenas.clear();
      UnmapShard(s);
    }
    closed.set_value();
  });
  closed.get_future().wait();
  if (driver_) driver_->Close();
  ctx_.reset();
}

void Client::Impl::SayBye() {
  // Bounded: a shard that does not answer is closed on anyway.
  constexpr auto kByeWait = std::chrono::seconds(2);
  auto answered = std::make_shared<std::promise<void>>();
  auto remaining = std::make_shared<size_t>(0);
  ctx_->Post([this, answered, remaining] {
    for (size_t s = 0; s < shards_.size(); ++s) {
      // Only to a shard this worker proved itself to: to any other a bye
      // is a protocol breach.
      if (!shards_[s].ep || !shards_[s].dead.ok() || !shards_[s].ep->authenticated()) continue;
      ++*remaining;
      Request(static_cast<int>(s), wire::Bye{}, 0,
              [answered, remaining](const Status&, const wire::Header&, std::span<const uint8_t>) {
                if (--*remaining == 0) answered->set_value();
              });
    }
    if (*remaining == 0) answered->set_value();
  });
  answered->get_future().wait_for(kByeWait);
}

template <typename Msg>
void Client::Impl::Request(int shard, const Msg& msg, uint32_t flags, ReplyFn fn) {
  ShardConn& s = shards_[shard];
  wire::Header none;
  if ((!s.dead.ok() && !s.reconnecting) || !s.ep) {
    if (!s.dead.ok()) Reconnect(shard);  // fails this call; a later one may succeed
    return fn(s.dead.ok() ? Status::Unavailable(s.name() + " is not connected") : s.dead, none, {});
  }
  uint64_t id = next_request_++;
  pending_[id] = PendingRequest{shard, std::move(fn)};
  s.ep->Send(kProtocolMsg, wire::Encode(msg, id, flags), [this, id](const Status& st) {
    if (st.ok()) return;
    auto it = pending_.find(id);
    if (it == pending_.end()) return;
    auto cb = std::move(it->second.fn);
    pending_.erase(it);
    cb(st, wire::Header{}, {});
  });
}

template <typename Msg, typename ReplyMsg>
Result<ReplyMsg> Client::Impl::Call(int shard, const Msg& msg, std::chrono::milliseconds timeout,
                                    uint32_t flags) {
  auto promise = std::make_shared<std::promise<Result<ReplyMsg>>>();
  auto future = promise->get_future();
  auto request_id = std::make_shared<std::atomic<uint64_t>>(0);
  ctx_->Post([=, this] {
    request_id->store(next_request_);
    Request(shard, msg, flags,
            [promise](const Status& st, const wire::Header& h, std::span<const uint8_t> frame) {
              if (!st.ok()) return promise->set_value(st);
              promise->set_value(wire::DecodeBody<ReplyMsg>(h, frame));
            });
  });
  if (future.wait_for(timeout) != std::future_status::ready) {
    ctx_->Post([this, request_id] { pending_.erase(request_id->load()); });
    return Status::DeadlineExceeded(std::string(wire::OpcodeName(Msg::kOpcode)) + " to " +
                                    shards_[shard].name() + " got no answer within " +
                                    std::to_string(timeout.count()) + " ms");
  }
  return future.get();
}

void Client::Impl::OnFrame(const std::shared_ptr<transport::Endpoint>& ep,
                           std::span<const uint8_t> frame) {
  auto sit = shard_of_.find(ep.get());
  if (sit == shard_of_.end()) return;
  auto h = wire::DecodeHeader(frame);
  if (!h.ok()) {
    TLOG_WARN("bad message from {}: {}", shards_[sit->second].name(), h.status().ToString());
    return OnShardLost(sit->second, h.status().WithContext("bad message"));
  }
  auto it = pending_.find(h->request_id);
  if (it == pending_.end()) {
    if (h->opcode == wire::Opcode::kPullReply) {
      // Nobody waits for it any more (the caller gave up): hand the lease back.
      auto reply = wire::DecodeBody<wire::PullReply>(*h, frame);
      if (reply.ok()) ep->Send(kProtocolMsg, wire::Encode(wire::Release{reply->lease_id}, 0));
      return;
    }
    if (h->opcode == wire::Opcode::kError) {
      auto err = wire::DecodeBody<wire::Error>(*h, frame);
      TLOG_WARN("{}: {}", shards_[sit->second].name(), err.ok() ? err->message : "malformed error");
    }
    return;
  }
  auto fn = std::move(it->second.fn);
  pending_.erase(it);
  if (h->opcode == wire::Opcode::kError) {
    auto err = wire::DecodeBody<wire::Error>(*h, frame);
    return fn(err.ok() ? err->ToStatus() : err.status(), *h, frame);
  }
  fn(Status::Ok(), *h, frame);
}

void Client::Impl::OnShardLost(int shard, const Status& why) {
  ShardConn& s = shards_[shard];
  if (!s.dead.ok()) return;
  s.dead = Status::Unavailable(s.name() + " is gone: " + why.message());
  if (!stopping_) TLOG_ERROR("{}", s.dead.message());
  // Forced: a hung peer would never let a graceful close finish, and the
  // abort fails the one-sided operations still in flight.
  if (s.ep) s.ep->Abort();
  std::vector<ReplyFn> fail;
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->second.shard == shard) {
      fail.push_back(std::move(it->second.fn));
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto& fn : fail) fn(s.dead, wire::Header{}, {});
  auto in_flight = std::move(s.in_flight);
  s.in_flight.clear();
  for (auto& [id, abort] : in_flight) abort(s.dead);
  auto waiting = std::move(s.waiting_for_staging);
  for (auto& fn : waiting) fn();
}

Result<bool> Client::Impl::OnGpu(const void* ptr, BufferMemory said) {
  if (said == BufferMemory::kHost) return false;  // taken as said: no CUDA call
  const bool device = gpu::QueryPointer(ptr).device;
  if (said == BufferMemory::kCuda && !device) {
    return Status::InvalidArgument(std::string("the buffer was given as GPU memory, but ") +
                                   (gpu::Built()
                                        ? "CUDA does not know it as device memory (cudaMalloc it)"
                                        : "this build has no CUDA"));
  }
  return device;
}

Status Client::Impl::GpuCopyAsync(void* dst, const void* src, size_t bytes) {
  TESSERA_RETURN_IF_ERROR(gpu::SetDevice(options_.cuda_device));  // per thread
  if (stream_.handle() == nullptr) {
    auto stream = gpu::Stream::Create(options_.cuda_device);
    if (!stream.ok()) return stream.status();
    stream_ = std::move(*stream);
  }
  return gpu::Copy(dst, src, bytes, stream_);
}

Status Client::Impl::GpuWait() {
  if (stream_.handle() == nullptr) return Status::Ok();
  return stream_.Synchronize();
}

Status Client::Impl::GpuPathTo(const ShardConn& s, const std::vector<ChunkIo>& ios) const {
  if (s.ipc_slot.data() != nullptr || fabric_gpu_.ok() || options_.allow_host_staging) {
    return Status::Ok();
  }
  for (const auto& io : ios) {
    if (io.on_gpu) {
      return Status::FailedPrecondition(
          "a GPU buffer cannot move to or from " + s.name() + ": " + fabric_gpu_.message() +
          "; run this worker on the shard's node (CUDA IPC), or set "
          "ClientOptions::allow_host_staging to copy through host memory");
    }
  }
  return Status::Ok();
}

void Client::Impl::MapArena(ShardConn& s, const wire::ArenaKey& a) {
  if (a.ipc.empty() || s.ipc_slot.data() == nullptr) return;
  auto m = gpu::IpcMapping::Open(a.ipc.data(), a.ipc.size(), options_.cuda_device);
  if (!m.ok()) {
    TLOG_WARN("{}: arena {} not mapped with CUDA IPC ({}): pulls use the fabric", s.name(),
              a.arena_id, m.status().message());
    return;
  }
  s.ipc_arenas[a.arena_id] = std::move(*m);
}

void Client::Impl::UnmapShard(ShardConn& s) {
  if (s.ipc_slot.data() != nullptr) ipc_shards_--;
  s.ipc_slot = gpu::IpcMapping{};
  s.ipc_arenas.clear();
}

Status Client::Impl::Start() {
  TESSERA_RETURN_IF_ERROR(options_.cluster.Validate());
  task_ = options_.task;
  auto rank = options_.cluster.worker_rank(task_);
  if (!rank.ok()) return rank.status();
  worker_rank_ = *rank;
  TESSERA_RETURN_IF_ERROR(CheckSecretStrength(options_.secret, options_.allow_weak_secret));
  TESSERA_RETURN_IF_ERROR(LogLevelFromEnv().status());
  if (options_.chunk_bytes < 64) return Status::InvalidArgument("chunk_bytes must be at least 64");
  // Liveness fits the fabric and the host: the environment may set both
  // heartbeat times, and TESSERA_TIMEOUT_SCALE stretches them (emulation).
  auto hb_timeout = TimeoutFromEnv("TESSERA_HEARTBEAT_TIMEOUT_MS", options_.heartbeat_timeout);
  if (!hb_timeout.ok()) return hb_timeout.status();
  auto hb_interval = TimeoutFromEnv("TESSERA_HEARTBEAT_INTERVAL_MS", options_.heartbeat_interval);
  if (!hb_interval.ok()) return hb_interval.status();
  options_.heartbeat_timeout = *hb_timeout;
  options_.heartbeat_interval = *hb_interval;
  if (options_.heartbeat_timeout.count() > 0 && options_.heartbeat_interval.count() <= 0) {
    return Status::InvalidArgument("heartbeat_interval must be above 0 when heartbeats are on");
  }
  auto placement = ParsePlacementPolicy(options_.placement);
  if (!placement.ok()) return placement.status();

  transport::ContextOptions topts;
  topts.backend = options_.transport;
  topts.name = task_.job + std::to_string(task_.index);
  topts.busy_poll = options_.busy_poll;
  // The caller waiting on a Future polls for its reply itself (WaitFor). A
  // progress thread polling too, without yielding, would hold the core the
  // caller needs whenever the two share one (pinned workers do).
  topts.spin_before_sleep = std::chrono::microseconds(0);
  auto ctx = transport::Context::Open(topts);
  if (!ctx.ok()) return ctx.status();
  ctx_ = std::move(*ctx);
  fabric_gpu_ = ctx_->CanRegister(transport::MemoryKind::kCuda);
  if (options_.cuda_ipc && gpu::Available().ok()) ipc_node_id_ = NodeId();
  driver_ = std::make_shared<ProgressDriver>(ctx_.get());
  ctx_->SetHandler(kProtocolMsg, [this](const std::shared_ptr<transport::Endpoint>& ep,
                                        std::span<const uint8_t> frame) { OnFrame(ep, frame); });
  ctx_->SetDisconnectHandler(
      [this](const std::shared_ptr<transport::Endpoint>& ep, const Status& why) {
        auto it = shard_of_.find(ep.get());
        if (it != shard_of_.end()) OnShardLost(it->second, why);
      });

  // Connections: one per ps task, then the coordinator if it runs separately
  // (else ps task 0 is the coordinator).
  const int num_ps = options_.cluster.num_tasks("ps");
  const bool separate_coordinator = options_.cluster.separate_coordinator();
  const int n = num_ps + (separate_coordinator ? 1 : 0);
  coord_index_ = separate_coordinator ? num_ps : 0;
  shards_.resize(static_cast<size_t>(n));
  start_state_.assign(static_cast<size_t>(n), 0);
  start_error_.assign(static_cast<size_t>(n), "no answer yet");
  for (int i = 0; i < n; ++i) {
    shards_[i].task = i < num_ps ? TaskId{"ps", i} : options_.cluster.coordinator();
    shards_[i].addr = options_.cluster.address(shards_[i].task).value();
    // A tick may count at most two intervals of listening: a later one
    // means this process was busy, not that the shard was silent.
    shards_[i].silence = SilenceMeter(options_.heartbeat_timeout, 2 * options_.heartbeat_interval);
  }
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + options_.startup_timeout;
  ctx_->Post([this, n, deadline] {
    for (int i = 0; i < n; ++i) ConnectShard(i, deadline);
  });

  // Wait like TensorFlow did, but say for whom, and give up in the end.
  std::unique_lock<std::mutex> lock(start_mu_);
  auto next_report = start + options_.report_interval;
  while (true) {
    bool all_ready = true;
    std::string missing, failed;
    for (int i = 0; i < n; ++i) {
      if (start_state_[i] == 1) continue;
      all_ready = false;
      std::string line = shards_[i].name() + ": " + start_error_[i];
      (start_state_[i] < 0 ? failed : missing) +=
          (missing.empty() && start_state_[i] >= 0 ? "" : "; ") + line;
    }
    if (all_ready) break;
    if (!failed.empty()) return Status(start_code_, "cannot join the cluster: " + failed);
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      return Status::DeadlineExceeded("ps tasks not reachable within " +
                                      std::to_string(options_.startup_timeout.count()) +
                                      " ms: " + missing);
    }
    if (now >= next_report) {
      TLOG_INFO("{} waiting for ps tasks: {}", task_.ToString(), missing);
      next_report = now + options_.report_interval;
    }
    start_cv_.wait_until(lock, std::min(deadline, next_report));
  }
  if (options_.heartbeat_timeout.count() > 0) {
    ctx_->Post([this] {
      for (auto& conn : shards_) conn.silence.Reset(std::chrono::steady_clock::now());
      ctx_->PostAfter(options_.heartbeat_interval, [this] { Heartbeat(); });
    });
  }
  TLOG_INFO("{} connected to {} ps task(s){} over {}", task_.ToString(), num_ps,
            separate_coordinator ? " and the coordinator" : "", ctx_->Describe());
  return Status::Ok();
}

void Client::Impl::Heartbeat() {
  if (stopping_) return;
  // The event loop polled the fabric until idle before running this timer,
  // so whatever the shards sent meanwhile has been seen.
  const auto now = std::chrono::steady_clock::now();
  const auto late = now - next_heartbeat_;
  if (next_heartbeat_.time_since_epoch().count() != 0 && late > options_.heartbeat_timeout) {
    // Worth knowing (it explains slow calls), and not held against the
    // shards: the silence meters count at most two intervals for it.
    TLOG_WARN("{}: this worker's progress loop was held up for {} ms; heartbeats resume",
              task_.ToString(),
              std::chrono::duration_cast<std::chrono::milliseconds>(late).count());
  }
  next_heartbeat_ = now + options_.heartbeat_interval;
  for (int i = 0; i < static_cast<int>(shards_.size()); ++i) {
    ShardConn& s = shards_[i];
    if (!s.dead.ok()) {
      Reconnect(i);
      continue;
    }
    if (!s.ep) continue;
    if (s.silence.Tick(now, s.ep->last_traffic())) {
      OnShardLost(
          i, Status::DeadlineExceeded("no answer to heartbeats and no traffic at all for " +
                                      std::to_string(s.silence.silent().count()) +
                                      " ms of listening (heartbeat timeout " +
                                      std::to_string(options_.heartbeat_timeout.count()) + " ms)"));
      continue;
    }
    Request(i, wire::Ping{}, 0,
            [](const Status&, const wire::Header&, std::span<const uint8_t>) {});
  }
  ctx_->PostAfter(options_.heartbeat_interval, [this] { Heartbeat(); });
}

void Client::Impl::ConnectShard(int shard, std::chrono::steady_clock::time_point deadline) {
  if (stopping_) return;
  ShardConn& s = shards_[shard];
  auto attempt = std::chrono::milliseconds(2000);
  ctx_->Connect(s.addr.host, s.addr.port, attempt,
                [this, shard, deadline](Result<std::shared_ptr<transport::Endpoint>> ep) {
                  // A connect the closing context cancels: ctx_ is going.
                  if (stopping_) return;
                  if (!ep.ok()) {
                    {
                      std::lock_guard<std::mutex> lock(start_mu_);
                      start_error_[shard] = ep.status().message();
                    }
                    if (std::chrono::steady_clock::now() < deadline) {
                      ctx_->PostAfter(std::chrono::milliseconds(300),
                                      [this, shard, deadline] { ConnectShard(shard, deadline); });
                    }
                    return;
                  }
                  ShardConn& conn = shards_[shard];
                  conn.ep = *ep;
                  conn.dead = Status::Ok();
                  shard_of_[conn.ep.get()] = shard;
                  Handshake(shard, [this, shard](const Status& st) {
                    {
                      std::lock_guard<std::mutex> lock(start_mu_);
                      start_state_[shard] = st.ok() ? 1 : -1;
                      if (!st.ok()) {
                        start_error_[shard] = st.message();
                        start_code_ = st.code();
                      }
                    }
                    start_cv_.notify_all();
                    if (!st.ok()) OnShardLost(shard, st);
                  });
                });
}

void Client::Impl::Reconnect(int shard) {
  ShardConn& s = shards_[shard];
  const auto now = std::chrono::steady_clock::now();
  if (stopping_ || s.reconnecting || shard == coord_index_ || s.dead.ok() ||
      now < s.next_reconnect) {
    return;
  }
  s.next_reconnect = now + std::chrono::seconds(1);
  s.reconnecting = true;
  ctx_->Connect(s.addr.host, s.addr.port, std::chrono::milliseconds(2000),
                [this, shard](Result<std::shared_ptr<transport::Endpoint>> ep) {
                  ShardConn& conn = shards_[shard];
                  if (!ep.ok() || stopping_) {
                    conn.reconnecting = false;
                    return;
                  }
                  // The old connection's regions go with it.
                  conn.staging.reset();
                  conn.arenas.clear();
                  UnmapShard(conn);
                  if (conn.ep) shard_of_.erase(conn.ep.get());
                  conn.ep = *ep;
                  shard_of_[conn.ep.get()] = shard;
                  conn.silence.Reset(std::chrono::steady_clock::now());
                  Handshake(shard, [this, shard](const Status& st) {
                    if (!st.ok()) {
                      TLOG_WARN("{} answers again but refused this worker: {}",
                                shards_[shard].name(), st.message());
                      shards_[shard].reconnecting = false;
                      if (shards_[shard].ep) shards_[shard].ep->Abort();
                      return;
                    }
                    ReCreate(shard);
                  });
                });
}

void Client::Impl::ReCreate(int shard) {
  wire::Create create;
  std::vector<Chunk*> chunks;
  {
    std::lock_guard<std::mutex> lock(tensors_mu_);
    for (auto& e : tensors_) {
      for (uint32_t c = 0; c < e.chunks.size(); ++c) {
        Chunk& chunk = e.chunks[c];
        if (chunk.shard != shard) continue;
        wire::CreateEntry ce;
        ce.tensor = e.decl;
        ce.chunk_index = c;
        ce.num_chunks = static_cast<uint32_t>(e.chunks.size());
        ce.elem_offset = chunk.elem_offset;
        ce.elem_count = chunk.elem_count;
        create.entries.push_back(std::move(ce));
        chunks.push_back(&chunk);
      }
    }
  }
  auto finish = [this, shard](const Status& st) {
    ShardConn& conn = shards_[shard];
    conn.reconnecting = false;
    if (!st.ok()) {
      TLOG_WARN("{}: re-creating this worker's tensors failed: {}", conn.name(), st.message());
      if (conn.ep) conn.ep->Abort();
      return;
    }
    conn.dead = Status::Ok();
    TLOG_INFO("{} is back; this worker's tensors on it were created again", conn.name());
  };
  if (create.entries.empty()) return finish(Status::Ok());
  Request(shard, create, 0,
          [this, shard, chunks, finish](const Status& st, const wire::Header& h,
                                        std::span<const uint8_t> frame) {
            if (!st.ok()) return finish(st);
            auto reply = wire::DecodeBody<wire::CreateReply>(h, frame);
            if (!reply.ok()) return finish(reply.status());
            if (reply->keys.size() != chunks.size())
              return finish(Status::Internal("create reply does not match the request"));
            ShardConn& conn = shards_[shard];
            for (const auto& a : reply->arenas) {
              auto r = conn.ep->Attach(a.region);
              if (!r.ok()) return finish(r.status());
              conn.arenas[a.arena_id] = std::move(*r);
              MapArena(conn, a);
            }
            for (size_t k = 0; k < chunks.size(); ++k) {
              if (reply->keys[k].byte_length != chunks[k]->bytes)
                return finish(Status::Internal("shard holds a chunk of another size"));
              chunks[k]->key_id = reply->keys[k].key_id;
              chunks[k]->arena_id = reply->keys[k].arena_id;
              chunks[k]->arena_offset = reply->keys[k].arena_offset;
            }
            finish(Status::Ok());
          });
}

void Client::Impl::Handshake(int shard, std::function<void(Status)> done) {
  auto fail = std::move(done);  // called once: with the error, or OK when welcomed
  wire::Hello hello;
  hello.worker_rank = static_cast<uint32_t>(worker_rank_);
  hello.task = task_.ToString();
  hello.node_id = ipc_node_id_;
  hello.cluster = options_.cluster.ToJson();
  auto handshake = std::make_shared<wire::ClientHandshake>(options_.secret, std::move(hello));
  Request(shard, handshake->hello(), 0,
          [this, shard, handshake, fail](const Status& st, const wire::Header& h,
                                         std::span<const uint8_t> frame) {
            if (!st.ok()) return fail(st);
            auto c = wire::DecodeBody<wire::Challenge>(h, frame);
            if (!c.ok()) return fail(c.status());
            Request(
                shard, handshake->Answer(*c), 0,
                [this, shard, handshake, fail](const Status& st2, const wire::Header& h2,
                                               std::span<const uint8_t> f2) {
                  if (!st2.ok()) return fail(st2);
                  auto w = wire::DecodeBody<wire::Welcome>(h2, f2);
                  if (!w.ok()) return fail(w.status());
                  ShardConn& s = shards_[shard];
                  const uint32_t expect_index = shard == coord_index_ && s.task.job == "coordinator"
                                                    ? wire::kCoordinatorIndex
                                                    : static_cast<uint32_t>(shard);
                  if (Status proven = handshake->CheckWelcome(*w, expect_index, s.name());
                      !proven.ok()) {
                    return fail(proven);
                  }
                  s.ep->MarkAuthenticated();
                  if (s.task.job == "ps") {  // the coordinator has no staging slot
                    auto staging = s.ep->Attach(w->staging_region);
                    if (!staging.ok()) return fail(staging.status());
                    if (AlignUp(options_.chunk_bytes, 64) > (*staging)->size()) {
                      return fail(Status::InvalidArgument(
                          "chunk_bytes " + std::to_string(options_.chunk_bytes) + " exceeds the " +
                          std::to_string((*staging)->size()) + "-byte staging slot of " + s.name() +
                          "; lower chunk_bytes or start the shard with a larger --staging-mib"));
                    }
                    s.alloc.Reset((*staging)->size());
                    s.staging = std::move(*staging);
                    if (!w->staging_ipc.empty()) {
                      auto slot = gpu::IpcMapping::Open(
                          w->staging_ipc.data(), w->staging_ipc.size(), options_.cuda_device);
                      if (slot.ok()) {
                        s.ipc_slot = std::move(*slot);
                        ipc_shards_++;
                        TLOG_INFO("{} shares this node: reached through CUDA IPC", s.name());
                      } else {
                        TLOG_WARN("{} offered CUDA IPC, which failed ({}): using the fabric",
                                  s.name(), slot.status().message());
                      }
                    }
                  }
                  fail(Status::Ok());  // i.e. done
                });
          });
}

Result<const Client::Impl::TensorEntry*> Client::Impl::Lookup(Tensor t, size_t bytes,
                                                              std::optional<DType> dtype,
                                                              bool check_bytes) const {
  std::lock_guard<std::mutex> lock(tensors_mu_);
  return LookupLocked(t, bytes, dtype, check_bytes);
}

Result<const Client::Impl::TensorEntry*> Client::Impl::LookupLocked(Tensor t, size_t bytes,
                                                                    std::optional<DType> dtype,
                                                                    bool check_bytes) const {
  if (t.index >= tensors_.size()) {
    return Status::InvalidArgument("tensor handle " + std::to_string(t.index) +
                                   " was not declared by this client");
  }
  const TensorEntry* e = &tensors_[t.index];
  if (dtype && *dtype != e->spec.dtype) {
    return Status::InvalidArgument("tensor '" + e->spec.name + "' is " +
                                   DescribeTensor(e->spec.dtype, e->spec.shape) + ", not " +
                                   DTypeName(*dtype));
  }
  if (check_bytes && bytes != e->bytes) {
    return Status::InvalidArgument(
        "tensor '" + e->spec.name + "' is " + DescribeTensor(e->spec.dtype, e->spec.shape) + " = " +
        std::to_string(e->bytes) + " bytes, but the buffer has " + std::to_string(bytes));
  }
  return e;
}

Result<std::vector<Tensor>> Client::Impl::DeclareMany(const std::vector<TensorSpec>& specs) {
  wire::Declare declare;
  declare.chunk_bytes = options_.chunk_bytes;
  declare.placement = static_cast<uint8_t>(ParsePlacementPolicy(options_.placement).value());
  for (const auto& spec : specs) {
    if (spec.name.empty() || spec.name.size() > wire::kMaxNameLength) {
      return Status::InvalidArgument("tensor name must have 1 to 1024 bytes");
    }
    if (!IsValidDType(static_cast<uint8_t>(spec.dtype))) {
      return Status::InvalidArgument("tensor '" + spec.name + "': invalid dtype");
    }
    if (spec.shape.size() > wire::kMaxDims) {
      return Status::InvalidArgument("tensor '" + spec.name + "': more than 8 dimensions");
    }
    auto n = NumElements(spec.shape);
    if (!n.ok()) return n.status().WithContext("tensor '" + spec.name + "'");
    uint64_t bytes = *n * DTypeSize(spec.dtype);
    if (!spec.initial.empty() && spec.initial.size() != bytes) {
      return Status::InvalidArgument(
          "tensor '" + spec.name + "': initial value has " + std::to_string(spec.initial.size()) +
          " bytes, " + DescribeTensor(spec.dtype, spec.shape) + " needs " + std::to_string(bytes));
    }
    TESSERA_RETURN_IF_ERROR(spec.hyper.Validate().WithContext("tensor '" + spec.name + "'"));
    if (spec.initial.empty() && spec.initializer.kind != Initializer::Kind::kZeros) {
      // Check the initializer fits now, not when the chief initialises.
      auto probe = InitialValue(spec.initializer, spec.name, spec.dtype, {});
      if (!probe.ok()) return probe.status();
    }
    ConsistencyMode mode = spec.mode;
    if (mode.kind != Consistency::kAsync) {
      if (mode.total_num_replicas == 0) {
        mode.total_num_replicas = static_cast<uint32_t>(options_.cluster.num_workers());
      }
      if (mode.kind == Consistency::kSync && mode.replicas_to_aggregate == 0) {
        mode.replicas_to_aggregate = mode.total_num_replicas;
      }
      if (mode.total_num_replicas > static_cast<uint32_t>(options_.cluster.num_workers())) {
        return Status::InvalidArgument("tensor '" + spec.name + "': total_num_replicas " +
                                       std::to_string(mode.total_num_replicas) +
                                       " exceeds the cluster's " +
                                       std::to_string(options_.cluster.num_workers()) + " workers");
      }
    }
    declare.tensors.push_back(
        {spec.name, spec.dtype, spec.rule, spec.shape, spec.pinned_shard, spec.hyper, mode});
    TESSERA_RETURN_IF_ERROR(wire::ValidateTensorDecl(declare.tensors.back()));
    TESSERA_RETURN_IF_ERROR(ckpt::CheckNotSlotName(spec.name));
  }
  auto placed = Call<wire::Declare, wire::DeclareReply>(coord_index_, declare, options_.op_timeout);
  if (!placed.ok()) return placed.status();
  if (placed->tensors.size() != specs.size())
    return Status::Internal("declare reply does not match the request");

  std::vector<TensorEntry> entries(specs.size());
  std::vector<wire::Create> creates(shards_.size());
  std::vector<std::vector<std::pair<size_t, size_t>>> owners(shards_.size());  // (tensor, chunk)
  for (size_t i = 0; i < specs.size(); ++i) {
    TensorEntry& e = entries[i];
    e.spec = specs[i];
    e.restored = i < placed->restored.size() && placed->restored[i] == 1;
    e.initialized = i < placed->initialized.size() && placed->initialized[i] == 1;
    e.decl = declare.tensors[i];
    const size_t esize = DTypeSize(e.spec.dtype);
    e.bytes = NumElements(e.spec.shape).value() * esize;
    const auto& chunks = placed->tensors[i];
    for (size_t c = 0; c < chunks.size(); ++c) {
      const auto& pc = chunks[c];
      if (pc.shard >= shards_.size())
        return Status::Internal("coordinator placed a chunk on an unknown shard");
      e.chunks.push_back({static_cast<int>(pc.shard), pc.elem_offset, pc.elem_count,
                          pc.elem_offset * esize, pc.elem_count * esize});
      wire::CreateEntry ce;
      ce.tensor = declare.tensors[i];
      ce.chunk_index = static_cast<uint32_t>(c);
      ce.num_chunks = static_cast<uint32_t>(chunks.size());
      ce.elem_offset = pc.elem_offset;
      ce.elem_count = pc.elem_count;
      creates[pc.shard].entries.push_back(std::move(ce));
      owners[pc.shard].emplace_back(i, c);
    }
  }
  for (size_t s = 0; s < shards_.size(); ++s) {
    if (creates[s].entries.empty()) continue;
    auto reply =
        Call<wire::Create, wire::CreateReply>(static_cast<int>(s), creates[s], options_.op_timeout);
    if (!reply.ok()) return reply.status();
    if (reply->keys.size() != owners[s].size())
      return Status::Internal("create reply does not match the request");
    // Attach arenas on the loop thread, where the endpoint lives.
    std::promise<Status> attached;
    ctx_->Post([&] {
      for (const auto& a : reply->arenas) {
        auto r = shards_[s].ep ? shards_[s].ep->Attach(a.region)
                               : Result<std::unique_ptr<transport::RemoteRegion>>(shards_[s].dead);
        if (!r.ok()) return attached.set_value(r.status());
        shards_[s].arenas[a.arena_id] = std::move(*r);
        MapArena(shards_[s], a);
      }
      attached.set_value(Status::Ok());
    });
    TESSERA_RETURN_IF_ERROR(attached.get_future().get());
    for (size_t k = 0; k < reply->keys.size(); ++k) {
      auto [ti, ci] = owners[s][k];
      Chunk& chunk = entries[ti].chunks[ci];
      const auto& loc = reply->keys[k];
      if (loc.byte_length != chunk.bytes)
        return Status::Internal("shard holds a chunk of another size");
      chunk.key_id = loc.key_id;
      chunk.arena_id = loc.arena_id;
      chunk.arena_offset = loc.arena_offset;
    }
  }

  std::vector<Tensor> out;
  std::lock_guard<std::mutex> lock(tensors_mu_);
  for (const auto& e : entries) {
    if (e.restored) restored_step_ = placed->restored_step;
  }
  for (auto& e : entries) {
    auto it = by_name_.find(e.spec.name);
    if (it != by_name_.end()) {
      out.push_back({it->second});
      continue;
    }
    uint32_t index = static_cast<uint32_t>(tensors_.size());
    by_name_[e.spec.name] = index;
    tensors_.push_back(std::move(e));
    out.push_back({index});
  }
  return out;
}

void Client::Impl::NoteOutcomes(const std::vector<uint8_t>& outcomes, const ChunkIo* ios,
                                uint64_t step, Future::State* op) {
  for (size_t i = 0; i < outcomes.size(); ++i) {
    DroppedChunk::Why why;
    if (outcomes[i] == static_cast<uint8_t>(wire::PushOutcome::kStale)) {
      dropped_stale_++;
      why = DroppedChunk::Why::kStale;
    } else if (outcomes[i] == static_cast<uint8_t>(wire::PushOutcome::kDuplicate)) {
      dropped_duplicate_++;
      why = DroppedChunk::Why::kDuplicate;
    } else {
      continue;
    }
    if (op == nullptr) continue;
    const ChunkIo& io = ios[i];
    std::lock_guard<std::mutex> lock(op->mu);
    op->dropped.push_back({io.tensor->spec.name,
                           static_cast<uint32_t>(io.chunk - io.tensor->chunks.data()), step, why});
  }
}

Result<wire::Push> Client::Impl::InlinePush(const std::vector<ChunkIo>& ios, PushStep tag) {
  uint64_t raw = 0;
  for (const auto& io : ios) raw += io.chunk->bytes;
  wire::Push msg;
  msg.step = tag.step;
  msg.step_parts = tag.parts;
  msg.entries.reserve(ios.size());
  msg.payload.reserve(raw);
  bool from_gpu = false;
  for (const auto& io : ios) {
    const size_t at = msg.payload.size();
    msg.entries.push_back({io.chunk->key_id, at, io.chunk->bytes});
    if (!io.on_gpu) {
      msg.payload.insert(msg.payload.end(), io.local, io.local + io.chunk->bytes);
      continue;
    }
    msg.payload.resize(at + io.chunk->bytes);
    if (Status st = GpuCopyAsync(msg.payload.data() + at, io.local, io.chunk->bytes); !st.ok()) {
      return st.WithContext("push from GPU memory");
    }
    gpu_inline_bytes_ += io.chunk->bytes;
    from_gpu = true;
  }
  if (from_gpu) TESSERA_RETURN_IF_ERROR(GpuWait().WithContext("push from GPU memory"));
  return msg;
}

void Client::Impl::PushToShard(int shard, std::vector<ChunkIo> ios, uint32_t flags, PushStep tag,
                               std::shared_ptr<Future::State> op,
                               std::function<void(Status, std::vector<uint64_t>)> done) {
  const uint64_t step = tag.step;
  ShardConn& s = shards_[shard];
  if (!s.dead.ok()) {
    Reconnect(shard);  // fails this call; a later one may succeed
    return done(s.dead, {});
  }
  auto on_reply = [this, step, op](
                      std::vector<ChunkIo> sent,
                      const std::function<void(Status, std::vector<uint64_t>)>& finish) {
    return [this, step, op, sent = std::move(sent), finish](const Status& st, const wire::Header& h,
                                                            std::span<const uint8_t> frame) {
      if (!st.ok()) return finish(st, {});
      auto reply = wire::DecodeBody<wire::PushReply>(h, frame);
      if (!reply.ok()) return finish(reply.status(), {});
      if (reply->outcomes.size() > sent.size()) {
        return finish(Status::Internal("push reply does not match the request"), {});
      }
      NoteOutcomes(reply->outcomes, sent.data(), step, op.get());
      finish(Status::Ok(), std::move(reply->versions));
    };
  };
  if (TravelsInline(ios)) {
    // Small: the bytes ride in the push-done itself.
    auto msg = InlinePush(ios, tag);
    if (!msg.ok()) return done(msg.status(), {});
    return Request(shard, *msg, flags, on_reply(std::move(ios), done));
  }
  if (Status st = GpuPathTo(s, ios); !st.ok()) return done(st.WithContext("push"), {});
  uint64_t total = 0;
  for (const auto& io : ios) total += AlignUp(io.chunk->bytes, 64);
  if (total > s.alloc.size()) {
    // Larger than the whole slot: send in parts, each within the slot.
    std::vector<ChunkIo> first, rest;
    uint64_t used = 0;
    for (auto& io : ios) {
      uint64_t b = AlignUp(io.chunk->bytes, 64);
      if (b > s.alloc.size()) {
        return done(Status::InvalidArgument("a chunk of " + std::to_string(io.chunk->bytes) +
                                            " bytes exceeds the staging slot on " + s.name()),
                    {});
      }
      (used + b <= s.alloc.size() && rest.empty() ? first : rest).push_back(io);
      if (rest.empty()) used += b;
    }
    auto versions = std::make_shared<std::vector<uint64_t>>();
    PushToShard(shard, std::move(first), flags, tag, op,
                [this, shard, rest = std::move(rest), flags, step, op, versions, done](
                    const Status& st, const std::vector<uint64_t>& v) mutable {
                  if (!st.ok()) return done(st, {});
                  versions->insert(versions->end(), v.begin(), v.end());
                  PushToShard(shard, std::move(rest), flags, PushStep{step, 0}, op,
                              [versions, done](const Status& st2, std::vector<uint64_t> v2) {
                                versions->insert(versions->end(), v2.begin(), v2.end());
                                done(st2, std::move(*versions));
                              });
                });
    return;
  }
  auto offset = s.alloc.Allocate(total);
  if (!offset) {
    // Wait for earlier pushes to this shard to free their staging space.
    s.waiting_for_staging.push_back(
        [this, shard, ios = std::move(ios), flags, tag, op, done]() mutable {
          PushToShard(shard, std::move(ios), flags, tag, op, std::move(done));
        });
    return;
  }
  // Pipelined: the entries go in groups of about kGroupBytes (never splitting
  // a tensor, whose chunks here must apply at once), and each group's
  // push-done is sent as soon as its puts are complete at the shard, so the
  // shard applies one group while the next is still on the wire.
  constexpr uint64_t kGroupBytes = 1u << 20;
  struct Group {
    wire::Push msg;
    size_t first = 0;  // index of its first entry among `ios`
    int outstanding = 0;
  };
  struct Progress {
    size_t groups_left = 0;
    Status status;
    bool finished = false;
    std::vector<uint64_t> versions;
    std::vector<ChunkIo> sent;  // `ios`, once the groups are laid out
  };
  auto progress = std::make_shared<Progress>();
  progress->versions.resize(ios.size());
  const uint64_t base = s.staging->base();
  const uint64_t op_id = s.next_op++;
  // Runs once: when every group is answered, on a failure, or when the shard
  // is lost.
  auto finish = [this, shard, op_id, progress, off = *offset, done](
                    const Status& st, std::vector<uint64_t> versions) {
    if (progress->finished) return;
    progress->finished = true;
    ShardConn& conn = shards_[shard];
    conn.in_flight.erase(op_id);
    conn.alloc.Free(off);
    if (!conn.waiting_for_staging.empty()) {
      auto next = std::move(conn.waiting_for_staging.front());
      conn.waiting_for_staging.pop_front();
      next();
    }
    done(st, std::move(versions));
  };
  s.in_flight[op_id] = [finish](const Status& why) { finish(why, {}); };

  if (s.ipc_slot.data() != nullptr) {
    // Same node, GPU shard: copy straight into the mapped slot (from GPU or
    // host memory), wait for the copies, then say so in one push-done.
    wire::Push msg;
    msg.step = step;
    msg.step_parts = tag.parts;
    uint64_t rel = *offset, bytes = 0;
    Status st;
    for (const auto& io : ios) {
      msg.entries.push_back({io.chunk->key_id, rel, io.chunk->bytes});
      if (st.ok()) st = GpuCopyAsync(s.ipc_slot.data() + rel, io.local, io.chunk->bytes);
      rel += AlignUp(io.chunk->bytes, 64);
      bytes += io.chunk->bytes;
    }
    if (st.ok()) st = GpuWait();
    if (!st.ok())
      return finish(st.WithContext("copying into the CUDA IPC slot of " + s.name()), {});
    ipc_bytes_ += bytes;
    return Request(
        shard, msg, flags | wire::kFlagIpcSlot,
        on_reply(std::move(ios), [finish](const Status& st2, std::vector<uint64_t> versions) {
          finish(st2, std::move(versions));
        }));
  }
  // A fabric that cannot reach GPU memory, and the user allowed staging:
  // the GPU chunks are copied to host memory first (counted).
  std::shared_ptr<std::vector<uint8_t>> bounce;
  if (!fabric_gpu_.ok()) {
    uint64_t need = 0;
    for (const auto& io : ios) need += io.on_gpu ? io.chunk->bytes : 0;
    if (need > 0) {
      bounce = std::make_shared<std::vector<uint8_t>>(need);
      uint64_t at = 0;
      Status st;
      for (auto& io : ios) {
        if (!io.on_gpu) continue;
        if (st.ok()) st = GpuCopyAsync(bounce->data() + at, io.local, io.chunk->bytes);
        io.local = bounce->data() + at;
        at += io.chunk->bytes;
      }
      if (st.ok()) st = GpuWait();
      if (!st.ok()) return finish(st.WithContext("staging a GPU buffer through host memory"), {});
      staged_bytes_ += need;
    }
  }

  progress->sent = std::move(ios);
  const std::vector<ChunkIo>& sent = progress->sent;
  std::vector<std::shared_ptr<Group>> groups;
  uint64_t rel = *offset, group_bytes = 0;
  for (size_t i = 0; i < sent.size(); ++i) {
    const bool same_tensor = i > 0 && sent[i].tensor == sent[i - 1].tensor;
    if (groups.empty() || (group_bytes >= kGroupBytes && !same_tensor)) {
      groups.push_back(std::make_shared<Group>());
      groups.back()->msg.step = step;
      groups.back()->msg.step_parts = groups.size() == 1 ? tag.parts : 0;
      groups.back()->first = i;
      group_bytes = 0;
    }
    groups.back()->msg.entries.push_back({sent[i].chunk->key_id, rel, sent[i].chunk->bytes});
    rel += AlignUp(sent[i].chunk->bytes, 64);
    group_bytes += sent[i].chunk->bytes;
  }
  progress->groups_left = groups.size();
  auto send = [this, shard, flags, step, op, progress, finish](const std::shared_ptr<Group>& g) {
    if (progress->finished) return;
    if (!progress->status.ok()) return finish(ShardError(shard, progress->status), {});
    Request(shard, g->msg, flags,
            [this, step, op, progress, finish, g](const Status& st, const wire::Header& h,
                                                  std::span<const uint8_t> frame) {
              if (!st.ok()) return finish(st, {});
              auto reply = wire::DecodeBody<wire::PushReply>(h, frame);
              if (!reply.ok()) return finish(reply.status(), {});
              if (reply->versions.size() != g->msg.entries.size() ||
                  reply->outcomes.size() > g->msg.entries.size()) {
                return finish(Status::Internal("push reply does not match the request"), {});
              }
              NoteOutcomes(reply->outcomes, &progress->sent[g->first], step, op.get());
              std::copy(reply->versions.begin(), reply->versions.end(),
                        progress->versions.begin() + static_cast<std::ptrdiff_t>(g->first));
              if (--progress->groups_left == 0) finish(Status::Ok(), std::move(progress->versions));
            });
  };
  // The shard reads the slot once the push message arrives: this group's
  // puts (and every earlier one) must have landed by then. On an endpoint
  // that serves its stream in order they have, and the message follows the
  // puts at once; elsewhere a flush waits for them first. Either way the
  // reply comes after the puts' completions, so the buffers they read
  // (`bounce`, if any) outlive them.
  const bool ordered = s.ep->PutsLandBeforeLaterMessages();
  for (const auto& g : groups) {
    g->outstanding = ordered ? 1 : static_cast<int>(g->msg.entries.size()) + 1;
    auto put_done = [progress, bounce](const Status& st) {
      (void)bounce;
      if (!st.ok() && progress->status.ok()) progress->status = st;
    };
    auto one_done = [put_done, send, g](const Status& st) {
      put_done(st);
      if (--g->outstanding == 0) send(g);
    };
    for (size_t k = 0; k < g->msg.entries.size(); ++k) {
      const auto& e = g->msg.entries[k];
      s.ep->Put(sent[g->first + k].local, e.byte_length, *s.staging, base + e.staging_offset,
                ordered ? transport::Completion(put_done) : transport::Completion(one_done));
    }
    if (ordered) {
      one_done(Status::Ok());
    } else {
      s.ep->Flush(one_done);
    }
  }
}

void Client::Impl::PullFromShard(int shard, std::vector<ChunkIo> ios,
                                 const std::function<void(Status)>& done) {
  if (Status st = GpuPathTo(shards_[shard], ios); !st.ok()) return done(st.WithContext("pull"));
  wire::Pull msg;
  for (const auto& io : ios) msg.entries.push_back({io.chunk->key_id, io.min_version, io.min_step});
  msg.inline_max = static_cast<uint32_t>(std::min(options_.inline_bytes, wire::kMaxInlineBytes));
  msg.wait_ms = ShardWaitMs(options_.op_timeout);
  Request(shard, msg, 0,
          [this, shard, ios = std::move(ios), done](const Status& st, const wire::Header& h,
                                                    std::span<const uint8_t> frame) {
            if (!st.ok()) return done(st);
            auto reply = wire::DecodeBody<wire::PullReply>(h, frame);
            if (!reply.ok()) return done(reply.status());
            AcceptPullReply(shard, std::move(ios), std::move(*reply), done);
          });
}

void Client::Impl::AcceptPullReply(int shard, std::vector<ChunkIo> ios, wire::PullReply reply,
                                   const std::function<void(Status)>& done) {
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
        gpu_inline_bytes_ += io.chunk->bytes;
        to_gpu = true;
      } else {
        std::memcpy(io.local, src, io.chunk->bytes);
      }
      src += io.chunk->bytes;
    }
    // The reply's bytes must stay until the copies are done.
    return done(to_gpu ? GpuWait().WithContext("pull into GPU memory") : Status::Ok());
  }
  ShardConn& s = shards_[shard];
  struct Progress {
    int outstanding;
    Status status;
    bool finished = false;
  };
  auto progress = std::make_shared<Progress>(Progress{static_cast<int>(ios.size()), Status::Ok()});
  uint64_t lease = reply.lease_id;
  const uint64_t op_id = s.next_op++;
  auto finish = [this, shard, op_id, progress, done](const Status& result) {
    if (progress->finished) return;
    progress->finished = true;
    shards_[shard].in_flight.erase(op_id);
    done(result);
  };
  s.in_flight[op_id] = finish;
  // Same node, GPU shard: device copies out of the mapped arenas. Else,
  // GPU chunks on a fabric that cannot reach GPU memory are read into
  // host memory and copied up once the gets are done (counted).
  std::shared_ptr<std::vector<uint8_t>> bounce;
  std::vector<std::pair<uint8_t*, size_t>> bounce_to;  // (GPU destination, bytes)
  bool all_mapped = !ios.empty();
  for (const auto& io : ios) all_mapped &= s.ipc_arenas.count(io.chunk->arena_id) > 0;
  if (all_mapped) {
    Status copied;
    uint64_t bytes = 0;
    for (const auto& io : ios) {
      const uint8_t* src = s.ipc_arenas.at(io.chunk->arena_id).data() + io.chunk->arena_offset;
      if (copied.ok()) copied = GpuCopyAsync(io.local, src, io.chunk->bytes);
      bytes += io.chunk->bytes;
    }
    if (copied.ok()) copied = GpuWait();
    ipc_bytes_ += copied.ok() ? bytes : 0;
    if (s.dead.ok() && s.ep) s.ep->Send(kProtocolMsg, wire::Encode(wire::Release{lease}, 0));
    return finish(copied.WithContext("copying from the CUDA IPC mapping of " + s.name()));
  }
  std::vector<uint8_t*> into;  // where each get lands, when some are staged
  if (!fabric_gpu_.ok()) {
    uint64_t need = 0;
    for (const auto& io : ios) need += io.on_gpu ? io.chunk->bytes : 0;
    if (need > 0) {
      bounce = std::make_shared<std::vector<uint8_t>>(need);
      uint64_t at = 0;
      for (const auto& io : ios) {
        into.push_back(io.on_gpu ? bounce->data() + at : io.local);
        if (!io.on_gpu) continue;
        bounce_to.emplace_back(io.local, io.chunk->bytes);
        at += io.chunk->bytes;
      }
    }
  }
  auto step = [this, shard, progress, lease, finish, bounce,
               bounce_to = std::move(bounce_to)](const Status& st2) {
    if (!st2.ok() && progress->status.ok()) progress->status = st2;
    if (--progress->outstanding > 0) return;
    if (bounce && progress->status.ok()) {
      const uint8_t* src = bounce->data();
      Status up;
      for (const auto& [dst, n] : bounce_to) {
        if (up.ok()) up = GpuCopyAsync(dst, src, n);
        src += n;
      }
      if (up.ok()) up = GpuWait();
      if (up.ok()) staged_bytes_ += bounce->size();
      progress->status = up.WithContext("staging into GPU memory through host memory");
    }
    // The bytes are ours: let the shard update them again.
    ShardConn& conn = shards_[shard];
    if (conn.dead.ok() && conn.ep)
      conn.ep->Send(kProtocolMsg, wire::Encode(wire::Release{lease}, 0));
    finish(progress->status.ok() ? progress->status : ShardError(shard, progress->status));
  };
  for (size_t i = 0; i < ios.size(); ++i) {
    const Chunk* chunk = ios[i].chunk;
    auto arena = s.arenas.find(chunk->arena_id);
    if (arena == s.arenas.end()) {
      step(Status::Internal("no key for arena " + std::to_string(chunk->arena_id) + " of " +
                            s.name()));
      continue;
    }
    s.ep->Get(into.empty() ? ios[i].local : into[i], chunk->bytes, *arena->second,
              arena->second->base() + chunk->arena_offset, step);
  }
}

Future Client::Impl::Push(const std::vector<PushItem>& items, uint32_t flags,
                          std::optional<uint64_t> tagged_step) {
  const uint64_t step = tagged_step.value_or(0);
  std::vector<std::vector<ChunkIo>> by_shard(shards_.size());
  {
    std::lock_guard<std::mutex> lock(tensors_mu_);
    for (const auto& item : items) {
      auto on_gpu = OnGpu(item.data, item.memory);
      if (!on_gpu.ok()) return FailedFuture(on_gpu.status().WithContext("push"));
      auto e = LookupLocked(item.tensor, item.bytes, item.dtype);
      if (!e.ok()) {
        return FailedFuture(e.status().WithContext(*on_gpu ? "push from GPU memory" : "push"));
      }
      const bool sync_tensor = (*e)->spec.mode.kind == Consistency::kSync;
      if (sync_tensor && !tagged_step && !(flags & wire::kFlagInit)) {
        // Untagged, it would count as step 0, and the worker's real step-0
        // push would then be dropped as stale.
        return FailedFuture(Status::InvalidArgument(
            "push to tensor '" + (*e)->spec.name + "', which is " +
            ConsistencyName((*e)->spec.mode.kind) +
            ", without a step: use Push(items, step) with the worker's step"));
      }
      if (Status st = CheckPart(item.chunks, **e); !st.ok()) return FailedFuture(st);
      for (size_t i = 0; i < (*e)->chunks.size(); ++i) {
        if (i % item.chunks.parts != item.chunks.part) continue;
        const Chunk& c = (*e)->chunks[i];
        auto& list = by_shard[c.shard];
        if (list.empty()) list.reserve(items.size());
        list.push_back(
            {&c, const_cast<uint8_t*>(static_cast<const uint8_t*>(item.data)) + c.byte_offset, 0, 0,
             *e, *on_gpu});
      }
    }
  }
  auto op = NewOp();
  op->Add(1);  // held until every part is issued
  // The shards count the global step (never the chief's init): an async
  // push on the part to its lowest-numbered shard, a sync push on every part
  // holding a sync tensor, each saying how many there are.
  std::vector<uint32_t> step_parts(by_shard.size(), 0);
  if (!(flags & wire::kFlagInit)) {
    uint32_t sync_parts = 0;
    for (size_t s = 0; s < by_shard.size(); ++s) {
      for (const auto& io : by_shard[s]) {
        if (io.tensor->spec.mode.kind != Consistency::kSync) continue;
        step_parts[s] = 1;
        sync_parts++;
        break;
      }
    }
    if (sync_parts > 0) {
      for (auto& parts : step_parts) parts = parts ? sync_parts : 0;
    } else {
      for (size_t s = 0; s < by_shard.size(); ++s) {
        if (by_shard[s].empty()) continue;
        step_parts[s] = 1;
        break;
      }
    }
  }
  ctx_->Post([this, op, flags, step, step_parts = std::move(step_parts),
              by_shard = std::move(by_shard)]() mutable {
    for (size_t s = 0; s < by_shard.size(); ++s) {
      if (by_shard[s].empty()) continue;
      op->Add(1);
      PushToShard(static_cast<int>(s), std::move(by_shard[s]), flags, PushStep{step, step_parts[s]},
                  op, [op](const Status& st, const std::vector<uint64_t>&) { op->Finish(st); });
    }
    op->Finish(Status::Ok());
  });
  return Future(op);
}

Future Client::Impl::Pull(const std::vector<PullItem>& items) {
  std::vector<std::vector<ChunkIo>> by_shard(shards_.size());
  {
    std::lock_guard<std::mutex> lock(tensors_mu_);
    for (const auto& item : items) {
      auto on_gpu = OnGpu(item.data, item.memory);
      if (!on_gpu.ok()) return FailedFuture(on_gpu.status().WithContext("pull"));
      auto e = LookupLocked(item.tensor, item.bytes, item.dtype);
      if (!e.ok()) {
        return FailedFuture(e.status().WithContext(*on_gpu ? "pull into GPU memory" : "pull"));
      }
      if (Status st = CheckPart(item.chunks, **e); !st.ok()) return FailedFuture(st);
      for (size_t i = 0; i < (*e)->chunks.size(); ++i) {
        if (i % item.chunks.parts != item.chunks.part) continue;
        const Chunk& c = (*e)->chunks[i];
        auto& list = by_shard[c.shard];
        if (list.empty()) list.reserve(items.size());
        list.push_back({&c, static_cast<uint8_t*>(item.data) + c.byte_offset, item.min_version,
                        item.min_step, nullptr, *on_gpu});
      }
    }
  }
  auto op = NewOp();
  op->Add(1);
  ctx_->Post([this, op, by_shard = std::move(by_shard)]() mutable {
    for (size_t s = 0; s < by_shard.size(); ++s) {
      if (by_shard[s].empty()) continue;
      op->Add(1);
      PullFromShard(static_cast<int>(s), std::move(by_shard[s]),
                    [op](const Status& st) { op->Finish(st); });
    }
    op->Finish(Status::Ok());
  });
  return Future(op);
}

void Client::Impl::PushThenPullInline(int shard, std::vector<ChunkIo> gradients,
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
        PushThenPullInline(static_cast<int>(s), std::move(push[s]), std::move(pull[s]),
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

Status Client::Impl::Initialize() {
  if (worker_rank_ != 0) {
    return Status::FailedPrecondition(task_.ToString() + " is not the chief (" +
                                      options_.cluster.chief().ToString() +
                                      " is); use WaitForInit");
  }
  std::vector<PushItem> items;
  std::vector<std::vector<uint8_t>> generated;
  size_t restored = 0, kept = 0;
  {
    std::lock_guard<std::mutex> lock(tensors_mu_);
    generated.reserve(tensors_.size());
    for (uint32_t i = 0; i < tensors_.size(); ++i) {
      auto& e = tensors_[i];
      if (e.restored || e.initialized) {
        // Restored from a checkpoint, or initialised before (a restarted
        // chief, or an earlier Initialize): the values have moved on; keep them.
        (e.restored ? restored : kept)++;
        continue;
      }
      if (e.spec.initial.empty()) {
        auto value = InitialValue(e.spec.initializer, e.spec.name, e.spec.dtype, e.spec.shape);
        if (!value.ok()) return value.status();
        generated.push_back(std::move(*value));
        items.push_back({{i}, generated.back().data(), e.bytes});
      } else {
        items.push_back({{i}, e.spec.initial.data(), e.bytes});
      }
    }
  }
  if (restored > 0) {
    TLOG_INFO("{}: {} tensor(s) restored from the checkpoint of global step {}; initialising {}",
              task_.ToString(), restored, restored_step_.value_or(0), items.size());
  }
  if (kept > 0) {
    TLOG_INFO("{}: {} tensor(s) were initialised before; not initialising them again",
              task_.ToString(), kept);
  }
  if (!items.empty())
    TESSERA_RETURN_IF_ERROR(Push(items, wire::kFlagInit, 0).Wait().WithContext("initialising"));
  auto ack = Call<wire::InitDone, wire::Ack>(coord_index_, wire::InitDone{}, options_.op_timeout);
  if (!ack.ok()) return ack.status();
  std::lock_guard<std::mutex> lock(tensors_mu_);
  for (auto& e : tensors_) e.initialized = true;
  return Status::Ok();
}

Status Client::Impl::SetHyperparams(Tensor t, const Hyperparams& hyper) {
  if (worker_rank_ != 0) {
    return Status::FailedPrecondition(task_.ToString() + " is not the chief; only " +
                                      options_.cluster.chief().ToString() +
                                      " changes hyper-parameters");
  }
  TESSERA_RETURN_IF_ERROR(hyper.Validate());
  auto entry = Lookup(t, 0, std::nullopt, /*check_bytes=*/false);
  if (!entry.ok()) return entry.status();
  std::vector<wire::SetHyper> by_shard(shards_.size());
  for (const auto& c : (*entry)->chunks) by_shard[c.shard].key_ids.push_back(c.key_id);
  for (size_t s = 0; s < by_shard.size(); ++s) {
    if (by_shard[s].key_ids.empty()) continue;
    by_shard[s].hyper = hyper;
    auto ack =
        Call<wire::SetHyper, wire::Ack>(static_cast<int>(s), by_shard[s], options_.op_timeout);
    if (!ack.ok()) return ack.status();
  }
  return Status::Ok();
}

Result<uint64_t> Client::Impl::GlobalStep() {
  auto reply =
      Call<wire::GetStep, wire::StepReply>(coord_index_, wire::GetStep{}, options_.op_timeout);
  if (!reply.ok()) return reply.status();
  return reply->global_step;
}

Status Client::Impl::WaitForInit(std::chrono::milliseconds timeout) {
  auto ack = Call<wire::WaitInit, wire::Ack>(coord_index_, wire::WaitInit{}, timeout);
  if (ack.ok()) return Status::Ok();
  if (ack.status().code() == StatusCode::kDeadlineExceeded) {
    return Status::DeadlineExceeded("the chief (" + options_.cluster.chief().ToString() +
                                    ") has not initialised the parameters within " +
                                    std::to_string(timeout.count()) + " ms");
  }
  return ack.status();
}

// ---------------------------------------------------------------------------
// Client

Result<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  TESSERA_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

Result<Tensor> Client::Declare(const TensorSpec& spec) {
  auto r = impl_->DeclareMany({spec});
  if (!r.ok()) return r.status();
  return r->front();
}

Result<std::vector<Tensor>> Client::DeclareMany(const std::vector<TensorSpec>& specs) {
  return impl_->DeclareMany(specs);
}

Result<Tensor> Client::Find(const std::string& name) const {
  std::lock_guard<std::mutex> lock(impl_->tensors_mu_);
  auto it = impl_->by_name_.find(name);
  if (it == impl_->by_name_.end()) {
    return Status::NotFound("tensor '" + name + "' was not declared by this client");
  }
  return Tensor{it->second};
}

Result<TensorInfo> Client::info(Tensor t) const {
  std::lock_guard<std::mutex> lock(impl_->tensors_mu_);
  if (t.index >= impl_->tensors_.size()) {
    return Status::InvalidArgument("tensor handle " + std::to_string(t.index) +
                                   " was not declared by this client");
  }
  const auto& e = impl_->tensors_[t.index];
  TensorInfo info{e.spec.name, e.spec.dtype, e.spec.shape, e.spec.rule,
                  e.bytes,     {},           {},           e.decl.mode};
  for (const auto& c : e.chunks) {
    info.shards.push_back(c.shard);
    info.chunks.push_back({c.elem_offset, c.elem_count});
  }
  return info;
}

bool Client::is_chief() const { return impl_->worker_rank_ == 0; }
Status Client::Initialize() { return impl_->Initialize(); }
std::optional<uint64_t> Client::restored_step() const {
  std::lock_guard<std::mutex> lock(impl_->tensors_mu_);
  return impl_->restored_step_;
}
Result<Client::CheckpointInfo> Client::SaveCheckpoint(std::chrono::milliseconds timeout) {
  return impl_->SaveCheckpoint(timeout);
}
Result<uint64_t> Client::GlobalStep() { return impl_->GlobalStep(); }
Status Client::SetHyperparams(Tensor t, const Hyperparams& hyper) {
  return impl_->SetHyperparams(t, hyper);
}
Status Client::WaitForInit(std::chrono::milliseconds timeout) {
  return impl_->WaitForInit(timeout);
}
Future Client::PushAsync(const std::vector<PushItem>& items) {
  return impl_->Push(items, 0, std::nullopt);
}
Future Client::PushAsync(const std::vector<PushItem>& items, uint64_t step) {
  return impl_->Push(items, 0, step);
}
Future Client::PullAsync(const std::vector<PullItem>& items) { return impl_->Pull(items); }
Future Client::PushPullAsync(const std::vector<PushPullItem>& items) {
  return impl_->PushPull(items);
}
int Client::num_shards() const { return impl_->options_.cluster.num_tasks("ps"); }

ClientCounters Client::counters() const {
  auto c = impl_->ctx_->counters();
  ClientCounters out;
  out.messages_sent = c.messages_sent;
  out.message_bytes_sent = c.message_bytes_sent;
  out.messages_received = c.messages_received;
  out.message_bytes_received = c.message_bytes_received;
  out.puts = c.puts;
  out.put_bytes = c.put_bytes;
  out.gets = c.gets;
  out.get_bytes = c.get_bytes;
  out.chunks_dropped_stale = impl_->dropped_stale_;
  out.chunks_dropped_duplicate = impl_->dropped_duplicate_;
  out.cuda_ipc_bytes = impl_->ipc_bytes_;
  out.host_staged_bytes = impl_->staged_bytes_;
  out.gpu_inline_bytes = impl_->gpu_inline_bytes_;
  out.cuda_ipc_shards = impl_->ipc_shards_;
  return out;
}

}  // namespace tessera
