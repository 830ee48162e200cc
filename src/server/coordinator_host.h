// The coordinator hosted in this server process (ps task 0, or the
// coordinator job alone), as the server's sessions see it: the requests
// that address it, the ps tasks' links to it, its start and its end. Its
// implementation (HostedCoordinator) is the one file of server/ that knows
// coord/; the shard reaches it as a CoordinatorPort. Progress thread only,
// but for Open and the counters.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "ckpt/checkpoint.h"
#include "server/coordinator_port.h"
#include "tessera/server.h"
#include "transport/transport.h"
#include "wire/header.h"

namespace tessera::server {

class CoordinatorHost : public CoordinatorPort {
 public:
  // A connection as the sessions know it; opaque to the coordinator.
  using PeerId = uintptr_t;
  // A worker that addresses the coordinator, as the handshake authenticated it.
  struct Worker {
    PeerId peer = 0;
    std::string task;
    bool reader = false;  // a read-only client: it has no rank
    uint32_t rank = 0;
  };
  // What the server lends it.
  struct Hooks {
    transport::Context* ctx = nullptr;     // its timers and posted work
    ckpt::CheckpointKey checkpoint_key{};  // what its checkpoints are signed with
    // A frame to a peer (one that left meanwhile is skipped).
    std::function<void(PeerId, MessageBytes)> send_to_peer;
    // A checkpoint round's frame to the ps task hosted beside it (null when
    // it is the coordinator job alone).
    std::function<void(MessageBytes)> to_local_shard;
  };

  // Finds the checkpoint to resume from (before the progress thread serves).
  virtual Status Open(Hooks hooks) = 0;
  // Serves; `local_joined` (null for the coordinator job alone) hears what
  // the ps task hosted beside it restores, once every ps task joined.
  virtual void Start(std::function<void(const wire::JoinReply&)> local_joined) = 0;
  // A worker's request that addresses the coordinator
  // (wire::AddressesCoordinator).
  virtual void OnWorkerRequest(const Worker& from, const wire::Header& h,
                               std::span<const uint8_t> frame) = 0;
  // A ps task's frame over its link: join, step reports, checkpoint
  // replies. A non-OK status: the sessions close the link with it.
  virtual Status OnLinkFrame(PeerId from, int task_index, const wire::Header& h,
                             std::span<const uint8_t> frame) = 0;
  virtual void OnPeerGone(PeerId peer) = 0;
  // The final checkpoint of a clean stop, if checkpoints are written;
  // `done` runs on the progress thread (at once when none is).
  virtual void SaveFinal(std::function<void()> done) = 0;
  // No more rounds; waits for file work to end.
  virtual void Stop() = 0;

  // Any thread.
  virtual uint64_t global_step() const = 0;
  // Its checkpoints and the steps the ps tasks reported, into `stats`.
  virtual void AddStats(ServerStats* stats) const = 0;
};

}  // namespace tessera::server
