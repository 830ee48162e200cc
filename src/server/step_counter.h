// Counts the worker steps this shard sees, for the coordinator's global step.
// A push's part with step_parts > 0 counts its worker's step here once it is
// accepted; the shard then reports to the coordinator: async steps as a
// count, batched; a sync step as the workers that finished it, once per
// step. Workers never tell the coordinator anything.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <vector>

#include "core/pool_allocator.h"
#include "wire/messages.h"

namespace tessera::server {

class StepCounter {
 public:
  void CountAsync() { async_pending_++; }
  // Worker `rank` finished sync step `step` here (one of the `parts` shards
  // its step spans), of a tensor that aggregates `replicas` gradients a step. The step is ready to
  // report once `replicas` workers finished it, or once a later step shows that it will not grow
  // (its other workers counted it on another shard, or were backup workers). Steps already reported
  // are ignored: late or backup workers.
  void CountSync(uint32_t rank, uint64_t step, uint32_t replicas, uint32_t parts);

  bool has_reports() const { return async_pending_ > 0 || !ready_.empty(); }
  // What is ready, one report per sync step; pending async steps ride the
  // first. Empty when there is nothing to say.
  std::vector<wire::StepsApplied> TakeReports();
  // The same into `out` (cleared first), whose capacity is kept.
  void TakeReportsInto(std::vector<wire::StepsApplied>* out);
  // The last few sync step reports taken, to send again on rejoining: a
  // restarted coordinator learns the global step from them.
  std::vector<wire::StepsApplied> Recent() const { return {recent_.begin(), recent_.end()}; }

 private:
  void MakeReady(uint64_t step, wire::SyncStepWorkers workers);

  // Every step passes through these: their nodes and blocks come from the
  // pool (core/pool_allocator.h), so that counting a step allocates nothing.
  template <typename T>
  using PooledDeque = std::deque<T, PoolAllocator<T>>;
  using OpenSteps = std::map<uint64_t, wire::SyncStepWorkers, std::less<>,
                             PoolAllocator<std::pair<const uint64_t, wire::SyncStepWorkers>>>;

  uint64_t async_pending_ = 0;
  // Sync steps not yet reported -> the workers that finished them here.
  // Holds at most a step or two: a later step flushes the earlier ones.
  OpenSteps open_;
  uint64_t reported_below_ = 0;  // sync steps below this were reported
  static constexpr size_t kMaxWaitingReports = 256;
  PooledDeque<wire::StepsApplied> ready_;
  // Sync steps across shards stay within a step of each other (a worker
  // pulls step s everywhere before pushing s + 1): a few suffice.
  static constexpr size_t kRecentReports = 4;
  PooledDeque<wire::StepsApplied> recent_;
};

}  // namespace tessera::server
