// One pull's chunks read out of a shard's arenas under the lease its reply
// granted (arena_pull.cc).
#pragma once

#include "client/host_bounce.h"
#include "client/pull_receiver.h"

namespace tessera::client {

// What the gets share, from the pool: each get's completion holds only this
// and its chunks' range, and so stays inside its Completion (no allocation
// per get).
struct PullReceiver::ArenaPull {
  using Ptr = std::shared_ptr<ArenaPull>;

  PullReceiver* receiver = nullptr;
  int outstanding = 0;  // chunks not yet read
  Status status;
  bool finished = false;
  int shard = 0;
  uint64_t op_id = 0;
  uint64_t lease = 0;
  PartDone done;
  // The chunks: where a gathered get's bytes are copied out to.
  ChunkIos ios;
  // GPU chunks read into host memory (a fabric that cannot reach GPU
  // memory, and the user allowed staging), copied up once every get is done.
  HostBounce bounce;

  // Runs once: when the gets are done, on a failure, or when the shard is
  // lost.
  void Finish(const Status& result) {
    if (finished) return;
    finished = true;
    receiver->links_[shard].in_flight.ops.erase(op_id);
    done(result);
  }
  // The bytes are ours: the shard may update them again.
  void Release() {
    ShardLink& conn = receiver->links_[shard];
    if (conn.dead.ok() && conn.ep) {
      conn.ep->Send(wire::kProtocolMsg, wire::Encode(wire::Release{lease}, 0));
    }
  }
  static void Start(PullReceiver* receiver, int shard, ChunkIos ios, uint64_t lease,
                    const PartDone& done);
  void Get(const Ptr& self);
  void Read(const Status& st, uint32_t first, uint32_t end, const uint8_t* gathered);
};

}  // namespace tessera::client
