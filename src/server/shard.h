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
#include "core/failpoint.h"
#include "core/spares.h"
#include "server/apply.h"
#include "server/bye_round.h"
#include "server/checkpoint_participant.h"
#include "server/chunk_restorer.h"
#include "server/coordinator_link.h"
#include "server/coordinator_port.h"
#include "server/lease_table.h"
#include "server/param_table.h"
#include "server/peer.h"
#include "server/peer_sessions.h"
#include "server/pull_waits.h"
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
  struct PendingPush {
    Peer* peer;
    uint64_t request_id;
    uint32_t flags;
    wire::Push msg;
  };
  struct PendingPull {
    Peer* peer;
    uint64_t request_id;
    wire::Pull msg;
    // When its wait_ms runs out (none: no limit of its own).
    std::optional<std::chrono::steady_clock::time_point> deadline;
  };

  template <typename Msg>
  void Reply(Peer& peer, uint64_t request_id, const Msg& msg) {
    peer.ep->Send(kProtocolMsg, wire::Encode(msg, request_id));
  }

  void OnCreate(Peer& peer, uint64_t request_id, const wire::Create& msg);
  // A reader's create: the keys of chunks that exist as it describes them;
  // nothing is created.
  Result<Param*> FindForReader(const wire::CreateEntry& entry);
  void OnPush(Peer& peer, uint64_t request_id, uint32_t flags, wire::Push msg);
  void OnPull(Peer& peer, uint64_t request_id, wire::Pull msg);
  // Answers the waiting pulls whose wait_ms ran out, saying what each waits
  // for, and schedules the next sweep while any has a deadline. One timer at
  // a time, whatever the peers ask: a timer per pull would outlive it, for
  // as long as the peer's wait_ms says.
  void SweepWaitingPulls();
  void ScheduleWaitSweep();
  void OnRelease(Peer& peer, const wire::Release& msg);
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

  // Opens the shard's memory (--memory) and decides whether the fabric
  // reaches it or values are staged through host memory.
  Status OpenMemory();
  // What the chunks held may take: memory_limit_bytes, or what the memory
  // had free at start.
  Status SetMemoryBudget();
  // Same node, GPU memory: a GPU slot for `peer` and its IPC handle.
  Status OfferIpcSlot(Peer& peer, wire::Welcome* welcome);
  // Staging: refreshes the host copy workers read after the value changed.
  Status Publish(Param& p);
  // The chunk's value into host memory (an inline pull, a log line).
  Status ReadValue(const Param& p, void* host_dst) const;

  Status ValidatePush(const Peer& peer, uint32_t flags, const wire::Push& msg);
  bool TryApplyPush(PendingPush& push);
  // The error that tells a push_pull which of its entries were refused, and
  // that the others were applied.
  Status RefusalsStatus(const PendingPush& push, const wire::PushReply& reply) const;
  // Answers a push flagged kFlagThenPull with the weights after it.
  void ReplyWithWeights(const PendingPush& push, const std::vector<uint64_t>& versions);
  // The push's part that counts its worker's step (step_parts > 0) was
  // accepted: the step is counted and reported (steps_). `holds_sync`: some
  // entry is a sync chunk, so the push counts a sync step.
  void CountStep(const PendingPush& push, bool holds_sync);
  // Where apply:: changes values: this shard's memory, staged or not.
  apply::Target ApplyTarget() {
    return {memory_.get(), table_->staged(), &host_staged_bytes_, memory_->is_host()};
  }
  bool TryApplyStep(Param& p);
  void MarkWaitingWriters();
  bool TryGrantPull(PendingPull& pull);
  // shard_state.cc: a chunk's optimizer state, read and written by workers.
  void OnGetState(Peer& peer, uint64_t request_id, const wire::GetState& msg);
  void OnSetState(Peer& peer, uint64_t request_id, const wire::SetState& msg);
  // The slot a get-state or set-state names, once the peer may, the chunk
  // has it and the range lies inside it; else why not.
  Result<StateBuffer*> StateRange(const Peer& peer, uint32_t key_id, wire::StateSlotId slot,
                                  uint64_t offset, uint64_t length);
  // A worker's pull of step S from a sync chunk restored at an earlier step
  // it has not pushed since the restore: its push of that step reached the
  // shard before the restart and was lost with it, and it will not push
  // that step again (it retries only what failed). The chunk moves on to S
  // instead of waiting for it for ever. Whether any chunk moved.
  bool ResumeForPull(const PendingPull& pull);
  // The waiting pulls are judged again when the earliest departed worker
  // still awaited stops being awaited (worker_rejoin_grace): one timer at a
  // time, however often workers come and go.
  void RecheckAfterRejoinGrace();
  void RetryWaiting();
  // A lease ended: its chunks have one reader fewer.
  void EndLease(const LeaseTable::Lease& lease);
  void RevokeExpiredLeases();
  std::chrono::milliseconds LeaseCheckInterval() const;
  void LogUpdate(const Param& p, const std::string& by) const;

  const ServerOptions& options_;  // the server's
  const Lent lent_;
  transport::Context* const ctx_;
  PeerSessions* const sessions_;
  std::unique_ptr<ParamMemory> memory_;
  transport::MemoryKind arena_kind_ = transport::MemoryKind::kHost;  // what workers reach
  std::unique_ptr<ParamTable> table_;
  std::optional<PullWaits> waits_;  // over table_, from Open on
  // Checkpoint rounds, this shard's side (messages from the coordinator).
  std::unique_ptr<CheckpointParticipant> checkpoints_;

  // Progress thread only.
  uint64_t memory_budget_ = UINT64_MAX;  // SetMemoryBudget
  LeaseTable leases_;
  // Vectors, not deques: a deque frees and allocates a block as its
  // elements pass through it; these keep their storage.
  std::vector<PendingPush> blocked_pushes_;
  std::vector<PendingPull> waiting_pulls_;
  bool wait_sweep_scheduled_ = false;
  bool rejoin_recheck_scheduled_ = false;
  std::vector<uint32_t> pending_steps_;  // sync chunks whose step is complete, waiting for readers
  // Kept across calls so that a push's or pull's reply and the step reports
  // reuse their vectors (core/borrowed.h): no allocation per call for them.
  wire::PushReply push_reply_;
  std::vector<Param*> push_params_;  // TryApplyPush's chunks, by entry
  wire::PullReply pull_reply_;
  // A push or pull hands its message back here once it is served, at once
  // or after waiting, and the next one is decoded into one of these
  // (server.cc): their vectors keep their capacity. A few of each (the
  // wire's limits bound each one).
  Spares<wire::Push> spare_pushes_;
  Spares<wire::Pull> spare_pulls_;
  // Who contributed to the step being applied, for its error (TryApplyStep);
  // kept so that its bits need no allocation per step.
  std::vector<bool> step_pushers_;
  bool stopping_ = false;
  // Membership and restore (progress thread).
  // A ps task's link to the coordinator, when another task hosts it.
  std::unique_ptr<CoordinatorLink> link_;
  bool joined_ = false;                // creates are served (restore known)
  std::optional<StepReporter> steps_;  // from Open on
  std::deque<std::tuple<EndpointPtr, uint64_t, wire::Create>> deferred_creates_;
  std::unique_ptr<ChunkRestorer> restorer_;  // while a checkpoint is restored

  // TESSERA_FAIL_AT=apply-step[:N]: the tests' way to make a sync step's
  // update fail.
  FailPoint apply_step_failpoint_{"apply-step"};
  FailPoint apply_push_failpoint_{"apply-push-entry"};  // refuses one entry of a push

  std::atomic<uint64_t> pushes_applied_{0}, pulls_served_{0}, tensors_{0}, leases_revoked_{0},
      steps_applied_{0}, stale_dropped_{0}, duplicate_dropped_{0}, chunks_restored_{0},
      host_staged_bytes_{0}, cuda_ipc_workers_{0};
};

}  // namespace tessera::server
