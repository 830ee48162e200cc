// A shard's creates: a worker's declare makes the chunks placed here (or, for
// a reader, finds those that exist as it describes them), each restored from
// the checkpoint being restored, if any, as it is made; a coordinator hosted
// in this process hears of them. Creates wait until the shard first joined
// its coordinator: only its answer says what to restore. Progress thread
// only.
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <tuple>

#include "ckpt/checkpoint.h"
#include "server/chunk_restorer.h"
#include "server/coordinator_port.h"
#include "server/param_table.h"
#include "server/peer.h"
#include "server/peer_sessions.h"
#include "server/shard_memory.h"
#include "tessera/server.h"
#include "wire/messages.h"

namespace tessera::server {

class ChunkCreator {
 public:
  // What the shard lends it; each outlives it.
  struct Lent {
    const ServerOptions* options = nullptr;
    PeerSessions* sessions = nullptr;
    ParamTable* table = nullptr;
    ShardMemory* memory = nullptr;       // its budget; restored values go there
    CoordinatorPort* hosted = nullptr;   // the coordinator hosted here, or null
    ckpt::CheckpointKey checkpoint_key;  // what restored checkpoints are checked with
  };
  explicit ChunkCreator(Lent lent) : lent_(lent) {}
  ChunkCreator(const ChunkCreator&) = delete;
  ChunkCreator& operator=(const ChunkCreator&) = delete;

  // A create: served now, or held until Ready.
  void Serve(Peer& peer, uint64_t request_id, const wire::Create& msg);
  // The first join's answer: what to restore (if anything); then the creates
  // that waited for it.
  void Ready(const wire::JoinReply& reply);
  // Any thread.
  void AddStats(ServerStats* stats) const;

 private:
  void Create(Peer& peer, uint64_t request_id, const wire::Create& msg);
  // A reader's create: the keys of chunks that exist as it describes them;
  // nothing is created.
  Result<Param*> FindForReader(const wire::CreateEntry& entry);
  // A chunk created while a checkpoint is being restored loads its value and
  // optimizer state from it.
  Status OpenRestore(const std::string& path, uint64_t step);

  const Lent lent_;
  bool ready_ = false;
  std::deque<std::tuple<EndpointPtr, uint64_t, wire::Create>> held_;
  std::unique_ptr<ChunkRestorer> restorer_;  // while a checkpoint is restored
  std::atomic<uint64_t> tensors_{0}, chunks_restored_{0};
};

}  // namespace tessera::server
