#include "server/optimizer_state_access.h"

#include <string>

#include "core/dtype.h"

namespace tessera::server {
namespace {

const char* SlotName(wire::StateSlotId slot) {
  switch (slot) {
    case wire::StateSlotId::kFirst:
      return "state slot 0";
    case wire::StateSlotId::kSecond:
      return "state slot 1";
    case wire::StateSlotId::kMaster:
      return "the f32 master copy";
  }
  return "an unknown state slot";
}

}  // namespace

Result<StateBuffer*> OptimizerStateAccess::Range(const Peer& peer, uint32_t key_id,
                                                 wire::StateSlotId slot, uint64_t offset,
                                                 uint64_t length) {
  if (peer.is_reader) {
    return Status::PermissionDenied("optimizer state asked by reader " + peer.hello.task +
                                    ", a read-only client");
  }
  Param* p = table_.Find(key_id);
  if (p == nullptr) return Status::NotFound("state of unknown key id " + std::to_string(key_id));
  if (!p->initialized) {
    return Status::FailedPrecondition("tensor '" + p->display_name +
                                      "' is not initialised: it has no optimizer state yet");
  }
  StateBuffer* buffer = slot == wire::StateSlotId::kFirst    ? &p->state0
                        : slot == wire::StateSlotId::kSecond ? &p->state1
                                                             : &p->master;
  if (buffer->empty()) {
    return Status::InvalidArgument("tensor '" + p->display_name + "' (" + UpdateRuleName(p->rule) +
                                   ", " + DTypeName(p->dtype) + ") keeps no " + SlotName(slot));
  }
  if (offset > buffer->size() || length > buffer->size() - offset) {
    return Status::InvalidArgument("bytes " + std::to_string(offset) + " to " +
                                   std::to_string(offset + length) + " of " + SlotName(slot) +
                                   " of '" + p->display_name + "', which holds " +
                                   std::to_string(buffer->size()));
  }
  return buffer;
}

void OptimizerStateAccess::Get(Peer& peer, uint64_t request_id, const wire::GetState& msg) {
  auto buffer = Range(peer, msg.key_id, msg.slot, msg.offset, msg.length);
  if (!buffer.ok()) return sessions_.SendError(peer, request_id, buffer.status());
  wire::StateReply reply;
  reply.updates = table_.Find(msg.key_id)->updates;
  reply.data.resize(msg.length);
  Status st = memory_.ToHost(reply.data.data(), (*buffer)->data() + msg.offset, msg.length);
  if (!st.ok()) return sessions_.SendError(peer, request_id, st.WithContext("get-state"));
  peer.ep->Send(wire::kProtocolMsg, wire::Encode(reply, request_id));
}

void OptimizerStateAccess::Set(Peer& peer, uint64_t request_id, const wire::SetState& msg) {
  if (!peer.is_reader && peer.hello.task_index != 0) {
    return sessions_.SendError(
        peer, request_id,
        Status::PermissionDenied(peer.hello.task +
                                 " is not the chief: only the chief sets optimizer "
                                 "state"));
  }
  auto buffer = Range(peer, msg.key_id, msg.slot, msg.offset, msg.data.size());
  if (!buffer.ok()) return sessions_.SendError(peer, request_id, buffer.status());
  if (checkpoints_.frozen()) {
    return sessions_.SendError(
        peer, request_id,
        Status::Unavailable("a checkpoint round is cutting the state: set it again "
                            "once it is written"));
  }
  Param* p = table_.Find(msg.key_id);
  Status st = memory_.FromHost((*buffer)->data() + msg.offset, msg.data.data(), msg.data.size());
  if (!st.ok()) return sessions_.SendError(peer, request_id, st.WithContext("set-state"));
  p->updates = msg.updates;
  peer.ep->Send(wire::kProtocolMsg, wire::Encode(wire::Ack{}, request_id));
}

}  // namespace tessera::server
