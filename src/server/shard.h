// The shard: holds the parameter table, applies pushed updates and grants
// pull leases to the workers its PeerSessions authenticated. It reaches the
// coordinator through a CoordinatorPort (hosted in this process, or over its
// CoordinatorLink). All its state lives on the transport's progress thread.
#pragma once

#include <deque>
#include <future>
#include <map>
#include <memory>
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
#include "server/checkpoint_participant.h"
#include "server/coordinator_host.h"
#include "server/coordinator_link.h"
#include "server/end_signals.h"
#include "server/lease_table.h"
#include "server/param_table.h"
#include "server/peer.h"
#include "server/peer_sessions.h"
#include "server/role.h"
#include "server/step_counter.h"
#include "server/worker_presence.h"
#include "server/worker_roster.h"
#include "tessera/server.h"
#include "transport/transport.h"
#include "wire/handshake.h"

namespace tessera::server {

using wire::kProtocolMsg;

class Shard {
 public:
  // `hosted`: the coordinator this process hosts, if its role says it does
  // (the server owns it; it outlives the shard).
  Shard(ServerOptions options, CoordinatorHost* hosted)
      : options_(std::move(options)), role_(RoleOf(options_)), hosted_(hosted) {}
  ~Shard();
  Status Start();
  void Stop();
  uint16_t port() const { return listener_ ? listener_->port() : 0; }
  ServerStats stats() const;
  bool is_coordinator_only() const { return role_ == Role::kCoordinator; }
  // ServerOptions::stop_when_workers_leave (any thread): the verdict, if it
  // came within `limit`.
  std::optional<Status> WaitUntilWorkersLeaveFor(std::chrono::milliseconds limit);
  // Off the coordinator (any thread): until the coordinator said it stops,
  // or the link to it is gone, at most `limit`; whether it did.
  bool WaitForCoordinatorToStop(std::chrono::milliseconds limit);

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

  void OnMessage(const EndpointPtr& ep, std::span<const uint8_t> frame);
  // stop_when_workers_leave: publishes the workers' verdict once there is
  // one (and, off the coordinator, once the coordinator stopped), else
  // schedules the next look when the grace time may bring one.
  void CheckPresence();
  void OnDisconnect(const EndpointPtr& ep, const Status& why);
  // Stopping on purpose: a ps task tells its coordinator, and a coordinator
  // its ps tasks, and waits briefly for their acks, so that none of them
  // logs a lost peer (or tries to rejoin loudly).
  void SayBye();
  // `from` acked the bye, or its connection ended (it cannot ack any more).
  void OnByeAnswered(const transport::Endpoint* from);
  // The request id of such a bye: its ack is told from any other by it.
  static constexpr uint64_t kByeRequestId = ~uint64_t{0};
  template <typename Msg>
  void Reply(Peer& peer, uint64_t request_id, const Msg& msg) {
    peer.ep->Send(kProtocolMsg, wire::Encode(msg, request_id));
  }

  // An authenticated worker (PeerSessions): its staging slot (and CUDA IPC
  // slot) into the welcome, and its arrival counted.
  Status OnWorkerJoins(Peer& peer, wire::Welcome* welcome);
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
  // What a pull still waits for, naming the tensor, the step and the workers
  // that have and have not pushed it.
  std::string WhatPullWaitsFor(const PendingPull& pull) const;
  std::string WorkerName(uint32_t rank) const;
  void OnRelease(Peer& peer, const wire::Release& msg);
  void OnSetHyper(Peer& peer, uint64_t request_id, const wire::SetHyper& msg);
  // What an authenticated peer sends, by its role: a ps task's link (to the
  // coordinator this task hosts), an observer, or a worker.
  void OnShardPeerMessage(Peer& peer, const wire::Header& h, std::span<const uint8_t> frame);
  void OnObserverMessage(Peer& peer, const wire::Header& h);
  // What a reader may not ask for, refused by name; OK for what it may.
  static Status ReaderMay(const Peer& peer, wire::Opcode op);
  void OnWorkerMessage(Peer& peer, const wire::Header& h, std::span<const uint8_t> frame);
  // What `tessera status` shows of this task, as JSON.
  std::string StatusJson() const;

  // Membership: a ps task that is not the coordinator joins it (retrying
  // until it answers) and learns what to restore; creates wait for that.
  bool hosts_coordinator() const { return hosted_ != nullptr; }
  // The coordinator hosted here, when it is (ps task 0 or the coordinator
  // job): what it lends it of this server.
  Status OpenHostedCoordinator();
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
  // value and optimizer state from it.
  Status OpenRestore(const std::string& path, uint64_t step);
  void RestoreChunk(Param& p);

  // The coordinator, as this task's shard reaches it: hosted here, or over
  // the link (from Start on).
  CoordinatorPort* coordinator() {
    return hosted_ != nullptr ? static_cast<CoordinatorPort*>(hosted_) : link_.get();
  }
  // To the coordinator: over the link or, on ps task 0, directly.
  void SendToCoordinator(MessageBytes frame);

  // Opens the shard's memory (--memory) and decides whether the fabric
  // reaches it or values are staged through host memory.
  Status OpenMemory();
  // The peers' sessions: admission, handshake, refusals.
  Status OpenSessions();
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
  // accepted: the step is counted here and reported to the coordinator
  // (ReportSteps), batched. `holds_sync`: some entry is a sync chunk, so the
  // push counts a sync step.
  void CountStep(const PendingPush& push, bool holds_sync);
  void ScheduleStepReport();
  void ReportSteps();
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
  // An error if a pull waits for a sync step that can no longer complete
  // because the workers it needs disconnected.
  Status StepReachable(const PendingPull& pull) const;
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

  ServerOptions options_;
  const Role role_;
  CoordinatorHost* const hosted_;         // the coordinator hosted here, or null
  ckpt::CheckpointKey checkpoint_key_{};  // CheckpointKeyFor(options_.secret)
  std::unique_ptr<transport::Context> ctx_;
  std::unique_ptr<ParamMemory> memory_;
  transport::MemoryKind arena_kind_ = transport::MemoryKind::kHost;  // what workers reach
  std::unique_ptr<ParamTable> table_;
  std::unique_ptr<transport::Listener> listener_;
  // Checkpoint rounds, this shard's side (messages from the coordinator).
  std::unique_ptr<CheckpointParticipant> checkpoints_;

  // Progress thread only.
  std::unique_ptr<PeerSessions> sessions_;
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
  std::vector<wire::StepsApplied> step_reports_;
  bool stopping_ = false;
  // Worker ranks connected, and those awaited back (StepReachable).
  WorkerRoster roster_{options_.worker_rejoin_grace};
  std::optional<WorkerPresence> presence_;  // stop_when_workers_leave only
  bool presence_check_scheduled_ = false;
  // The verdict, for WaitUntilWorkersLeave, and the coordinator's stop (any thread).
  EndSignals end_;

  // Membership and restore (progress thread).
  // A ps task's link to the coordinator, when another task hosts it.
  std::unique_ptr<CoordinatorLink> link_;
  bool joined_ = false;  // creates are served (restore known)
  StepCounter step_counter_;
  bool step_report_posted_ = false;
  // The connections whose ack of SayBye's bye is still awaited, and who
  // waits for them.
  std::vector<const transport::Endpoint*> bye_acks_awaited_;
  std::shared_ptr<std::promise<void>> bye_answered_;
  std::deque<std::tuple<EndpointPtr, uint64_t, wire::Create>> deferred_creates_;
  std::unique_ptr<ckpt::Checkpoint> restore_;
  uint64_t restore_step_ = 0;  // the step restored sync chunks resume at

  // TESSERA_FAIL_AT=apply-step[:N]: the tests' way to make a sync step's
  // update fail.
  FailPoint apply_step_failpoint_{"apply-step"};
  FailPoint apply_push_failpoint_{"apply-push-entry"};  // refuses one entry of a push

  std::atomic<uint64_t> pushes_applied_{0}, pulls_served_{0}, tensors_{0}, leases_revoked_{0},
      steps_applied_{0}, stale_dropped_{0}, duplicate_dropped_{0}, chunks_restored_{0},
      host_staged_bytes_{0}, cuda_ipc_workers_{0}, step_messages_from_workers_{0};
};

}  // namespace tessera::server
