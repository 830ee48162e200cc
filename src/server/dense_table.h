// The dense tensors' table: their chunks (ParamTable) and the units that
// serve them, each owning its state: creates and restores (ChunkCreator),
// pushes (PushApplier), pulls and leases (PullServer), optimizer state
// (OptimizerStateAccess) and checkpoint cuts (DenseCut). The shard hands it
// the requests of its opcodes, one call per message; what crosses its units
// goes through here (a push applied or a lease ended lets what waited in
// this table move: no other table's entries changed).
// Progress thread only, but AddStats.
#pragma once

#include "ckpt/checkpoint.h"
#include "core/spares.h"
#include "server/checkpoint_participant.h"
#include "server/chunk_creator.h"
#include "server/coordinator_port.h"
#include "server/dense_cut.h"
#include "server/optimizer_state_access.h"
#include "server/param_table.h"
#include "server/peer_sessions.h"
#include "server/pull_server.h"
#include "server/push_applier.h"
#include "server/shard_memory.h"
#include "server/step_reporter.h"
#include "server/table.h"
#include "server/worker_roster.h"
#include "tessera/server.h"

namespace tessera::server {

class DenseTable final : public Table {
 public:
  // What the shard lends it; each outlives it.
  struct Lent {
    const ServerOptions* options = nullptr;
    transport::Context* ctx = nullptr;
    PeerSessions* sessions = nullptr;
    const WorkerRoster* roster = nullptr;
    ShardMemory* memory = nullptr;
    CoordinatorPort* hosted = nullptr;     // the coordinator hosted here, or null
    ckpt::CheckpointKey checkpoint_key{};  // what restored checkpoints are checked with
    CheckpointParticipant* checkpoints = nullptr;
    StepReporter* steps = nullptr;
  };
  explicit DenseTable(Lent lent);
  DenseTable(const DenseTable&) = delete;
  DenseTable& operator=(const DenseTable&) = delete;

  std::string_view kind() const override { return "dense"; }
  size_t entries() const override { return chunks_.size(); }
  uint64_t held_bytes() const override { return chunks_.held_bytes(); }

  std::vector<wire::Opcode> Opcodes() const override;
  void OnRequest(Peer& peer, const wire::Header& h, std::span<const uint8_t> frame) override;
  void Ready(const wire::JoinReply& reply) override { creates_.Ready(reply); }
  void RetryWaiting() override;
  void OnPeerGone(const Peer& peer) override;
  void Begin() override { pulls_.Begin(); }
  void Stop() override;
  void Release() override { chunks_.Release(); }
  void AddStats(ServerStats* stats) const override;

  uint64_t SyncStepReached() const override { return chunks_.SyncStepReached(); }
  void AddToJoin(std::vector<wire::Join>* joins) const override;
  void ReportForPrepare(wire::CkptPrepared* reply) const override {
    chunks_.ReportForPrepare(reply);
  }
  Result<bool> BeginCut(CutRound* round) override { return cut_.Begin(round); }
  void DropCut() override { cut_.Drop(); }

 private:
  void OnPull(Peer& peer, uint64_t request_id, wire::Pull msg);
  void OnSetHyper(Peer& peer, uint64_t request_id, const wire::SetHyper& msg);
  // A request whose body this table cannot accept: its error to the peer.
  void Refuse(Peer& peer, const wire::Header& h, const Status& why);
  // The body decoded into a message an earlier call of its kind handed back
  // (`spares`), so that its vectors keep their capacity, and handed to
  // `serve`; or Refuse.
  template <typename Msg, typename Serve>
  void DecodedIntoSpare(Peer& peer, const wire::Header& h, std::span<const uint8_t> frame,
                        Spares<Msg>& spares, Serve serve);

  const Lent lent_;
  ParamTable chunks_;
  DenseCut cut_;
  OptimizerStateAccess state_;  // get-state and set-state
  ChunkCreator creates_;
  PullServer pulls_;
  PushApplier pushes_;
};

}  // namespace tessera::server
