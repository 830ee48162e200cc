// Typed control messages. Each has an opcode, an encoder and a decoder that
// validates every field it can check without the receiver's state (sizes,
// counts, dtypes, rules, shapes); the receiver then checks key ids and
// offsets against its own table and regions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/bytes.h"
#include "core/pool_allocator.h"
#include "core/secret.h"
#include "tessera/cluster.h"
#include "tessera/status.h"
#include "tessera/tensor.h"
#include "wire/header.h"

namespace tessera::wire {

constexpr size_t kMaxNameLength = 1024;
constexpr size_t kMaxDims = 8;
constexpr size_t kMaxRegionDescription = 64 * 1024;
constexpr size_t kMaxErrorMessage = 64 * 1024;
constexpr size_t kMaxPathLength = 4096;
// The cluster spec a hello carries (its JSON), compared once the peer proved
// it knows the secret.
constexpr size_t kMaxClusterSpecLength = 64 * 1024;

// Who says hello: a worker, or a ps task joining the coordinator.
// kObserver: `tessera status`, which may only ask for status. kReader: a
// read-only client (an evaluator, an inference reader), which proves it
// holds the reader key (ReaderKey), not the secret, and may look tensors
// up and pull them, never write.
enum class PeerRole : uint8_t { kWorker = 0, kShard = 1, kObserver = 2, kReader = 3 };

struct Hello {
  static constexpr Opcode kOpcode = Opcode::kHello;
  PeerRole role = PeerRole::kWorker;
  // The sender's index in its role: a worker's rank (its place among the
  // training tasks, the chief first: ClusterSpec::worker_rank), a shard's
  // ps task index; 0 for readers and observers.
  uint32_t task_index = 0;
  std::string task;  // "/job:worker/task:1", for messages that name it
  Nonce client_nonce{};
  // The worker's node (NodeId) when it can use CUDA IPC, else empty: a GPU
  // shard on the same node then hands out IPC handles.
  std::string node_id;
  // The cluster spec this task was given (ClusterSpec::ToJson); empty from an
  // observer, which is not part of the cluster.
  std::string cluster;
  // What the client asks of the session's protection (covered by both proofs).
  SessionProtection protection = SessionProtection::kAuto;
  void EncodeBody(MessageWriter& w) const;
  static Result<Hello> DecodeBody(ByteReader& r);
  bool operator==(const Hello&) const = default;
};

// Challenge::shard_index of a coordinator that is not a shard.
constexpr uint32_t kCoordinatorIndex = 0xffffffff;

struct Challenge {
  static constexpr Opcode kOpcode = Opcode::kChallenge;
  Nonce server_nonce{};
  uint32_t shard_index = 0;
  void EncodeBody(MessageWriter& w) const;
  static Result<Challenge> DecodeBody(ByteReader& r);
  bool operator==(const Challenge&) const = default;
};

struct Auth {
  static constexpr Opcode kOpcode = Opcode::kAuth;
  Proof client_proof{};
  void EncodeBody(MessageWriter& w) const;
  static Result<Auth> DecodeBody(ByteReader& r);
  bool operator==(const Auth&) const = default;
};

struct Welcome {
  static constexpr Opcode kOpcode = Opcode::kWelcome;
  Proof server_proof{};                 // the server proves it knows the secret, second
  std::vector<uint8_t> staging_region;  // the worker's own slot, the only writable memory
  // Same node, GPU shard: a CUDA IPC handle of a GPU slot of the same size
  // (pushes flagged kFlagIpcSlot are read from it); else empty.
  std::vector<uint8_t> staging_ipc;
  // How every later frame is protected (the server's decision, which its
  // proof covers): kOff (not), kOn (encrypted) or kIntegrity.
  SessionProtection protection = SessionProtection::kOff;
  bool session_protected() const { return protection != SessionProtection::kOff; }
  void EncodeBody(MessageWriter& w) const;
  static Result<Welcome> DecodeBody(ByteReader& r);
  bool operator==(const Welcome&) const = default;
};

struct TensorDecl {
  std::string name;
  DType dtype = DType::kF32;
  UpdateRule rule = UpdateRule::kAssign;
  Shape shape;
  int32_t pinned_shard = -1;
  Hyperparams hyper;
  ConsistencyMode mode;  // with its zeros filled in by the declaring client
  bool operator==(const TensorDecl&) const = default;
};

// What a declared tensor must satisfy whoever checks it: the client before
// it sends, and every receiver as it decodes.
constexpr uint64_t kMaxTensorElements = uint64_t{1} << 40;
Status ValidateTensorDecl(const TensorDecl& t);
// Whether `text` holds a control character (below 0x20, or 0x7f): a name
// with one could forge or hide lines where it is printed.
bool HasControlCharacter(std::string_view text);

// To the coordinator: where do these tensors live?
struct Declare {
  static constexpr Opcode kOpcode = Opcode::kDeclare;
  uint64_t chunk_bytes = 0;
  uint8_t placement = 1;
  std::vector<TensorDecl> tensors;
  void EncodeBody(MessageWriter& w) const;
  static Result<Declare> DecodeBody(ByteReader& r);
  bool operator==(const Declare&) const = default;
};

struct ChunkPlacement {
  uint32_t shard = 0;
  uint64_t elem_offset = 0;
  uint64_t elem_count = 0;
  bool operator==(const ChunkPlacement&) const = default;
};

struct DeclareReply {
  static constexpr Opcode kOpcode = Opcode::kDeclareReply;
  std::vector<std::vector<ChunkPlacement>> tensors;  // one list per declared tensor
  // Per tensor: whether the chief initialised it already (a restarted chief
  // must not again), and whether the shards restore it from the checkpoint
  // of `restored_step`.
  std::vector<uint8_t> initialized;
  std::vector<uint8_t> restored;
  uint64_t restored_step = 0;
  // Per tensor, the hyper-parameters in effect: as declared first, or as the
  // chief set them since (UpdateHyper), or as saved in the checkpoint the
  // cluster restored. Creates carry these.
  std::vector<Hyperparams> hyper;
  void EncodeBody(MessageWriter& w) const;
  static Result<DeclareReply> DecodeBody(ByteReader& r);
  bool operator==(const DeclareReply&) const = default;
};

// To a shard: hold these chunks.
struct CreateEntry {
  TensorDecl tensor;
  uint32_t chunk_index = 0;
  uint32_t num_chunks = 1;
  uint64_t elem_offset = 0;
  uint64_t elem_count = 0;
  bool operator==(const CreateEntry&) const = default;
};

struct Create {
  static constexpr Opcode kOpcode = Opcode::kCreate;
  std::vector<CreateEntry> entries;
  void EncodeBody(MessageWriter& w) const;
  static Result<Create> DecodeBody(ByteReader& r);
  bool operator==(const Create&) const = default;
};

struct KeyLocation {
  uint32_t key_id = 0;
  uint32_t arena_id = 0;
  uint64_t arena_offset = 0;
  uint64_t byte_length = 0;
  uint64_t version = 0;
  bool operator==(const KeyLocation&) const = default;
};

struct ArenaKey {
  uint32_t arena_id = 0;
  std::vector<uint8_t> region;
  std::vector<uint8_t> ipc;  // same node, GPU shard: the arena's CUDA IPC handle
  bool operator==(const ArenaKey&) const = default;
};

// A CUDA IPC handle's size (cudaIpcMemHandle_t).
constexpr size_t kIpcHandleBytes = 64;

struct CreateReply {
  static constexpr Opcode kOpcode = Opcode::kCreateReply;
  std::vector<KeyLocation> keys;
  std::vector<ArenaKey> arenas;  // arenas this connection has not been told about yet
  void EncodeBody(MessageWriter& w) const;
  static Result<CreateReply> DecodeBody(ByteReader& r);
  bool operator==(const CreateReply&) const = default;
};

struct PushEntry {
  uint32_t key_id = 0;
  uint64_t staging_offset = 0;
  uint64_t byte_length = 0;
  bool operator==(const PushEntry&) const = default;
};
constexpr size_t kPushEntryBytes = 4 + 8 + 8;  // on the wire
// From the pool (core/pool_allocator.h): a large push sends a message per
// MiB whose list of entries would otherwise come from the heap on every
// call (and a list of 256 grown one by one, nine times).
using PushEntries = std::vector<PushEntry, PoolAllocator<PushEntry>>;

// "push-done": the bytes are in the sender's staging slot; apply them.
// Small pushes carry their bytes inline: then each entry's staging_offset
// is an offset into `payload` instead of the sender's staging slot.
constexpr size_t kMaxInlineBytes = 64 * 1024;

struct Push {
  static constexpr Opcode kOpcode = Opcode::kPush;
  uint64_t step = 0;  // the worker's step (sync and bounded tensors)
  PushEntries entries;
  std::vector<uint8_t> payload;  // inline bytes, or empty
  // Whether this part counts the worker's step, and over how many shards:
  // 0: it does not (an init, or an async push's other parts). An async push
  // counts on one part (1); a sync push on every part holding a sync tensor,
  // each saying how many there are, so the coordinator counts the worker's
  // step once every one of them was accepted.
  uint32_t step_parts = 0;
  size_t EncodedSizeHint() const { return 20 + entries.size() * kPushEntryBytes + payload.size(); }
  void EncodeBody(MessageWriter& w) const;
  static Result<Push> DecodeBody(ByteReader& r);
  static Status DecodeBodyInto(ByteReader& r, Push* m);
  bool operator==(const Push&) const = default;
};

// What became of one pushed chunk.
enum class PushOutcome : uint8_t {
  kApplied = 0,    // applied, or counted towards its sync step
  kStale = 1,      // sync: its step was already applied; dropped
  kDuplicate = 2,  // sync: this worker already pushed this step; dropped
  kRefused = 3,    // could not be applied: PushReply::refusals says why
};

// Why entry `index` of a push was refused (the others were still applied).
struct PushRefusal {
  uint32_t index = 0;
  StatusCode code = StatusCode::kInternal;
  std::string message;
  bool operator==(const PushRefusal&) const = default;
};

struct PushReply {
  static constexpr Opcode kOpcode = Opcode::kPushReply;
  std::vector<uint64_t> versions;     // each key's version after this push
  std::vector<uint8_t> outcomes;      // a PushOutcome per key
  std::vector<PushRefusal> refusals;  // one per kRefused outcome, in order
  size_t EncodedSizeHint() const { return 12 + versions.size() * 9; }
  void EncodeBody(MessageWriter& w) const;
  static Result<PushReply> DecodeBody(ByteReader& r);
  static Status DecodeBodyInto(ByteReader& r, PushReply* m);
  static Status DecodeRefusals(ByteReader& r, size_t refused, PushReply* m);
  bool operator==(const PushReply&) const = default;
};

struct PullEntry {
  uint32_t key_id = 0;
  uint64_t min_version = 0;
  uint64_t min_step = 0;  // sync: applied steps; bounded: steps every worker pushed
  bool operator==(const PullEntry&) const = default;
};
constexpr size_t kPullEntryBytes = 4 + 8 + 8;  // on the wire

struct Pull {
  static constexpr Opcode kOpcode = Opcode::kPull;
  std::vector<PullEntry> entries;
  // The bytes may come back inside the reply when they total at most this
  // (0: always by a one-sided read).
  uint32_t inline_max = 0;
  // How long the shard may hold the pull waiting for a version or step: it
  // then answers DeadlineExceeded saying what is missing (who has not pushed
  // the step). 0: no limit of its own.
  uint32_t wait_ms = 0;
  size_t EncodedSizeHint() const { return 12 + entries.size() * kPullEntryBytes; }
  void EncodeBody(MessageWriter& w) const;
  static Result<Pull> DecodeBody(ByteReader& r);
  static Status DecodeBodyInto(ByteReader& r, Pull* m);
  bool operator==(const Pull&) const = default;
};

// The keys are readable now and stay unchanged until the lease is released.
struct PullReply {
  static constexpr Opcode kOpcode = Opcode::kPullReply;
  uint64_t lease_id = 0;  // 0 when the bytes are inline: nothing to release
  std::vector<uint64_t> versions;
  std::vector<uint8_t> data;  // the chunks' bytes, in request order, or empty
  size_t EncodedSizeHint() const { return 16 + versions.size() * 8 + data.size(); }
  void EncodeBody(MessageWriter& w) const;
  static Result<PullReply> DecodeBody(ByteReader& r);
  static Status DecodeBodyInto(ByteReader& r, PullReply* m);
  bool operator==(const PullReply&) const = default;
};

// A chunk's optimizer state, one slot, a byte range of it at a time (a
// trainer's state_dict): get-state asks, state-reply answers; set-state
// (the chief's: load_state_dict) writes it, answered by an ack. Each range
// at most kMaxStateBytes.
constexpr uint32_t kMaxStateBytes = 4u << 20;
enum class StateSlotId : uint8_t { kFirst = 0, kSecond = 1, kMaster = 2 };
struct GetState {
  static constexpr Opcode kOpcode = Opcode::kGetState;
  uint32_t key_id = 0;
  StateSlotId slot = StateSlotId::kFirst;
  uint64_t offset = 0;
  uint32_t length = 0;
  void EncodeBody(MessageWriter& w) const;
  static Result<GetState> DecodeBody(ByteReader& r);
  bool operator==(const GetState&) const = default;
};
struct StateReply {
  static constexpr Opcode kOpcode = Opcode::kStateReply;
  uint64_t updates = 0;  // the optimizer steps the chunk applied (Adam's t)
  std::vector<uint8_t> data;
  void EncodeBody(MessageWriter& w) const;
  static Result<StateReply> DecodeBody(ByteReader& r);
  bool operator==(const StateReply&) const = default;
};
struct SetState {
  static constexpr Opcode kOpcode = Opcode::kSetState;
  uint32_t key_id = 0;
  StateSlotId slot = StateSlotId::kFirst;
  uint64_t offset = 0;
  uint64_t updates = 0;
  std::vector<uint8_t> data;
  void EncodeBody(MessageWriter& w) const;
  static Result<SetState> DecodeBody(ByteReader& r);
  bool operator==(const SetState&) const = default;
};

struct Release {
  static constexpr Opcode kOpcode = Opcode::kRelease;
  uint64_t lease_id = 0;
  void EncodeBody(MessageWriter& w) const;
  static Result<Release> DecodeBody(ByteReader& r);
  bool operator==(const Release&) const = default;
};

// The chief's: every tensor it declared so far holds its value. Its sync and
// bounded tensors that were initialised now start at `start_step`, the one
// number every worker's first push of them must be tagged with: the
// coordinator answers each wait-init with it (a step-reply).
struct InitDone {
  static constexpr Opcode kOpcode = Opcode::kInitDone;
  uint64_t start_step = 0;
  void EncodeBody(MessageWriter& w) const;
  static Result<InitDone> DecodeBody(ByteReader& r);
  bool operator==(const InitDone&) const = default;
};

// Answered with a step-reply once the chief is done: the step to start at.
struct WaitInit {
  static constexpr Opcode kOpcode = Opcode::kWaitInit;
  void EncodeBody(MessageWriter&) const {}
  static Result<WaitInit> DecodeBody(ByteReader&) { return WaitInit{}; }
  bool operator==(const WaitInit&) const = default;
};

// A worker's heartbeat; answered with an Ack.
struct Ping {
  static constexpr Opcode kOpcode = Opcode::kPing;
  void EncodeBody(MessageWriter&) const {}
  static Result<Ping> DecodeBody(ByteReader&) { return Ping{}; }
  bool operator==(const Ping&) const = default;
};

struct Ack {
  static constexpr Opcode kOpcode = Opcode::kAck;
  void EncodeBody(MessageWriter&) const {}
  static Result<Ack> DecodeBody(ByteReader&) { return Ack{}; }
  bool operator==(const Ack&) const = default;
};

// The chief tells the coordinator a tensor's new hyper-parameters, before
// it sets them on the shards (SetHyper): checkpoints save them, and later
// declares and re-creates carry them. Answered with an ack.
struct UpdateHyper {
  static constexpr Opcode kOpcode = Opcode::kUpdateHyper;
  std::string name;
  Hyperparams hyper;
  void EncodeBody(MessageWriter& w) const;
  static Result<UpdateHyper> DecodeBody(ByteReader& r);
  bool operator==(const UpdateHyper&) const = default;
};

// The chief changes optimizer hyper-parameters (a learning-rate schedule).
struct SetHyper {
  static constexpr Opcode kOpcode = Opcode::kSetHyper;
  std::vector<uint32_t> key_ids;
  Hyperparams hyper;
  void EncodeBody(MessageWriter& w) const;
  static Result<SetHyper> DecodeBody(ByteReader& r);
  bool operator==(const SetHyper&) const = default;
};

// From a ps task to the coordinator: the worker steps this shard counted
// (the parts of pushes with step_parts > 0), so the global step never needs a
// message from a worker. Async steps travel as a count, batched; a sync step
// as the workers that finished it here, once per step (when
// replicas_to_aggregate of them did, or when a later step shows that it will
// not grow). No reply.
struct SyncStepWorker {
  uint32_t rank = 0;
  uint32_t parts = 0;  // the shards the worker's step spans (Push::step_parts)
  bool operator==(const SyncStepWorker&) const = default;
};
// From the pool, as PushEntries: a shard reports every sync step.
using SyncStepWorkers = std::vector<SyncStepWorker, PoolAllocator<SyncStepWorker>>;
struct StepsApplied {
  static constexpr Opcode kOpcode = Opcode::kStepsApplied;
  uint64_t async_steps = 0;
  uint64_t sync_step = 0;
  SyncStepWorkers sync_workers;  // empty: no sync step in this report
  void EncodeBody(MessageWriter& w) const;
  static Result<StepsApplied> DecodeBody(ByteReader& r);
  bool operator==(const StepsApplied&) const = default;
};

struct GetStep {
  static constexpr Opcode kOpcode = Opcode::kGetStep;
  void EncodeBody(MessageWriter&) const {}
  static Result<GetStep> DecodeBody(ByteReader&) { return GetStep{}; }
  bool operator==(const GetStep&) const = default;
};

// From the chief to each ps task before it initialises: how far the task's
// sync tensors got (answered with a step-reply). The global step may not
// have heard of the last steps yet; tensors the chief starts now must start
// at least there, where the workers are.
struct SyncStep {
  static constexpr Opcode kOpcode = Opcode::kSyncStep;
  void EncodeBody(MessageWriter&) const {}
  static Result<SyncStep> DecodeBody(ByteReader&) { return SyncStep{}; }
  bool operator==(const SyncStep&) const = default;
};

// The answer to get-step (the global step), to sync-step (a ps task's
// furthest sync step) and to wait-init (the step the chief's latest init
// started its tensors at; see InitDone).
struct StepReply {
  static constexpr Opcode kOpcode = Opcode::kStepReply;
  uint64_t step = 0;
  void EncodeBody(MessageWriter& w) const;
  static Result<StepReply> DecodeBody(ByteReader& r);
  bool operator==(const StepReply&) const = default;
};

// A ps task joins the coordinator after authenticating, saying which chunks
// it holds (with their current hyper-parameters, and whether each holds a
// value): a restarted coordinator rebuilds its placement from these. The
// table travels in joins that say more follows, then the task's recent step
// reports, then an empty join that ends it and is answered.
struct Join {
  static constexpr Opcode kOpcode = Opcode::kJoin;
  std::vector<CreateEntry> chunks;
  std::vector<uint8_t> initialized;  // per chunk, 0 or 1
  // The furthest step the task's sync chunks have applied: where a chunk
  // restored elsewhere must resume, also when the coordinator died too.
  uint64_t sync_step = 0;
  bool more = false;
  // Chunks per join message, so that one stays well inside a frame.
  static constexpr size_t kMaxChunks = 8192;
  void EncodeBody(MessageWriter& w) const;
  static Result<Join> DecodeBody(ByteReader& r);
  bool operator==(const Join&) const = default;
};

// What a joining shard restores: the step directory of the checkpoint whose
// tensors it loads as they are created (empty: none), and the global step it
// gives its sync tensors.
struct JoinReply {
  static constexpr Opcode kOpcode = Opcode::kJoinReply;
  std::string restore_path;
  uint64_t global_step = 0;
  void EncodeBody(MessageWriter& w) const;
  static Result<JoinReply> DecodeBody(ByteReader& r);
  bool operator==(const JoinReply&) const = default;
};

// Checkpoint round, phase 1 (coordinator to every shard): stop applying
// updates and say which sync steps the tensors reached.
struct CkptPrepare {
  static constexpr Opcode kOpcode = Opcode::kCkptPrepare;
  uint64_t round = 0;
  void EncodeBody(MessageWriter& w) const { w.Put(round); }
  static Result<CkptPrepare> DecodeBody(ByteReader& r);
  bool operator==(const CkptPrepare&) const = default;
};

struct CkptPrepared {
  static constexpr Opcode kOpcode = Opcode::kCkptPrepared;
  uint64_t round = 0;
  bool has_sync = false;  // min/max are meaningful
  uint64_t min_step = 0, max_step = 0;
  uint64_t chunks = 0;  // initialised chunks held
  void EncodeBody(MessageWriter& w) const;
  static Result<CkptPrepared> DecodeBody(ByteReader& r);
  bool operator==(const CkptPrepared&) const = default;
};

// One slot of one chunk and where its bytes go.
struct CkptEntry {
  std::string name;
  uint32_t chunk_index = 0;
  uint8_t slot = 0;  // ckpt::Slot
  uint32_t file = 0;
  uint64_t offset = 0;  // in the file
  uint64_t bytes = 0;
  bool operator==(const CkptEntry&) const = default;
};

// Phase 2: write every sync tensor as of `step` (waiting for the ones behind
// it), the others as they are now, then resume.
struct CkptWrite {
  static constexpr Opcode kOpcode = Opcode::kCkptWrite;
  uint64_t round = 0;
  uint64_t step = 0;
  std::string dir;                 // the round's temporary directory
  std::vector<std::string> files;  // file names in it
  std::vector<CkptEntry> entries;
  void EncodeBody(MessageWriter& w) const;
  static Result<CkptWrite> DecodeBody(ByteReader& r);
  bool operator==(const CkptWrite&) const = default;
};

struct CkptWritten {
  static constexpr Opcode kOpcode = Opcode::kCkptWritten;
  uint64_t round = 0;
  StatusCode code = StatusCode::kOk;
  std::string message;
  // Per parameter entry (slot 0) of the request, in order: optimizer steps applied.
  std::vector<uint64_t> updates;
  void EncodeBody(MessageWriter& w) const;
  static Result<CkptWritten> DecodeBody(ByteReader& r);
  bool operator==(const CkptWritten&) const = default;
};

// The round failed elsewhere: resume and forget it.
struct CkptAbort {
  static constexpr Opcode kOpcode = Opcode::kCkptAbort;
  uint64_t round = 0;
  void EncodeBody(MessageWriter& w) const { w.Put(round); }
  static Result<CkptAbort> DecodeBody(ByteReader& r);
  bool operator==(const CkptAbort&) const = default;
};

// A worker asks for a checkpoint now; answered when it is complete.
struct SaveCheckpoint {
  static constexpr Opcode kOpcode = Opcode::kSaveCheckpoint;
  void EncodeBody(MessageWriter&) const {}
  static Result<SaveCheckpoint> DecodeBody(ByteReader&) { return SaveCheckpoint{}; }
  bool operator==(const SaveCheckpoint&) const = default;
};

struct CheckpointSaved {
  static constexpr Opcode kOpcode = Opcode::kCheckpointSaved;
  uint64_t global_step = 0;
  std::string path;
  void EncodeBody(MessageWriter& w) const;
  static Result<CheckpointSaved> DecodeBody(ByteReader& r);
  bool operator==(const CheckpointSaved&) const = default;
};

// "status" (an observer asks) and its reply: what the task holds and has
// done, as a JSON object (see `tessera status`).
struct StatusRequest {
  static constexpr Opcode kOpcode = Opcode::kStatus;
  void EncodeBody(MessageWriter&) const {}
  static Result<StatusRequest> DecodeBody(ByteReader&) { return StatusRequest{}; }
  bool operator==(const StatusRequest&) const = default;
};
struct StatusReply {
  static constexpr Opcode kOpcode = Opcode::kStatusReply;
  std::string json;
  void EncodeBody(MessageWriter& w) const;
  static Result<StatusReply> DecodeBody(ByteReader& r);
  bool operator==(const StatusReply&) const = default;
};

// A worker leaves on purpose: answered with an Ack, after which the shard
// takes the connection's end as a departure, not a loss.
struct Bye {
  static constexpr Opcode kOpcode = Opcode::kBye;
  void EncodeBody(MessageWriter&) const {}
  static Result<Bye> DecodeBody(ByteReader&) { return Bye{}; }
  bool operator==(const Bye&) const = default;
};

struct Error {
  static constexpr Opcode kOpcode = Opcode::kError;
  StatusCode code = StatusCode::kInternal;
  std::string message;
  void EncodeBody(MessageWriter& w) const;
  static Result<Error> DecodeBody(ByteReader& r);
  Status ToStatus() const { return {code, message}; }
  bool operator==(const Error&) const = default;
};

// A frame: header and body, in bytes from the message pool (a message sent
// per call then costs no heap allocation once the pool holds its size).
template <typename Msg>
MessageBytes Encode(const Msg& msg, uint64_t request_id, uint32_t flags = 0) {
  MessageBytes out;
  // Messages that know their size get it in one allocation.
  if constexpr (requires { msg.EncodedSizeHint(); }) {
    out.reserve(kHeaderSize + msg.EncodedSizeHint());
  } else {
    out.reserve(kHeaderSize + 64);
  }
  Header h;
  h.opcode = Msg::kOpcode;
  h.flags = flags;
  h.request_id = request_id;
  EncodeHeader(h, &out);
  MessageWriter w(&out);
  msg.EncodeBody(w);
  w.PatchU32(12, static_cast<uint32_t>(out.size() - kHeaderSize));
  return out;
}

// Decodes the body of a frame whose header was already decoded; the body must
// be consumed exactly.
// What a decoded body's reader says beyond the message's own checks.
inline Status CheckDecodedBody(const Header& h, const ByteReader& r, const Status& decoded) {
  if (!decoded.ok()) return decoded.WithContext(std::string("bad ") + OpcodeName(h.opcode));
  if (r.failed()) {
    return Status::InvalidArgument(std::string("bad ") + OpcodeName(h.opcode) + ": truncated body");
  }
  if (r.remaining() != 0) {
    return Status::InvalidArgument(std::string("bad ") + OpcodeName(h.opcode) + ": " +
                                   std::to_string(r.remaining()) + " trailing bytes");
  }
  return Status::Ok();
}
inline Status CheckOpcode(const Header& h, Opcode expected) {
  if (h.opcode == expected) return Status::Ok();
  return Status::InvalidArgument(std::string("expected ") + OpcodeName(expected) + ", got " +
                                 OpcodeName(h.opcode));
}

template <typename Msg>
Result<Msg> DecodeBody(const Header& h, std::span<const uint8_t> frame) {
  TESSERA_RETURN_IF_ERROR(CheckOpcode(h, Msg::kOpcode));
  ByteReader r(frame.subspan(kHeaderSize));
  auto msg = Msg::DecodeBody(r);
  TESSERA_RETURN_IF_ERROR(CheckDecodedBody(h, r, msg.status()));
  return msg;
}

// The same into `out`, whose vectors keep their capacity: a caller that
// decodes the same message again and again allocates nothing once they are
// large enough. For messages with a DecodeBodyInto.
template <typename Msg>
Status DecodeBodyInto(const Header& h, std::span<const uint8_t> frame, Msg* out) {
  TESSERA_RETURN_IF_ERROR(CheckOpcode(h, Msg::kOpcode));
  ByteReader r(frame.subspan(kHeaderSize));
  const Status st = Msg::DecodeBodyInto(r, out);
  return CheckDecodedBody(h, r, st);
}

// Header and body in one step.
template <typename Msg>
Result<Msg> Decode(std::span<const uint8_t> frame) {
  auto h = DecodeHeader(frame);
  if (!h.ok()) return h.status();
  return DecodeBody<Msg>(*h, frame);
}

}  // namespace tessera::wire
