// A chunk's optimizer state read and written by a worker (get-state and
// set-state): what a trainer's state_dict() and load_state_dict() move.
// The progress thread runs these between updates, so a read never sees half
// a step; a write waits for no step either, and is refused while a
// checkpoint round cuts the state. Only the chief sets state; a reader (a
// read-only client) neither reads nor sets it.
#pragma once

#include "server/checkpoint_participant.h"
#include "server/param_memory.h"
#include "server/param_table.h"
#include "server/peer.h"
#include "server/peer_sessions.h"
#include "wire/messages.h"

namespace tessera::server {

class OptimizerStateAccess {
 public:
  // Each outlives this.
  OptimizerStateAccess(ParamTable& table, ParamMemory& memory, PeerSessions& sessions,
                       const CheckpointParticipant& checkpoints)
      : table_(table), memory_(memory), sessions_(sessions), checkpoints_(checkpoints) {}

  void Get(Peer& peer, uint64_t request_id, const wire::GetState& msg);
  void Set(Peer& peer, uint64_t request_id, const wire::SetState& msg);

 private:
  // The slot a get-state or set-state names, once the peer may, the chunk
  // has it and the range lies inside it; else why not.
  Result<StateBuffer*> Range(const Peer& peer, uint32_t key_id, wire::StateSlotId slot,
                             uint64_t offset, uint64_t length);

  ParamTable& table_;
  ParamMemory& memory_;
  PeerSessions& sessions_;
  const CheckpointParticipant& checkpoints_;
};

}  // namespace tessera::server
