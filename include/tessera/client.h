// The worker side: declare parameters, push gradients, pull weights.
//
//   auto client = tessera::Client::Connect(options).value();
//   auto w = client->Declare({.name = "w", .dtype = DType::kF32, .shape = {1024},
//                             .rule = UpdateRule::kAdd}).value();
//   if (client->is_chief()) client->Initialize(); else client->WaitForInit();
//   client->Push({{w, grad.data(), grad.size() * 4}}, {.step = step});
//   client->Pull({{w, weights.data(), weights.size() * 4}});
//
// Thread safety: a Client may be shared by threads; each call is
// independent. Buffers passed to an asynchronous call must stay valid and
// unchanged until its Future completes: bytes move from and into them
// one-sided, without copies.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#if defined(__STDCPP_FLOAT16_T__) && defined(__STDCPP_BFLOAT16_T__) && __has_include(<stdfloat>)
#include <stdfloat>
#define TESSERA_HAVE_STDFLOAT 1
#endif

#include "tessera/cluster.h"
#include "tessera/export.h"
#include "tessera/status.h"
#include "tessera/tensor.h"

namespace tessera {

// How the chief fills a tensor that has no explicit initial value (the
// tf.keras.initializers of the same names, TensorFlow's default ranges).
// Random ones are deterministic: the same seed and tensor name give the same
// values on any run.
struct TESSERA_EXPORT Initializer {
  enum class Kind : uint8_t {
    kZeros,
    kConstant,
    kUniform,
    kNormal,
    kTruncatedNormal,  // normal, redrawn beyond 2 standard deviations
    kGlorotUniform,    // uniform in +-sqrt(6 / (fan_in + fan_out))
    kGlorotNormal,     // truncated normal, stddev sqrt(2 / (fan_in + fan_out)) / 0.8796
  };
  Kind kind = Kind::kZeros;
  double value = 0.0;                // kConstant
  double low = -0.05, high = 0.05;   // kUniform
  double mean = 0.0, stddev = 0.05;  // kNormal, kTruncatedNormal
  uint64_t seed = 0;

  static Initializer Zeros() { return {}; }
  static Initializer Constant(double v) { return {Kind::kConstant, v}; }
  static Initializer Uniform(double lo, double hi, uint64_t seed = 0) {
    return {Kind::kUniform, 0.0, lo, hi, 0.0, 0.05, seed};
  }
  static Initializer Normal(double mean, double stddev, uint64_t seed = 0) {
    return {Kind::kNormal, 0.0, -0.05, 0.05, mean, stddev, seed};
  }
  static Initializer TruncatedNormal(double mean, double stddev, uint64_t seed = 0) {
    return {Kind::kTruncatedNormal, 0.0, -0.05, 0.05, mean, stddev, seed};
  }
  static Initializer GlorotUniform(uint64_t seed = 0) {
    return {Kind::kGlorotUniform, 0.0, -0.05, 0.05, 0.0, 0.05, seed};
  }
  static Initializer GlorotNormal(uint64_t seed = 0) {
    return {Kind::kGlorotNormal, 0.0, -0.05, 0.05, 0.0, 0.05, seed};
  }
  // An error naming what is wrong (an unknown kind, uniform low >= high, a
  // normal stddev <= 0, a value that is not finite), or OK.
  Status Validate() const;
  // Glorot's kinds draw from the tensor's fans: they need a fixed shape.
  bool needs_shape() const { return kind == Kind::kGlorotUniform || kind == Kind::kGlorotNormal; }
  bool operator==(const Initializer&) const = default;
};

// The bytes an initializer gives a tensor of this name, dtype and shape.
TESSERA_EXPORT Result<std::vector<uint8_t>> InitialValue(const Initializer& init,
                                                         const std::string& name, DType dtype,
                                                         const Shape& shape);

struct TESSERA_EXPORT TensorSpec {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  UpdateRule rule = UpdateRule::kAssign;
  // The value the chief initialises it with (raw bytes); when empty, the
  // initializer below makes it.
  std::vector<uint8_t> initial;
  // Place every chunk on this ps task instead of by the placement policy.
  int pinned_shard = -1;
  // For the optimizer rules (sgd, momentum, adam, adamw, adagrad).
  Hyperparams hyper = {};
  // async (default), sync(replicas_to_aggregate, total_num_replicas) or
  // bounded(s); zeros are filled from the cluster's worker count.
  ConsistencyMode mode = {};
  Initializer initializer = {};
};

// A declared tensor: cheap to copy, valid for the life of the Client that
// declared (or found) it. It names that client (Client::id()), so any other
// client, a later one in its place included, refuses it by name instead of
// taking it for one of its own tensors.
struct TESSERA_EXPORT Tensor {
  uint32_t index = UINT32_MAX;  // among its client's tensors
  uint32_t client = 0;          // its client's id; 0 for no client's
};

struct TESSERA_EXPORT TensorInfo {
  std::string name;
  DType dtype;
  Shape shape;
  UpdateRule rule;
  uint64_t bytes;
  std::vector<int> shards;  // the ps task of each chunk
  struct ChunkRange {
    uint64_t elem_offset = 0, elem_count = 0;
  };
  std::vector<ChunkRange> chunks;  // which elements each chunk holds
  ConsistencyMode mode;
  // In effect: as declared, as the chief set them since (SetHyperparams), or
  // as saved in the checkpoint the cluster restored.
  Hyperparams hyper;
};

// Some chunks of a tensor instead of all: those whose index i has
// i % parts == part (the buffer still covers the whole tensor). Workers that
// split a tensor between them (NodeGroup) each move their part.
struct TESSERA_EXPORT ChunkPart {
  uint32_t part = 0, parts = 1;
};

// C++ element type -> DType, for the typed helpers below.
template <typename T>
constexpr DType DTypeOf();
template <>
constexpr DType DTypeOf<float>() {
  return DType::kF32;
}
template <>
constexpr DType DTypeOf<double>() {
  return DType::kF64;
}
template <>
constexpr DType DTypeOf<int32_t>() {
  return DType::kI32;
}
template <>
constexpr DType DTypeOf<int64_t>() {
  return DType::kI64;
}
template <>
constexpr DType DTypeOf<Float16>() {
  return DType::kF16;
}
template <>
constexpr DType DTypeOf<BFloat16>() {
  return DType::kBF16;
}
#ifdef TESSERA_HAVE_STDFLOAT
// C++23's extended floating types, where the compiler has them (<stdfloat>).
template <>
constexpr DType DTypeOf<std::float16_t>() {
  return DType::kF16;
}
template <>
constexpr DType DTypeOf<std::bfloat16_t>() {
  return DType::kBF16;
}
#endif

// What memory a buffer given to Push/Pull is: host memory, or GPU memory
// from cudaMalloc (a raw device pointer). kDetect asks CUDA
// (cudaPointerGetAttributes, well under a microsecond); kHost skips that;
// kCuda is checked, and an error says what CUDA saw instead.
enum class BufferMemory : uint8_t { kDetect, kHost, kCuda };

struct TESSERA_EXPORT PushItem {
  Tensor tensor;
  const void* data;
  size_t bytes;
  // When set, the push fails unless the tensor has this dtype.
  std::optional<DType> dtype;
  BufferMemory memory = BufferMemory::kDetect;
  ChunkPart chunks = {};

  template <typename T>
  static PushItem Of(Tensor t, std::span<const T> values) {
    return {t, values.data(), values.size_bytes(), DTypeOf<T>()};
  }
};

struct TESSERA_EXPORT PullItem {
  Tensor tensor;
  void* data;
  size_t bytes;
  // Wait until the tensor has at least this version (1 = initialised; each
  // applied update adds 1).
  uint64_t min_version = 1;
  std::optional<DType> dtype;
  // Sync tensors: wait until this many steps were applied (after pushing
  // step t, pull with t + 1). Bounded tensors: until every worker pushed this
  // many steps (a worker at step t pulls with t - s).
  uint64_t min_step = 0;
  BufferMemory memory = BufferMemory::kDetect;
  ChunkPart chunks = {};

  template <typename T>
  static PullItem Of(Tensor t, std::span<T> values, uint64_t min_version = 1) {
    return {t, values.data(), values.size_bytes(), min_version, DTypeOf<T>()};
  }
  template <typename T>
  static PullItem AfterStep(Tensor t, std::span<T> values, uint64_t min_step) {
    return {t, values.data(), values.size_bytes(), 1, DTypeOf<T>(), min_step};
  }
};

struct TESSERA_EXPORT PushPullItem {
  Tensor tensor;
  const void* gradient;
  void* weights;  // receives the value after this push was applied
  size_t bytes;
  std::optional<DType> dtype;
  BufferMemory memory = BufferMemory::kDetect;  // of both buffers
  ChunkPart chunks = {};
};

// How a call is ordered with the caller's own work.
struct TESSERA_EXPORT CallOptions {
  // A cudaStream_t (as void*: this header needs no CUDA), or null for none.
  // The call starts once the work enqueued on the stream before it is done
  // (the kernels that wrote a gradient), and the work enqueued on it after
  // the call runs once the call completed (the kernels that read the pulled
  // weights); neither the caller's thread nor the stream is synchronised
  // with the host for it. The Future completes as usual and tells how the
  // call ended: a failed or cancelled call lets the stream go on all the
  // same. Needs a build with CUDA, a GPU, and a driver with stream memory
  // operations; where they are missing the call fails saying which.
  void* cuda_stream = nullptr;
  // The caller waits on the returned Future at once, as the blocking calls
  // (Push, Pull, PushPull) do. The call is then issued on the calling thread
  // when no other thread drives the client, rather than by the progress
  // thread, which posting it to would wake: a system call and, where the
  // two share a core, a context switch, on every call. Leave it false for a
  // call that overlaps other work: issuing a large call is a copy (shared
  // memory) or a send, and would then hold up the caller. Not with a CUDA
  // stream (the stream issues the call).
  bool caller_waits = false;
};

// An embedding table (docs/embeddings.md): rows of `dim` elements keyed by
// any int64 id, spread over the ps tasks by a hash of the id, each made by
// its first push (a pull of an id without a row reads its initial value,
// which depends on the initializer's seed, the table's name and the id
// alone). Each row keeps its optimizer state and its own step count.
struct TESSERA_EXPORT EmbeddingSpec {
  std::string name;
  uint32_t dim = 0;
  DType dtype = DType::kF32;  // f32, f16 or bf16
  UpdateRule rule = UpdateRule::kAdagrad;
  Hyperparams hyper = {};
  FtrlHyperparams ftrl = {};  // rule kFtrl
  // Uniform, normal, truncated normal or constant (Glorot's kinds need a
  // fixed shape).
  Initializer initializer = Initializer::Uniform(-0.05, 0.05);
  // Async or sync (bounded tables are refused by name so far).
  ConsistencyMode mode = {};
  // The most rows one ps task holds of it; a push that would make more is
  // refused (ResourceExhausted). Checked against each ps task's memory when
  // the table is declared.
  uint64_t max_rows_per_shard = uint64_t{1} << 24;
};

// A declared embedding table: cheap to copy, valid for the life of the
// Client that declared it, and refused by any other (as Tensor). `dim` and
// `dtype` are the table's, for sizing buffers; a call checks them.
struct TESSERA_EXPORT Embedding {
  uint32_t index = UINT32_MAX;  // among its client's tables
  uint32_t client = 0;
  uint32_t dim = 0;
  DType dtype = DType::kF32;
  size_t row_bytes() const { return size_t{dim} * DTypeSize(dtype); }
};

// How a push is tagged and ordered (Client::Push, Client::PushAsync).
struct TESSERA_EXPORT PushOptions {
  // The worker's step the push belongs to (steps count from 0): sync and
  // bounded tensors need it and refuse a push without one; none for async
  // tensors.
  std::optional<uint64_t> step;
  CallOptions call;
};

// A chunk of a push that its shard dropped, as TensorFlow's
// SyncReplicasOptimizer drops them (sync tensors only). kStale: its step had
// been applied, or already had its replicas (a late or backup worker);
// kDuplicate: this worker had pushed that step already.
struct TESSERA_EXPORT DroppedChunk {
  enum class Why : uint8_t { kStale, kDuplicate };
  std::string tensor;
  uint32_t chunk = 0;  // index among the tensor's chunks (TensorInfo)
  uint64_t step = 0;   // the step the push was tagged with
  Why why = Why::kStale;
};

// Completion of an asynchronous call.
class TESSERA_EXPORT Future {
 public:
  Future() = default;
  // A Future already complete with `st` (a call refused before it began).
  static Future Failed(const Status& st);
  // Waits for completion, at most the client's operation timeout.
  Status Wait() const;
  Status WaitFor(std::chrono::milliseconds limit) const;
  bool ready() const;
  // Cancels the call if it has not started yet: it then completes with
  // StatusCode::kCancelled, none of its bytes moved, and Cancel returns true.
  // A call waits to start while the client's progress thread is busy, behind
  // the control calls made before it (DeclareAsync, InitializeAsync), or,
  // ordered on a CUDA stream (CallOptions), until the stream reaches it. A
  // call already started, or complete, goes on: Cancel returns false.
  bool Cancel() const;
  // Runs fn once complete (at once if it already is); a fn set before then
  // runs before Wait returns and before ready() turns true. It may run on
  // the client's progress thread: it must not block, nor call the Client.
  void Then(std::function<void(Status)> fn) const;
  // Once complete: the chunks of this push that a shard dropped (a dropped
  // chunk is no error: the call is OK). Empty for other calls, and until
  // the call is complete.
  std::vector<DroppedChunk> dropped() const;

  struct State;
  explicit Future(std::shared_ptr<State> state) : state_(std::move(state)) {}

 private:
  std::shared_ptr<State> state_;
};

// Waits for every future (each at most its client's operation timeout) and
// returns the first error in the vector's order, once all completed or timed
// out: a failed call never leaves the others' buffers still in use.
TESSERA_EXPORT Status WaitAll(const std::vector<Future>& futures);

struct TESSERA_EXPORT ClientOptions {
  ClusterSpec cluster;
  TaskId task{"worker", 0};
  std::string secret;  // the cluster secret, at least 16 bytes
  // A read-only client (an evaluator, an inference reader): it looks up
  // tensors the workers declared and pulls them, and can neither push nor
  // initialise. Its task need not be in the cluster spec (any job name,
  // e.g. {"evaluator", 0}), which must agree with the shards' only on the
  // ps and coordinator tasks. `secret` may be the cluster secret or only its
  // reader key (`tessera secret --reader`), which lets nothing else in.
  bool read_only = false;
  bool allow_weak_secret = false;  // accept a shorter one (TESSERA_ALLOW_WEAK_SECRET=1)
  // "tcp" (Tessera's own sockets), "ucx" (shared memory, RDMA; its tcp only
  // on loopback, see docs/security.md), "verbs", or "auto".
  std::string transport = "tcp";
  // Whether sessions are authenticated and encrypted after their handshake
  // (tcp only; kAuto: on for connections that leave the host; kOn refuses
  // a shard that will not).
  SessionProtection session_protection = SessionProtection::kAuto;
  // Tensors above this many bytes are split into chunks spread over shards.
  size_t chunk_bytes = 4u << 20;
  std::string placement = "round_robin";  // or "greedy"
  // How long Connect waits for every ps task (tasks start in any order). It
  // says whom it waits for, and why, as soon as a connection attempt fails,
  // then again every report_interval (0: only that once).
  std::chrono::milliseconds startup_timeout{60'000};
  std::chrono::milliseconds report_interval{0};
  // When set, Connect calls it on its own thread about every 20 ms while it
  // waits for the ps tasks, and fails with kCancelled once it returns true:
  // how a caller lets Ctrl-C end the wait (the Python binding runs Python's
  // signal handlers in it).
  std::function<bool()> interrupted;
  // Bound on every blocking call and Future::Wait().
  std::chrono::milliseconds op_timeout{60'000};
  // A ps task lost and restarted in place (docs/training.md): a call's part
  // that failed because that task was lost is held and issued again once
  // the task is back and this worker's tensors are created on it again,
  // for at most this long after it failed (then the call fails with the
  // loss). What is retried: pulls, and pushes of sync tensors with a step
  // (the shard drops a step's second push as a duplicate). An async or
  // bounded push, a push_pull and the chief's initialisation fail as
  // without it: the shard may have applied them before it was lost. 0 (the
  // default) retries nothing; TESSERA_RETRY_LOST_SHARD_MS overrides it. At
  // most op_timeout, which still bounds every wait.
  std::chrono::milliseconds retry_lost_shard_within{0};
  // Each ps task (and the coordinator) is pinged this often; one that has not
  // answered anything for heartbeat_timeout is reported lost: its pending
  // and later calls fail naming it. A timeout of 0 turns heartbeats off.
  std::chrono::milliseconds heartbeat_interval{1'000};
  std::chrono::milliseconds heartbeat_timeout{5'000};
  // A push or pull whose bytes to one shard total at most this travels inside
  // its messages (one round trip) instead of by a one-sided put or get plus
  // a second message; at most 65536. 0 always goes one-sided.
  size_t inline_bytes = 8192;
  bool busy_poll = false;
  // GPU buffers (docs/gpu.md). A worker on a GPU shard's node maps the
  // shard's memory with CUDA IPC and copies device to device, no host memory
  // and no network (off with cuda_ipc = false). Elsewhere a GPU buffer needs
  // a fabric that reaches GPU memory, or allow_host_staging, which copies it
  // through host memory and counts every byte (ClientCounters).
  bool cuda_ipc = true;
  bool allow_host_staging = false;
  int cuda_device = 0;  // the GPU of this worker's buffers and mappings

  // Everything a trainer would otherwise parse itself:
  //  - the cluster and this task: TensorFlow 1's flags in argv when given
  //    (--ps_hosts, --worker_hosts, --chief_hosts, --job_name, --task_index,
  //    as `--flag=value` or `--flag value`; other arguments are ignored),
  //    else TF_CONFIG;
  //  - the secret: TESSERA_SECRET, else the file TESSERA_SECRET_FILE names;
  //    TESSERA_ALLOW_WEAK_SECRET=1 allows a short one;
  //  - read_only: for an "evaluator" task (TensorFlow's, which TF_CONFIG may
  //    leave out of the cluster), or TESSERA_READ_ONLY=1;
  //  - the transport: TESSERA_TRANSPORT (tcp when unset);
  //  - session protection: TESSERA_SESSION_PROTECTION (auto, on or off; auto when unset);
  //  - the GPU: TESSERA_CUDA_DEVICE (tessera run sets it by the task's place
  //    on its node);
  //  - the log level: TESSERA_LOG_LEVEL, checked here.
  // An error names the variable or flag that is missing or wrong.
  static Result<ClientOptions> FromEnv(int argc = 0, const char* const* argv = nullptr);
};

// Bytes this client moved, by kind (one-sided vs. messages).
struct TESSERA_EXPORT ClientCounters {
  uint64_t messages_sent = 0, message_bytes_sent = 0;
  uint64_t messages_received = 0, message_bytes_received = 0;
  uint64_t puts = 0, put_bytes = 0, gets = 0, get_bytes = 0;
  // Sync tensors: pushed chunks the shards dropped (their step was applied
  // already, or this worker had pushed that step).
  uint64_t chunks_dropped_stale = 0, chunks_dropped_duplicate = 0;
  // GPU buffers: bytes copied through CUDA IPC mappings of a shard's memory;
  // bytes staged through host memory because the fabric cannot reach GPU
  // memory (allow_host_staging); bytes of small pushes and pulls that rode
  // inside messages (host memory by nature).
  uint64_t cuda_ipc_bytes = 0, host_staged_bytes = 0, gpu_inline_bytes = 0;
  int cuda_ipc_shards = 0;  // shards reached through CUDA IPC now
  // Handshakes with shards and the coordinator that ended in a protected
  // session (authenticated and encrypted frames), counted since the start.
  uint64_t protected_sessions = 0;
};

class TESSERA_EXPORT Client {
 public:
  // Connects to every ps task, waiting (and saying so) until they are up.
  static Result<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  ~Client();

  // Declares tensors: the first declaration places them, later ones (on
  // any worker) must match. A read-only client's declare looks them up
  // instead: each must be declared already with this dtype and shape.
  Result<Tensor> Declare(const TensorSpec& spec);
  Result<std::vector<Tensor>> DeclareMany(const std::vector<TensorSpec>& specs);
  // The control calls without waiting. They run one at a time, in the order
  // they were made (blocking Declare, Initialize and WaitForInit among them),
  // so DeclareManyAsync then InitializeAsync initialises what was declared;
  // one still queued may be cancelled. Once the Future completes OK,
  // `tensor`/`tensors` (may be null; they must outlive the Future) hold the
  // handles, as Find would give them.
  Future DeclareAsync(const TensorSpec& spec, Tensor* tensor = nullptr);
  Future DeclareManyAsync(const std::vector<TensorSpec>& specs,
                          std::vector<Tensor>* tensors = nullptr);
  Result<Tensor> Find(const std::string& name) const;
  // What the tensor is and where its chunks live; an error for a handle
  // this client did not declare.
  Result<TensorInfo> info(Tensor t) const;

  bool is_chief() const;
  // Whether this client is read-only (ClientOptions::read_only): it may
  // declare (look up) tensors, wait for init, read the global step and pull.
  bool read_only() const;
  // This client's id, unique among the clients this process opened (it
  // starts again only after 2^32 - 1 of them): its Tensors carry it.
  uint32_t id() const;
  // Chief only: writes every declared tensor's initial value, then lets the
  // other workers' WaitForInit return. Tensors the cluster restored from a
  // checkpoint keep their restored values; a cluster initialised already (a
  // restarted chief) is left as it is.
  Status Initialize();
  Future InitializeAsync();
  // The global step of the checkpoint the cluster resumed from, if it did.
  std::optional<uint64_t> restored_step() const;
  // The step to tag this worker's first push of its sync and bounded tensors
  // with, known once Initialize or WaitForInit returned: the step the
  // chief's Initialize started them at (where the workers are: the global
  // step, or the furthest step a ps task's sync tensors reached where the
  // global step has not counted it yet), the same number on every worker.
  // Read GlobalStep() instead and it may differ: the shards report steps
  // after the fact. A worker that asks after the chief was done (a
  // restarted one) gets the global step where training went past that.
  std::optional<uint64_t> start_step() const;
  Status WaitForInit(std::chrono::milliseconds timeout = std::chrono::milliseconds{60'000});
  Future WaitForInitAsync(std::chrono::milliseconds timeout = std::chrono::milliseconds{60'000});

  // Pushes gradients, tagged with `options.step` where the tensors need
  // one, ordered as `options.call` says.
  Future PushAsync(const std::vector<PushItem>& items, const PushOptions& options = {});
  Future PullAsync(const std::vector<PullItem>& items);
  // The asynchronous calls ordered as `call` says (a CUDA stream).
  Future PullAsync(const std::vector<PullItem>& items, const CallOptions& call);
  Future PushPullAsync(const std::vector<PushPullItem>& items, const CallOptions& call);
  // Pushes, then pulls each tensor's value with this push applied (async and
  // bounded tensors; a sync tensor is refused: push it with its step, then
  // pull after that step). Where a shard's part travels inline
  // (ClientOptions::inline_bytes) it is one round trip: the shard answers the
  // push with the weights. Larger parts are a push, then a pull.
  Future PushPullAsync(const std::vector<PushPullItem>& items);
  // The blocking calls: the calling thread issues the call and picks up its
  // answer itself, waking no other thread on the way (CallOptions::caller_waits).
  // `dropped` (may be null): the chunks of a sync tensor's push its shard
  // dropped (see DroppedChunk), as Future::dropped() says of PushAsync.
  Status Push(const std::vector<PushItem>& items, const PushOptions& options = {},
              std::vector<DroppedChunk>* dropped = nullptr);
  Status Pull(const std::vector<PullItem>& items) { return PullAsync(items, kWaitAtOnce).Wait(); }
  Status PushPull(const std::vector<PushPullItem>& items) {
    return PushPullAsync(items, kWaitAtOnce).Wait();
  }

  // Embedding tables. The first declaration of a name gives the table its
  // id and creates it on every ps task; a later one (on any worker) must
  // agree with it, and gets the hyper-parameters of the first. A control
  // call, ordered with the others.
  Result<Embedding> DeclareEmbedding(const EmbeddingSpec& spec);
  // The rows of `ids` into `rows`: ids.size() rows of the table's dim and
  // dtype, row i for ids[i] (an id may repeat; it is asked for once).
  // `rows` must stay valid until the Future completes. A sync table's pull
  // waits until the table applied `min_step` steps (after pushing step t,
  // t + 1), or says which workers have not completed the step.
  Future PullRowsAsync(Embedding table, std::span<const int64_t> ids, void* rows,
                       uint64_t min_step = 0);
  Status PullRows(Embedding table, std::span<const int64_t> ids, void* rows,
                  uint64_t min_step = 0) {
    return PullRowsAsync(table, ids, rows, min_step).Wait();
  }
  // Gradient rows for `ids`: grads holds ids.size() rows of the table's dim
  // and dtype, row i for ids[i]. The rows of an id that repeats are summed
  // (in f32, in the order given) and sent once. Copied before the call
  // returns. A sync table takes one push per worker and step, tagged with
  // `options.step`: the worker's rows of that step (none is a push too),
  // which completes its step on every ps task; the step applies once
  // replicas_to_aggregate workers completed it.
  Future PushRowsAsync(Embedding table, std::span<const int64_t> ids, const void* grads,
                       const PushOptions& options = {});
  Status PushRows(Embedding table, std::span<const int64_t> ids, const void* grads,
                  const PushOptions& options = {}) {
    return PushRowsAsync(table, ids, grads, options).Wait();
  }
  // The forms before PushOptions, kept for one release.
  [[deprecated("use PushAsync(items, {.step = step})")]] Future PushAsync(
      const std::vector<PushItem>& items, uint64_t step) {
    return PushAsync(items, PushOptions{.step = step});
  }
  [[deprecated("use Push(items, {.step = step})")]] Status Push(const std::vector<PushItem>& items,
                                                                uint64_t step) {
    return Push(items, PushOptions{.step = step});
  }
  [[deprecated("use Push(items, {.step = step}, dropped)")]] Status Push(
      const std::vector<PushItem>& items, uint64_t step, std::vector<DroppedChunk>* dropped) {
    return Push(items, PushOptions{.step = step}, dropped);
  }
  [[deprecated("use PushAsync(items, {.call = call})")]] Future PushAsync(
      const std::vector<PushItem>& items, const CallOptions& call) {
    return PushAsync(items, PushOptions{.call = call});
  }
  [[deprecated("use PushAsync(items, {.step = step, .call = call})")]] Future PushAsync(
      const std::vector<PushItem>& items, uint64_t step, const CallOptions& call) {
    return PushAsync(items, PushOptions{.step = step, .call = call});
  }

  // Chief only: new hyper-parameters for a tensor's optimizer from its next
  // update on (a learning-rate schedule).
  Status SetHyperparams(Tensor t, const Hyperparams& hyper);

  // The optimizer state the shards keep for `t`, one slot of the whole
  // tensor, elements in the tensor's order, in the state's type (f64 for an
  // f64 tensor, else f32): Adam's first and second moments (kFirst,
  // kSecond), the momentum buffer or Adagrad's sum (kFirst), an f16/bf16
  // tensor's f32 master copy (kMaster). `updates`: the optimizer steps
  // applied (Adam's t; its first chunk's). What checkpoints save, for a
  // trainer's own state_dict(). A slot the tensor's rule does not keep is
  // refused, naming the rule.
  enum class StateSlot : uint8_t { kFirst = 0, kSecond = 1, kMaster = 2 };
  struct OptimizerState {
    std::vector<uint8_t> bytes;
    uint64_t updates = 0;
  };
  Result<OptimizerState> ReadOptimizerState(Tensor t, StateSlot slot);
  // Chief only: sets that slot on every chunk, and their `updates`
  // (load_state_dict); `state.bytes` is the whole slot, as
  // ReadOptimizerState gives it. Meant between steps: a step a shard applies
  // meanwhile uses what it finds.
  Status WriteOptimizerState(Tensor t, StateSlot slot, const OptimizerState& state);
  // The same without waiting, on the control calls' queue (as
  // SetHyperparamsAsync): `out` (must outlive the Future) holds the state
  // once it completes OK.
  Future ReadOptimizerStateAsync(Tensor t, StateSlot slot, OptimizerState* out);
  Future WriteOptimizerStateAsync(Tensor t, StateSlot slot, OptimizerState state);

  // The coordinator's global step (TensorFlow's global_step): sync steps
  // completed by replicas_to_aggregate workers, or pushes in async mode.
  Result<uint64_t> GlobalStep();

  // Asks the coordinator for a checkpoint now and waits until it is complete
  // on disk (the coordinator needs a checkpoint directory).
  struct CheckpointInfo {
    uint64_t global_step = 0;
    std::string path;  // the checkpoint's directory
  };
  Result<CheckpointInfo> SaveCheckpoint(
      std::chrono::milliseconds timeout = std::chrono::milliseconds{300'000});

  // SetHyperparams, GlobalStep and SaveCheckpoint without waiting, for a
  // caller that must stay responsive while the coordinator is slow (Python's
  // Ctrl-C): they go on the control calls' queue, after the control calls
  // made before them, and one still queued may be cancelled. Once the Future
  // completes OK, `step` or `saved` (may be null; they must outlive the
  // Future) hold the result.
  Future SetHyperparamsAsync(Tensor t, const Hyperparams& hyper);
  Future GlobalStepAsync(uint64_t* step);
  Future SaveCheckpointAsync(CheckpointInfo* saved,
                             std::chrono::milliseconds timeout = std::chrono::milliseconds{
                                 300'000});

  ClientCounters counters() const;
  int num_shards() const;

  class Impl;

 private:
  static constexpr CallOptions kWaitAtOnce{.caller_waits = true};
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera
