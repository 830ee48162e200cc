// The shard: holds the parameter table, applies pushed updates and grants
// pull leases to the workers the server's PeerSessions authenticated (the
// server's Router hands it their requests). It reaches the coordinator
// through a CoordinatorPort (hosted in this process, or over its
// CoordinatorLink). All its state lives on the transport's progress thread.
#pragma once

#include <deque>
#include <future>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>
#include <vector>

#include "ckpt/checkpoint.h"
#include "core/borrowed.h"
#include "server/apply.h"
#include "server/bye_round.h"
#include "server/checkpoint_participant.h"
#include "server/chunk_restorer.h"
#include "server/coordinator_link.h"
#include "server/coordinator_port.h"
#include "server/optimizer_state_access.h"
#include "server/param_table.h"
#include "server/peer.h"
#include "server/peer_sessions.h"
#include "server/pull_server.h"
#include "server/push_applier.h"
#include "server/shard_memory.h"
#include "server/step_reporter.h"
#include "server/worker_roster.h"
#include "tessera/server.h"
#include "transport/transport.h"
#include "wire/handshake.h"

namespace tessera::server {

using wire::kProtocolMsg;

class Shard {
 public:
  // What the server lends the shard; each outlives it.
  struct Lent {
    transport::Context* ctx = nullptr;
    PeerSessions* sessions = nullptr;      // the workers it serves
    const WorkerRoster* roster = nullptr;  // which of them may still push
    ByeRound* bye = nullptr;               // a clean stop's farewell
    ckpt::CheckpointKey checkpoint_key{};  // what restored checkpoints are checked with
    // The coordinator hosted in this process, or null: the shard joins the
    // one another task hosts over its CoordinatorLink.
    CoordinatorPort* hosted = nullptr;
    // The coordinator said it stops, or the link to it ended.
    std::function<void()> coordinator_stopped;
  };
  Shard(const ServerOptions& options, Lent lent)
      : options_(options), lent_(std::move(lent)), ctx_(lent_.ctx), sessions_(lent_.sessions) {}
  ~Shard();
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;

  // Its memory, parameter table, checkpoint rounds and link (not yet
  // connected), before the server listens.
  Status Open();
  // Serves: the lease timer and, off the coordinator, the link's first join.
  void Begin();
  // What the parameters are held in, for the server's first log line.
  std::string DescribeMemory() const;

  // The opcodes a shard serves (creates, pushes, pulls, optimizer state).
  static bool Serves(wire::Opcode op);
  // Progress thread from here on.
  // An authenticated peer's request of an opcode it Serves.
  void OnRequest(Peer& peer, const wire::Header& h, std::span<const uint8_t> frame);
  // Whether `ep` is its link to the coordinator, then handled here.
  bool OnLinkFrame(const transport::Endpoint* ep, std::span<const uint8_t> frame);
  bool OnLinkClosed(const transport::Endpoint* ep, const Status& why);
  // An authenticated worker: its staging slot (and CUDA IPC slot) into the
  // welcome.
  Status OnWorkerJoins(Peer& peer, wire::Welcome* welcome);
  // A peer's connection ended: its leases, waiting pushes and pulls go.
  // `rank_departed`: its worker rank lost its last connection.
  void OnPeerGone(const Peer& peer, bool rank_departed);
  // From the coordinator hosted here: a checkpoint round's frame, and what
  // to restore once every ps task joined.
  void OnCheckpointFrame(std::span<const uint8_t> frame);
  void OnHostedJoined(const wire::JoinReply& reply);
  // A clean stop: the bye to the coordinator over the link, if joined.
  void SayByeToCoordinator();
  // Whether the coordinator stopped or cannot be reached (true where it is
  // hosted here).
  bool coordinator_gone() const;
  // Serves no more; then, once the progress thread stopped, JoinWriter and
  // Release.
  void StopServing();
  void JoinWriter();
  void Release();

  // Any thread.
  void AddStats(ServerStats* stats) const;
  // Its part of `tessera status`: memory and staging.
  void AddStatus(nlohmann::json* status) const;

 private:
  template <typename Msg>
  void Reply(Peer& peer, uint64_t request_id, const Msg& msg) {
    peer.ep->Send(kProtocolMsg, wire::Encode(msg, request_id));
  }

  void OnCreate(Peer& peer, uint64_t request_id, const wire::Create& msg);
  // A reader's create: the keys of chunks that exist as it describes them;
  // nothing is created.
  Result<Param*> FindForReader(const wire::CreateEntry& entry);
  void OnPull(Peer& peer, uint64_t request_id, wire::Pull msg);
  void OnSetHyper(Peer& peer, uint64_t request_id, const wire::SetHyper& msg);
  // Membership: a ps task that is not the coordinator joins it (retrying
  // until it answers) and learns what to restore; creates wait for that.
  // This task's join, as frames: its chunks (a restarted coordinator learns
  // placement back from them), the last sync steps it reported and those
  // counted since, then the join's end.
  std::vector<MessageBytes> JoinFrames();
  // The furthest step this task's sync chunks applied (0: none).
  uint64_t SyncStepReached() const;
  // The link to a coordinator another task hosts (link_).
  void OpenCoordinatorLink();
  void OnJoined(const wire::JoinReply& reply);
  // The first join's answer: what to restore; then the creates that waited.
  void FirstJoined(const wire::JoinReply& reply);
  void ServeDeferredCreates();
  // Restore: a chunk created while a checkpoint is being restored loads its
  // value and optimizer state from it (restorer_).
  Status OpenRestore(const std::string& path, uint64_t step);

  // The coordinator, as this task's shard reaches it: hosted here, or over
  // the link (from Start on).
  CoordinatorPort* coordinator() const {
    return lent_.hosted != nullptr ? lent_.hosted : static_cast<CoordinatorPort*>(link_.get());
  }
  // To the coordinator: over the link or, on ps task 0, directly.
  void SendToCoordinator(MessageBytes frame);

  // The waiting pulls are judged again when the earliest departed worker
  // still awaited stops being awaited (worker_rejoin_grace): one timer at a
  // time, however often workers come and go.
  void RecheckAfterRejoinGrace();
  // Updates that waited, then the pulls they unblock.
  void RetryWaiting();

  const ServerOptions& options_;  // the server's
  const Lent lent_;
  transport::Context* const ctx_;
  PeerSessions* const sessions_;
  std::unique_ptr<ShardMemory> memory_;
  std::unique_ptr<ParamTable> table_;
  // Checkpoint rounds, this shard's side (messages from the coordinator).
  std::unique_ptr<CheckpointParticipant> checkpoints_;
  std::optional<OptimizerStateAccess> state_;  // get-state and set-state

  // Progress thread only.
  std::optional<PullServer> pulls_;  // from Open on
  std::optional<PushApplier> pushes_;
  bool rejoin_recheck_scheduled_ = false;
  bool stopping_ = false;
  // Membership and restore (progress thread).
  // A ps task's link to the coordinator, when another task hosts it.
  std::unique_ptr<CoordinatorLink> link_;
  bool joined_ = false;                // creates are served (restore known)
  std::optional<StepReporter> steps_;  // from Open on
  std::deque<std::tuple<EndpointPtr, uint64_t, wire::Create>> deferred_creates_;
  std::unique_ptr<ChunkRestorer> restorer_;  // while a checkpoint is restored

  std::atomic<uint64_t> tensors_{0}, chunks_restored_{0};
};

}  // namespace tessera::server
