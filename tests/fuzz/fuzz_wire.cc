// Every wire decoder, on any bytes a peer could send: a frame is decoded as
// the message its header names. Whatever decodes must encode again, and the
// encoding must be stable (decode, encode, decode, encode gives the same
// bytes twice), so no decoder accepts a value the encoder cannot say.
#include <cstdint>
#include <span>
#include <vector>

#include "fuzz_check.h"
#include "wire/messages.h"
#include "wire/row_messages.h"

namespace {

using namespace tessera::wire;

template <typename Msg>
void DecodeAs(const Header& h, std::span<const uint8_t> frame) {
  auto msg = DecodeBody<Msg>(h, frame);
  if (!msg.ok()) {
    FUZZ_CHECK(!msg.status().message().empty(), "a decode error says nothing");
    return;
  }
  const tessera::MessageBytes once = Encode(*msg, h.request_id, h.flags);
  auto again = Decode<Msg>(once);
  FUZZ_CHECK(again.ok(), "a decoded message does not decode after encoding");
  FUZZ_CHECK(Encode(*again, h.request_id, h.flags) == once, "encoding is not stable");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> frame(data, size);
  auto h = DecodeHeader(frame);
  if (!h.ok()) return 0;
  switch (h->opcode) {
    case Opcode::kHello:
      DecodeAs<Hello>(*h, frame);
      break;
    case Opcode::kChallenge:
      DecodeAs<Challenge>(*h, frame);
      break;
    case Opcode::kAuth:
      DecodeAs<Auth>(*h, frame);
      break;
    case Opcode::kWelcome:
      DecodeAs<Welcome>(*h, frame);
      break;
    case Opcode::kDeclare:
      DecodeAs<Declare>(*h, frame);
      break;
    case Opcode::kDeclareReply:
      DecodeAs<DeclareReply>(*h, frame);
      break;
    case Opcode::kCreate:
      DecodeAs<Create>(*h, frame);
      break;
    case Opcode::kCreateReply:
      DecodeAs<CreateReply>(*h, frame);
      break;
    case Opcode::kPush:
      DecodeAs<Push>(*h, frame);
      break;
    case Opcode::kPushReply:
      DecodeAs<PushReply>(*h, frame);
      break;
    case Opcode::kPull:
      DecodeAs<Pull>(*h, frame);
      break;
    case Opcode::kPullReply:
      DecodeAs<PullReply>(*h, frame);
      break;
    case Opcode::kRelease:
      DecodeAs<Release>(*h, frame);
      break;
    case Opcode::kInitDone:
      DecodeAs<InitDone>(*h, frame);
      break;
    case Opcode::kWaitInit:
      DecodeAs<WaitInit>(*h, frame);
      break;
    case Opcode::kAck:
      DecodeAs<Ack>(*h, frame);
      break;
    case Opcode::kError:
      DecodeAs<Error>(*h, frame);
      break;
    case Opcode::kSetHyper:
      DecodeAs<SetHyper>(*h, frame);
      break;
    case Opcode::kSyncStep:
      DecodeAs<SyncStep>(*h, frame);
      break;
    case Opcode::kGetState:
      DecodeAs<GetState>(*h, frame);
      break;
    case Opcode::kStateReply:
      DecodeAs<StateReply>(*h, frame);
      break;
    case Opcode::kSetState:
      DecodeAs<SetState>(*h, frame);
      break;
    case Opcode::kDeclareTable:
      DecodeAs<DeclareTable>(*h, frame);
      break;
    case Opcode::kDeclareTableReply:
      DecodeAs<DeclareTableReply>(*h, frame);
      break;
    case Opcode::kCreateTable:
      DecodeAs<CreateTable>(*h, frame);
      break;
    case Opcode::kRowsPull:
      DecodeAs<RowsPull>(*h, frame);
      break;
    case Opcode::kRowsPullReply:
      DecodeAs<RowsPullReply>(*h, frame);
      break;
    case Opcode::kRowsPush:
      DecodeAs<RowsPush>(*h, frame);
      break;
    case Opcode::kRowsPushReply:
      DecodeAs<RowsPushReply>(*h, frame);
      break;
    case Opcode::kUpdateHyper:
      DecodeAs<UpdateHyper>(*h, frame);
      break;
    case Opcode::kStepsApplied:
      DecodeAs<StepsApplied>(*h, frame);
      break;
    case Opcode::kGetStep:
      DecodeAs<GetStep>(*h, frame);
      break;
    case Opcode::kStepReply:
      DecodeAs<StepReply>(*h, frame);
      break;
    case Opcode::kPing:
      DecodeAs<Ping>(*h, frame);
      break;
    case Opcode::kJoin:
      DecodeAs<Join>(*h, frame);
      break;
    case Opcode::kJoinReply:
      DecodeAs<JoinReply>(*h, frame);
      break;
    case Opcode::kCkptPrepare:
      DecodeAs<CkptPrepare>(*h, frame);
      break;
    case Opcode::kCkptPrepared:
      DecodeAs<CkptPrepared>(*h, frame);
      break;
    case Opcode::kCkptWrite:
      DecodeAs<CkptWrite>(*h, frame);
      break;
    case Opcode::kCkptWritten:
      DecodeAs<CkptWritten>(*h, frame);
      break;
    case Opcode::kCkptAbort:
      DecodeAs<CkptAbort>(*h, frame);
      break;
    case Opcode::kSaveCheckpoint:
      DecodeAs<SaveCheckpoint>(*h, frame);
      break;
    case Opcode::kCheckpointSaved:
      DecodeAs<CheckpointSaved>(*h, frame);
      break;
    case Opcode::kStatus:
      DecodeAs<StatusRequest>(*h, frame);
      break;
    case Opcode::kStatusReply:
      DecodeAs<StatusReply>(*h, frame);
      break;
    case Opcode::kBye:
      DecodeAs<Bye>(*h, frame);
      break;
  }
  return 0;
}
