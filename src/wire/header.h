// The fixed frame every Tessera message starts with (24 bytes, little-endian):
//
//   u32 magic "TSRA" | u16 version | u16 opcode | u32 flags | u32 body_length | u64 request_id
//
// followed by exactly body_length bytes of the opcode's body.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/bytes.h"
#include "tessera/status.h"

namespace tessera::wire {

// The transport message id that carries every Tessera frame.
constexpr uint16_t kProtocolMsg = 1;

constexpr uint32_t kMagic = 0x41525354;  // "TSRA" read as little-endian
// 2: CUDA IPC (node ids, IPC handles). 3: the client proves first; the
// hello carries the cluster spec. 4: pulls say how long they may wait;
// workers say bye. 5: shards count steps (Push::step_parts, StepsApplied),
// workers no longer send StepDone; push_pull in one round trip (then-pull);
// hyper-parameters set at run time reach the coordinator (update-hyper) and
// come back in declare replies. 6: a join carries the ps task's chunk table,
// from which a restarted coordinator rebuilds its placement. 7: read-only
// clients (the reader role, authenticated with the reader key). 8: init-done
// carries the step its tensors start at, and wait-init is answered with it;
// sync-step asks a ps task how far its sync tensors got.
constexpr uint16_t kVersion = 11;
constexpr size_t kHeaderSize = 24;
// No control message is larger: tensor data never travels in messages.
constexpr uint32_t kMaxBodyLength = 16u << 20;

enum class Opcode : uint16_t {
  kHello = 1,
  kChallenge = 2,
  kAuth = 3,
  kWelcome = 4,
  kDeclare = 5,
  kDeclareReply = 6,
  kCreate = 7,
  kCreateReply = 8,
  kPush = 9,
  kPushReply = 10,
  kPull = 11,
  kPullReply = 12,
  kRelease = 13,
  kInitDone = 14,
  kWaitInit = 15,
  kAck = 16,
  kError = 17,
  kSetHyper = 18,
  kStepsApplied = 19,
  kGetStep = 20,
  kStepReply = 21,
  kPing = 22,
  kJoin = 23,
  kJoinReply = 24,
  kCkptPrepare = 25,
  kCkptPrepared = 26,
  kCkptWrite = 27,
  kCkptWritten = 28,
  kCkptAbort = 29,
  kSaveCheckpoint = 30,
  kCheckpointSaved = 31,
  kStatus = 32,
  kStatusReply = 33,
  kBye = 34,
  kUpdateHyper = 35,
  kSyncStep = 36,
  kGetState = 37,
  kStateReply = 38,
  kSetState = 39,
  kDeclareTable = 40,
  kDeclareTableReply = 41,
  kCreateTable = 42,
  kRowsPull = 43,
  kRowsPullReply = 44,
  kRowsPush = 45,
  kRowsPushReply = 46,
};
constexpr uint16_t kMaxOpcode = 46;
const char* OpcodeName(Opcode op);
// A worker's request that the coordinator answers, wherever it runs (the
// others a worker sends are a ps task's to answer).
bool AddressesCoordinator(Opcode op);

// Header flags.
constexpr uint32_t kFlagInit = 1u << 0;  // a push that initialises (the chief's)
// push_pull in one round trip: a push whose bytes ride inline, answered
// with the weights after it (a pull-reply, inline) instead of a push-reply.
// Not for sync tensors, whose weights change only when the step applies.
constexpr uint32_t kFlagThenPull = 1u << 1;
// A push whose bytes the worker copied into its CUDA IPC slot (same node,
// GPU shard) instead of putting them into its fabric staging slot.
constexpr uint32_t kFlagIpcSlot = 1u << 3;
constexpr uint32_t kKnownFlags = kFlagInit | kFlagThenPull | kFlagIpcSlot;

struct Header {
  uint16_t version = kVersion;
  Opcode opcode = Opcode::kError;
  uint32_t flags = 0;
  uint32_t body_length = 0;
  uint64_t request_id = 0;
};

void EncodeHeader(const Header& h, MessageBytes* out);
// Validates magic, version, opcode, flags and that exactly body_length bytes follow.
Result<Header> DecodeHeader(std::span<const uint8_t> frame);

}  // namespace tessera::wire
