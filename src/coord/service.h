// The coordinator as a service: declares and placement, the init barrier,
// the global step, hyper-parameters, checkpoint rounds and the ps tasks'
// joins. A server hosts it beside ps task 0 or alone (the coordinator job)
// and hands it the frames of the peers that address it; the service answers
// through the small Host interface and knows nothing of connections.
//
// Restartable alone: a coordinator that starts afresh answers no worker
// request until every ps task joined it. Each join lists the chunks the task
// holds, so placement, hyper-parameters and the init barrier are rebuilt
// from them; the global step comes from the newest checkpoint, then from the
// step reports each ps task sends before its join ends: the last few it sent
// before (StepCounter keeps them) and those counted while it was away.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "coord/checkpointer.h"
#include "coord/coordinator.h"
#include "coord/held_requests.h"
#include "coord/join_gate.h"
#include "coord/peer_ref.h"
#include "coord/round_tally.h"
#include "coord/table_registry.h"
#include "wire/messages.h"

namespace tessera::coord {

struct ServiceOptions {
  // Prefixed to the errors it sends ("coordinator task 0", "ps task 0").
  std::string name = "coordinator";
  int num_shards = 1;
  int num_workers = 1;
  // The ps task hosting the service (its frames go through the Host), or -1.
  int local_shard = -1;
  std::string cluster_json;  // written into every checkpoint's manifest
  // Checkpoints: none when checkpoints.dir is empty. restore: resume from the
  // newest complete one there.
  CheckpointOptions checkpoints;
  bool restore = true;
  bool accept_legacy_checkpoints = false;  // ServerOptions'
  bool new_run = false;                    // ServerOptions'
  DeclareLimits limits;
  // Worker requests held while ps tasks have not joined yet.
  size_t max_waiting_requests = 4096;
  size_t max_waiting_bytes = size_t{64} << 20;  // their frames, all together
};

class Service {
 public:
  struct Host {
    std::function<void(PeerId, MessageBytes)> send;
    // Frames to the hosted ps task (checkpoint rounds), when local_shard >= 0.
    std::function<void(MessageBytes)> send_to_local_shard;
    std::function<void(std::function<void()>)> post;
    std::function<void(std::chrono::milliseconds, std::function<void()>)> post_after;
  };

  Service(ServiceOptions options, Host host);
  ~Service();

  // Finds the checkpoint to resume from (any thread, before Start).
  Status Open();
  // Progress thread from here on.
  void Start();
  // The final checkpoint of a clean stop; `done` runs on the progress thread.
  void SaveFinal(std::function<void()> done);
  // No more rounds; waits for file work to end.
  void Stop();

  // Whether a worker's message with this opcode is the service's to answer.
  static bool Serves(wire::Opcode op);
  void OnWorkerRequest(const WorkerRef& from, const wire::Header& h,
                       std::span<const uint8_t> frame);

  // A ps task's frame over its link: join, step reports, checkpoint replies.
  // A non-OK status: the host closes the link with it.
  Status OnShardFrame(PeerId from, int shard, const wire::Header& h,
                      std::span<const uint8_t> frame);
  // The hosted ps task, directly: its join, its frames (step reports,
  // checkpoint replies), and the chunks workers create on it (a restarted
  // host learns its own placement back from them). Every join is answered
  // once every ps task joined, so that the global step it tells (where
  // restored sync tensors resume) is the rebuilt one.
  void JoinLocal(const wire::Join& join, std::function<void(const wire::JoinReply&)> answer);
  void OnLocalShardFrame(std::span<const uint8_t> frame);
  void OnLocalSteps(const wire::StepsApplied& report);
  // `created`: the chunks (and whether each holds a value), as in a join.
  void OnLocalChunksCreated(const wire::Join& created);

  void OnPeerGone(PeerId peer);

  // Any thread.
  uint64_t global_step() const { return global_step_.load(std::memory_order_relaxed); }
  std::vector<uint64_t> step_reports_by_shard() const { return coord_.step_reports_by_shard(); }
  const RoundTally& checkpoint_rounds() const { return rounds_; }
  // The restored checkpoint's path (empty: none), for the hosted ps task.
  const std::string& restore_path() const { return restore_path_; }

 private:
  // Joins are answered once every ps task joined once (joins_); worker
  // requests once, besides, every known tensor's chunks are placed (ready_).
  // Both latch.
  void CheckReady();
  void Serve(const WorkerRef& from, const wire::Header& h, std::span<const uint8_t> frame);
  void OnSaveCheckpoint(const WorkerRef& from, uint64_t request_id);
  void OnInitDone(const WorkerRef& from, uint64_t request_id, const wire::InitDone& done);
  Status Join(int shard, const wire::Join& join);
  wire::JoinReply JoinAnswer() const;
  Status OnStepsApplied(int shard, const wire::StepsApplied& report);

  ServiceOptions options_;
  Host host_;
  Coordinator coord_;
  TableRegistry tables_;  // embedding tables
  std::unique_ptr<ckpt::Checkpoint> restored_;
  std::string restore_path_;
  std::unique_ptr<Checkpointer> checkpointer_;
  // Per ps task: its link (0 when it is the local one or not joined).
  std::vector<PeerId> links_;
  JoinGate joins_;
  std::vector<std::pair<PeerId, uint64_t>> init_waiters_;
  HeldRequests held_;  // until ready_
  bool ready_ = false;
  bool stopped_ = false;
  std::atomic<uint64_t> global_step_{0};
  RoundTally rounds_;
};

}  // namespace tessera::coord
