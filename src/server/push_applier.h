// A shard's pushes: validated against the table and the sender's slot, then
// applied by each chunk's consistency mode (apply.h), or held while a reader
// holds a chunk, a sync push is ahead of its chunk's step, or a checkpoint
// round cuts the state; sync steps applied once their readers are done; the
// steps pushes count go to the coordinator (StepReporter). Writers have
// priority: a chunk with an update waiting takes no new readers
// (Param::writer_waiting). Progress thread only.
#pragma once

#include <atomic>
#include <vector>

#include "core/failpoint.h"
#include "core/spares.h"
#include "server/apply.h"
#include "server/checkpoint_participant.h"
#include "server/dense_cut.h"
#include "server/param_table.h"
#include "server/peer.h"
#include "server/peer_sessions.h"
#include "server/pull_server.h"
#include "server/step_reporter.h"
#include "tessera/server.h"
#include "wire/messages.h"

namespace tessera::server {

class PushApplier {
 public:
  // What the shard lends it; each outlives it.
  struct Lent {
    const ServerOptions* options = nullptr;
    PeerSessions* sessions = nullptr;
    ParamTable* table = nullptr;
    apply::Target target;                                // where values change
    const CheckpointParticipant* checkpoints = nullptr;  // whether a round holds updates
    DenseCut* cut = nullptr;                             // a round's cut, told of steps
    StepReporter* steps = nullptr;
    PullServer* pulls = nullptr;  // a push_pull's weights
  };
  explicit PushApplier(Lent lent) : lent_(lent) {}
  PushApplier(const PushApplier&) = delete;
  PushApplier& operator=(const PushApplier&) = delete;

  // A push: refused, applied now (true: what waited may move), or held.
  bool Serve(Peer& peer, uint64_t request_id, uint32_t flags, wire::Push msg);
  // Applies what waited, sync steps first, until nothing moves; then marks
  // the chunks whose writers still wait.
  void ApplyWaiting();
  // A worker's pull of step S from a sync chunk restored at an earlier step
  // it has not pushed since the restore: its push of that step reached the
  // shard before the restart and was lost with it, and it will not push
  // that step again (it retries only what failed). The chunk moves on to S
  // instead of waiting for it for ever. Whether any chunk moved.
  bool ResumeForPull(const Peer& peer, const wire::Pull& pull);
  // A peer's end: its held pushes go.
  void PeerGone(const Peer& peer);
  // Push messages handed back after use, for the next decode.
  Spares<wire::Push>& spares() { return spares_; }
  void Stop() { held_.clear(); }
  void AddStats(ServerStats* stats) const;

 private:
  struct Held {
    Peer* peer;
    uint64_t request_id;
    uint32_t flags;
    wire::Push msg;
  };

  Status Validate(const Peer& peer, uint32_t flags, const wire::Push& msg) const;
  // Applies `push` if it may now and answers it; false: it waits.
  bool TryApply(Held& push);
  // The push's answer: its versions, the weights after it (push_pull), or
  // the refusals.
  void Answer(const Held& push, const wire::PushReply& reply);
  // The error that tells a push_pull which of its entries were refused, and
  // that the others were applied.
  Status RefusalsStatus(const Held& push, const wire::PushReply& reply) const;
  // The push's part that counts its worker's step (step_parts > 0) was
  // accepted: the step is counted and reported. `holds_sync`: some entry is
  // a sync chunk, so the push counts a sync step.
  void CountStep(const Held& push, bool holds_sync);
  bool TryApplyStep(Param& p);
  void MarkWaitingWriters();
  void LogUpdate(const Param& p, const std::string& by) const;

  const Lent lent_;
  // Vectors, not deques: a deque frees and allocates a block as its
  // elements pass through it; these keep their storage.
  std::vector<Held> held_;
  std::vector<uint32_t> pending_steps_;  // sync chunks whose step is complete, waiting for readers
  // Kept across calls so that a reply reuses its vectors (core/borrowed.h).
  wire::PushReply reply_;
  std::vector<Param*> params_;  // TryApply's chunks, by entry
  // A push hands its message back here once it is applied, at once or after
  // waiting, and the next one is decoded into one of these.
  Spares<wire::Push> spares_;
  // Who contributed to the step being applied, for its error (TryApplyStep);
  // kept so that its bits need no allocation per step.
  std::vector<bool> step_pushers_;
  // TESSERA_FAIL_AT=apply-step[:N]: the tests' way to make a sync step's
  // update fail; apply-push-entry refuses one entry of a push.
  FailPoint step_failpoint_{"apply-step"};
  FailPoint entry_failpoint_{"apply-push-entry"};
  std::atomic<uint64_t> applied_{0}, steps_applied_{0}, stale_dropped_{0}, duplicate_dropped_{0};
};

}  // namespace tessera::server
