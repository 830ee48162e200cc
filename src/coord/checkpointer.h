// Checkpoint rounds, run by the coordinator on its progress thread.
//
// A round takes one consistent cut of the whole cluster:
//  1. prepare: every shard stops applying updates and reports the sync steps
//     its tensors reached;
//  2. the coordinator picks the step S (the highest reached), lays out the
//     files (a tensor whole in the file of its first chunk's shard), creates
//     them in DIR/.step-S.tmp with their headers, and sends every shard the
//     offsets of its chunks;
//  3. each shard copies its tensors as of step S (sync tensors still behind
//     are copied when they reach it; the others at once, still frozen), then
//     resumes and writes the copies in place, in the background;
//  4. when all wrote, the coordinator hashes the files, writes the index and
//     the manifest last, and renames the directory to DIR/step-S.
// Any failure or timeout aborts the round: the shards resume and the
// temporary directory goes; the previous checkpoints stay as they were.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "coord/coordinator.h"
#include "core/serial_worker.h"
#include "wire/messages.h"

namespace tessera::coord {

struct CheckpointOptions {
  std::string dir;
  std::chrono::milliseconds every{0};  // 0: not periodically
  uint64_t every_steps = 0;            // 0: not by global step
  int keep = 5;                        // complete checkpoints kept
  std::chrono::milliseconds timeout{120'000};
  // What each manifest's HMAC is made with, and what a checkpoint that
  // counts toward `keep` must pass (ckpt::CheckpointKeyFor).
  ckpt::CheckpointKey key{};
};

struct SavedCheckpoint {
  uint64_t global_step = 0;
  std::string path;
};

class Checkpointer {
 public:
  enum class Reason { kTimer, kSteps, kRequest, kShutdown };
  // "periodic", "every-N-steps", "requested", "final".
  static const char* ReasonName(Reason r);

  // What the host provides: a frame to shard k (false when k has not joined),
  // and running work on the progress thread (now or later).
  struct Host {
    std::function<bool(int shard, MessageBytes frame)> send_to_shard;
    std::function<void(std::function<void()>)> post;
    std::function<void(std::chrono::milliseconds, std::function<void()>)> post_after;
    std::function<void(const SavedCheckpoint&)> on_saved;  // a new checkpoint is complete
    // A round was abandoned: the checkpoint it was for was not written.
    std::function<void(Reason, const Status&)> on_failed;
  };
  using Done = std::function<void(Result<SavedCheckpoint>)>;

  Checkpointer(CheckpointOptions options, Coordinator* coord, std::string cluster_json, Host host);
  ~Checkpointer();

  // Arms the timer (progress thread).
  void Start();
  // Starts a round, or joins the running one's successor; `done` runs on the
  // progress thread.
  void Save(Reason reason, Done done);
  // The global step moved (for every_steps).
  void OnGlobalStep(uint64_t step);
  // A shard's checkpoint-prepared or checkpoint-written.
  void OnFrame(int shard, const wire::Header& h, std::span<const uint8_t> frame);
  void OnShardLost(int shard);
  // No more rounds; a running one is aborted. Waits for file work to end.
  void Stop();

  // The newest checkpoint written or restored, for a joining shard.
  const std::string& latest_path() const { return latest_path_; }
  void set_latest(uint64_t step, std::string path) {
    last_saved_step_ = step;
    latest_path_ = std::move(path);
  }

 private:
  struct Round {
    // User-provided: clang decides whether a nested class with member
    // initialisers is default-constructible while the enclosing class is
    // still being defined (std::optional<Round> below asks) and answers no.
    Round() {}  // NOLINT(modernize-use-equals-default)
    uint64_t id = 0;
    Reason reason = Reason::kRequest;
    std::vector<Done> waiters;
    std::vector<std::optional<wire::CkptPrepared>> prepared;
    std::vector<bool> written;
    uint64_t step = 0;
    ckpt::Manifest manifest;
    ckpt::CheckpointLayout layout;
    std::string tmp_dir, final_dir;
    std::vector<wire::CkptWrite> writes;  // per shard
    std::chrono::steady_clock::time_point started;
    bool abandoned = false;  // failed; its files are being removed
  };
  // Whether round `id` is the one running (not finished, not abandoned).
  bool Current(uint64_t id) const { return round_ && round_->id == id && !round_->abandoned; }

  void Tick();
  void Begin(Reason reason, std::vector<Done> waiters);
  void OnAllPrepared();
  void SendWrites();
  void OnAllWritten();
  void Finish(const Result<SavedCheckpoint>& result);
  // `failed`: whether the round counts as a checkpoint that could not be
  // written (one with no consistent state to save does not).
  void Abort(const Status& why, bool failed = true);
  // Queues `work` for the file thread (jobs run one at a time, in order),
  // then runs `then` on the progress thread with its status. Never blocks:
  // hashing a large checkpoint must not stall the progress thread.
  void InBackground(std::function<Status()> work, std::function<void(Status)> then);
  void Prune(const std::string& just_written);
  // Progress-thread callbacks that do nothing once this object is gone (it
  // is destroyed on the progress thread).
  void Post(std::function<void()> fn);
  void PostAfter(std::chrono::milliseconds delay, std::function<void()> fn);

  CheckpointOptions options_;
  Coordinator* coord_;
  std::string cluster_json_;
  Host host_;
  std::optional<Round> round_;
  std::vector<Done> next_waiters_;  // requests made while a round ran
  std::optional<Reason> next_reason_;
  uint64_t next_round_ = 1;
  uint64_t last_saved_step_ = UINT64_MAX;  // none yet
  uint64_t last_trigger_step_ = 0;
  std::string latest_path_;
  bool stopped_ = false;
  std::shared_ptr<int> alive_ = std::make_shared<int>(0);
  // The file work, in order. Declared last, so destroyed first: what is
  // queued runs (e.g. removing an aborted round) while the members its jobs
  // read are still there.
  SerialWorker files_;
};

}  // namespace tessera::coord
