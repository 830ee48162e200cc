// The coordinator's state, hosted by ps task 0 or the coordinator job: where every tensor lives
// (decided once, so workers agree whatever order they declare in) and whether
// the chief has initialised the parameters.
#pragma once

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "core/placement.h"
#include "core/pool_allocator.h"
#include "tessera/cluster.h"
#include "wire/limits.h"
#include "wire/messages.h"

namespace tessera::coord {

// What one cluster may declare (wire/limits.h: the ps tasks bound their
// chunks by it too).
using DeclareLimits = wire::DeclareLimits;

class Coordinator {
 public:
  struct Placed {
    wire::TensorDecl decl;
    std::string declared_by;
    std::vector<wire::ChunkPlacement> chunks;
    bool chief_declared = false;  // the chief's Initialize covers it
    bool initialized = false;     // the chief initialised it
    // Learnt from the ps tasks' joins (a restarted coordinator): chunks whose
    // holder is not known yet, and those that hold a value.
    bool adopted = false;
    uint32_t chunks_unplaced = 0;
    uint32_t chunks_initialized = 0;
  };
  // A chunk of an adopted tensor whose ps task has not joined yet.
  static constexpr uint32_t kUnplaced = ~uint32_t{0};

  Coordinator(int num_shards, int num_workers, DeclareLimits limits = {})
      : num_shards_(num_shards),
        num_workers_(num_workers),
        limits_(limits),
        step_reports_by_shard_(static_cast<size_t>(num_shards)) {}

  // The cluster resumes from this checkpoint: its global step, and declares
  // learn which tensors the shards restore (same name, dtype and shape).
  void RestoreFrom(const ckpt::Checkpoint* checkpoint);
  const ckpt::Checkpoint* restored() const { return restored_; }

  // Places new tensors and returns every tensor's chunks; `who` names the
  // declaring task in errors. All-or-nothing.
  Result<wire::DeclareReply> Declare(const wire::Declare& msg, const std::string& who,
                                     bool by_chief);
  // A reader's declare: every tensor must have been declared already, with
  // this dtype and shape (a reader need not know its rule); nothing is
  // placed. NotFound names the first one that was not.
  Result<wire::DeclareReply> Lookup(const wire::Declare& msg, const std::string& who) const;

  // A restarted coordinator learns placement back from the ps tasks: ps task
  // `shard` holds this chunk (with these hyper-parameters), with a value or
  // not. A chunk it already knows must agree with what it knows.
  Status Adopt(int shard, const wire::CreateEntry& chunk, bool initialized);
  // Every chunk of every known tensor has its ps task.
  bool placement_known() const { return unplaced_chunks_ == 0; }
  // A joining ps task's furthest sync chunk has applied `step` steps. A
  // worker pushes step s only after it pulled step s - 1 from every shard,
  // so step - 1 steps are complete everywhere: the global step is at least
  // that. A restarted coordinator may know no more, and a chunk restored
  // elsewhere must resume there, or workers would wait for it forever (the
  // restored chunk may move on to its first push's step).
  void NoteSyncStepReached(uint64_t step);
  // Every ps task joined: if all the tensors they hold have values, the
  // chief had initialised them, and the init barrier opens.
  void AdoptionDone();

  // The global step (TensorFlow's global_step), from the steps the shards
  // counted: sync steps count once replicas_to_aggregate workers (of the
  // first sync tensor declared) have finished them; async steps count one
  // each. Refuses a report naming a worker the cluster does not have.
  Status OnStepsApplied(int shard, const wire::StepsApplied& report);
  // Step reports received from each ps task: at most one per sync step.
  // Safe to read from any thread.
  std::vector<uint64_t> step_reports_by_shard() const;
  uint64_t global_step() const { return global_step_; }

  // The chief set a tensor's hyper-parameters at run time: declares return
  // them from now on, and checkpoints save them.
  Status UpdateHyper(const wire::UpdateHyper& msg);

  // The chief's init-done: what it declared so far is initialised, its
  // sync and bounded tensors at `start_step`.
  void MarkInitialized(uint64_t start_step);
  bool initialized() const { return initialized_; }
  // Whether every tensor declared so far holds its value: a wait-init is
  // answered at once only then, so that a worker that declared tensors the
  // chief has yet to initialise (declared after training began) learns the
  // step the chief starts them at.
  bool EveryTensorInitialized() const;
  // The step a worker that asks once the cluster is initialised starts at:
  // the chief's latest start step, or the global step where training went
  // past it (a restarted worker rejoins the steps the others are at).
  uint64_t StartStepForLateWorker() const { return std::max(start_step_, global_step_); }
  int num_shards() const { return num_shards_; }
  const std::map<std::string, Placed>& tensors() const { return tensors_; }
  size_t num_tensors() const { return tensors_.size(); }

 private:
  // Refuses a new tensor that breaks a limit, naming it.
  Status CheckLimits(const wire::TensorDecl& t, uint64_t chunk_bytes, uint64_t* new_tensors,
                     uint64_t* new_chunks) const;

  // One ps task says `worker` finished sync step `step` there; the worker's
  // step is done once every shard it spans said so.
  void CountSyncPart(int shard, const wire::SyncStepWorker& worker, uint64_t step);

  int num_shards_;
  int num_workers_;
  DeclareLimits limits_;
  uint64_t num_chunks_ = 0;
  uint64_t unplaced_chunks_ = 0;
  std::unique_ptr<Placer> placer_;  // made on the first declare (its policy wins)
  std::map<std::string, Placed> tensors_;
  const ckpt::Checkpoint* restored_ = nullptr;
  bool initialized_ = false;
  uint64_t start_step_ = 0;  // from the chief's latest init-done
  uint64_t global_step_ = 0;
  uint32_t replicas_to_aggregate_ = 0;  // from the first sync tensor
  // Sync steps not yet counted: step -> worker -> the ps tasks that counted
  // the worker's step; and step -> the workers whose step is done. Every
  // step passes through them: their nodes come from the pool, so that
  // counting a step allocates nothing.
  template <typename K, typename V>
  using PooledMap = std::map<K, V, std::less<>, PoolAllocator<std::pair<const K, V>>>;
  template <typename K>
  using PooledSet = std::set<K, std::less<>, PoolAllocator<K>>;
  PooledMap<uint64_t, PooledMap<uint32_t, PooledSet<int>>> sync_parts_;
  PooledMap<uint64_t, PooledSet<uint32_t>> sync_steps_done_;
  std::vector<std::atomic<uint64_t>> step_reports_by_shard_;
};

}  // namespace tessera::coord
