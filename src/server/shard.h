// The shard: holds the tables and serves the workers the server's
// PeerSessions authenticated (the server's Router hands it their requests),
// composed of units that each own their state: its memory (ShardMemory),
// its tables (Tables: the dense tensors' today, DenseTable), checkpoint
// rounds (CheckpointParticipant) and its membership of the coordinator's
// cluster (CoordinatorMembership: hosted in this process, or over a link).
// A request goes to the table serving its opcode. All its state lives on
// the transport's progress thread.
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <vector>

#include "ckpt/checkpoint.h"
#include "server/bye_round.h"
#include "server/checkpoint_participant.h"
#include "server/coordinator_membership.h"
#include "server/coordinator_port.h"
#include "server/peer.h"
#include "server/peer_sessions.h"
#include "server/shard_memory.h"
#include "server/tables.h"
#include "server/worker_roster.h"
#include "tessera/server.h"
#include "transport/transport.h"
#include "wire/handshake.h"

namespace tessera::server {

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

  // Its memory, tables, checkpoint rounds and link (not yet connected),
  // before the server listens.
  Status Open();
  // Serves: the lease timer and, off the coordinator, the link's first join.
  void Begin();
  // What the parameters are held in, for the server's first log line.
  std::string DescribeMemory() const;

  // The opcodes a shard serves: its tables' (creates, pushes, pulls,
  // optimizer state) and the sync step.
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
  // Every table's updates that waited, then the pulls they unblock.
  void RetryWaiting() { tables_.RetryWaiting(); }
  // The waiting pulls are judged again when the earliest departed worker
  // still awaited stops being awaited (worker_rejoin_grace): one timer at a
  // time, however often workers come and go.
  void RecheckAfterRejoinGrace();

  const ServerOptions& options_;  // the server's
  const Lent lent_;
  transport::Context* const ctx_;
  PeerSessions* const sessions_;
  // From Open on; progress thread only.
  std::unique_ptr<ShardMemory> memory_;
  // Its tables stay until the shard goes (Release frees their memory):
  // stats() may read their counters after the server stopped.
  Tables tables_;
  std::optional<CoordinatorMembership> membership_;
  // Checkpoint rounds, this shard's side (messages from the coordinator).
  std::unique_ptr<CheckpointParticipant> checkpoints_;
  bool rejoin_recheck_scheduled_ = false;
  bool stopping_ = false;
};

}  // namespace tessera::server
