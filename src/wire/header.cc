#include "wire/header.h"

#include <string>

#include "core/bytes.h"

namespace tessera::wire {

const char* OpcodeName(Opcode op) {
  switch (op) {
    case Opcode::kHello:
      return "hello";
    case Opcode::kChallenge:
      return "challenge";
    case Opcode::kAuth:
      return "auth";
    case Opcode::kWelcome:
      return "welcome";
    case Opcode::kDeclare:
      return "declare";
    case Opcode::kDeclareReply:
      return "declare-reply";
    case Opcode::kCreate:
      return "create";
    case Opcode::kCreateReply:
      return "create-reply";
    case Opcode::kPush:
      return "push-done";
    case Opcode::kPushReply:
      return "push-reply";
    case Opcode::kPull:
      return "pull";
    case Opcode::kPullReply:
      return "pull-reply";
    case Opcode::kRelease:
      return "release";
    case Opcode::kInitDone:
      return "init-done";
    case Opcode::kWaitInit:
      return "wait-init";
    case Opcode::kAck:
      return "ack";
    case Opcode::kError:
      return "error";
    case Opcode::kSetHyper:
      return "set-hyper";
    case Opcode::kStepsApplied:
      return "steps-applied";
    case Opcode::kGetStep:
      return "get-step";
    case Opcode::kStepReply:
      return "step-reply";
    case Opcode::kPing:
      return "ping";
    case Opcode::kJoin:
      return "join";
    case Opcode::kJoinReply:
      return "join-reply";
    case Opcode::kCkptPrepare:
      return "checkpoint-prepare";
    case Opcode::kCkptPrepared:
      return "checkpoint-prepared";
    case Opcode::kCkptWrite:
      return "checkpoint-write";
    case Opcode::kCkptWritten:
      return "checkpoint-written";
    case Opcode::kCkptAbort:
      return "checkpoint-abort";
    case Opcode::kSaveCheckpoint:
      return "save-checkpoint";
    case Opcode::kCheckpointSaved:
      return "checkpoint-saved";
    case Opcode::kStatus:
      return "status";
    case Opcode::kStatusReply:
      return "status-reply";
    case Opcode::kBye:
      return "bye";
    case Opcode::kUpdateHyper:
      return "update-hyper";
    case Opcode::kSyncStep:
      return "sync-step";
    case Opcode::kGetState:
      return "get-state";
    case Opcode::kStateReply:
      return "state-reply";
    case Opcode::kSetState:
      return "set-state";
    case Opcode::kDeclareTable:
      return "declare-table";
    case Opcode::kDeclareTableReply:
      return "declare-table-reply";
    case Opcode::kCreateTable:
      return "create-table";
    case Opcode::kRowsPull:
      return "rows-pull";
    case Opcode::kRowsPullReply:
      return "rows-pull-reply";
    case Opcode::kRowsPush:
      return "rows-push";
    case Opcode::kRowsPushReply:
      return "rows-push-reply";
  }
  return "unknown";
}

void EncodeHeader(const Header& h, MessageBytes* out) {
  MessageWriter w(out);
  w.Put(kMagic);
  w.Put(h.version);
  w.Put(static_cast<uint16_t>(h.opcode));
  w.Put(h.flags);
  w.Put(h.body_length);
  w.Put(h.request_id);
}

Result<Header> DecodeHeader(std::span<const uint8_t> frame) {
  if (frame.size() < kHeaderSize) {
    return Status::InvalidArgument("message of " + std::to_string(frame.size()) +
                                   " bytes is shorter than the " + std::to_string(kHeaderSize) +
                                   "-byte header");
  }
  ByteReader r(frame);
  uint32_t magic = 0;
  uint16_t opcode = 0;
  Header h;
  r.Get(&magic);
  r.Get(&h.version);
  r.Get(&opcode);
  r.Get(&h.flags);
  r.Get(&h.body_length);
  r.Get(&h.request_id);
  if (magic != kMagic) return Status::InvalidArgument("bad magic: not a Tessera message");
  if (h.version != kVersion) {
    return Status::InvalidArgument("protocol version " + std::to_string(h.version) +
                                   " is not supported (this build speaks " +
                                   std::to_string(kVersion) + ")");
  }
  if (opcode == 0 || opcode > kMaxOpcode) {
    return Status::InvalidArgument("unknown opcode " + std::to_string(opcode));
  }
  h.opcode = static_cast<Opcode>(opcode);
  if (h.flags & ~kKnownFlags) {
    return Status::InvalidArgument("unknown flags 0x" + std::to_string(h.flags & ~kKnownFlags) +
                                   " in " + OpcodeName(h.opcode));
  }
  if (h.body_length > kMaxBodyLength) {
    return Status::InvalidArgument(std::string(OpcodeName(h.opcode)) + " body of " +
                                   std::to_string(h.body_length) + " bytes exceeds the limit");
  }
  if (h.body_length != frame.size() - kHeaderSize) {
    return Status::InvalidArgument(std::string(OpcodeName(h.opcode)) + " says " +
                                   std::to_string(h.body_length) + " body bytes but carries " +
                                   std::to_string(frame.size() - kHeaderSize));
  }
  return h;
}

bool AddressesCoordinator(Opcode op) {
  switch (op) {
    case Opcode::kDeclare:
    case Opcode::kDeclareTable:
    case Opcode::kGetStep:
    case Opcode::kUpdateHyper:
    case Opcode::kSaveCheckpoint:
    case Opcode::kInitDone:
    case Opcode::kWaitInit:
      return true;
    default:
      return false;
  }
}

}  // namespace tessera::wire
