#include "coord/coordinator.h"

#include <algorithm>

namespace tessera::coord {
namespace {

std::string Describe(const wire::TensorDecl& t) {
  return DescribeTensor(t.dtype, t.shape) + " with rule " + UpdateRuleName(t.rule);
}

}  // namespace

Status Coordinator::CheckLimits(const wire::TensorDecl& t, uint64_t chunk_bytes,
                                uint64_t* new_tensors, uint64_t* new_chunks) const {
  TESSERA_RETURN_IF_ERROR(ckpt::CheckNotSlotName(t.name));
  auto elements = NumElements(t.shape);
  if (!elements.ok()) return elements.status().WithContext("tensor '" + t.name + "'");
  const uint64_t size = DTypeSize(t.dtype);
  if (*elements > limits_.max_tensor_bytes / size) {
    return Status::ResourceExhausted("tensor '" + t.name + "' (" +
                                     DescribeTensor(t.dtype, t.shape) + ") exceeds the limit of " +
                                     std::to_string(limits_.max_tensor_bytes) + " bytes a tensor");
  }
  const uint64_t per_chunk = std::max<uint64_t>(1, chunk_bytes / size);
  const uint64_t chunks = std::max<uint64_t>(1, (*elements + per_chunk - 1) / per_chunk);
  if (chunks > limits_.max_chunks_per_tensor) {
    return Status::ResourceExhausted(
        "tensor '" + t.name + "' (" + DescribeTensor(t.dtype, t.shape) + ") in chunks of " +
        std::to_string(chunk_bytes) + " bytes makes " + std::to_string(chunks) +
        " chunks, over the limit of " + std::to_string(limits_.max_chunks_per_tensor) +
        " a tensor: raise chunk_bytes");
  }
  *new_tensors += 1;
  *new_chunks += chunks;
  if (tensors_.size() + *new_tensors > limits_.max_tensors) {
    return Status::ResourceExhausted("declaring '" + t.name + "' would exceed the limit of " +
                                     std::to_string(limits_.max_tensors) + " tensors in a cluster");
  }
  if (num_chunks_ + *new_chunks > limits_.max_chunks) {
    return Status::ResourceExhausted("declaring '" + t.name + "' would exceed the limit of " +
                                     std::to_string(limits_.max_chunks) +
                                     " chunks in a cluster: raise chunk_bytes");
  }
  return Status::Ok();
}

Result<wire::DeclareReply> Coordinator::Declare(const wire::Declare& msg, const std::string& who,
                                                bool by_chief) {
  // Validate the whole batch before placing anything.
  uint64_t new_tensors = 0, new_chunks = 0;
  std::set<std::string_view> in_batch;
  for (const auto& t : msg.tensors) {
    // More replicas than workers: a sync step that can never gather them.
    if (t.mode.kind != Consistency::kAsync && num_workers_ > 0 &&
        t.mode.total_num_replicas > static_cast<uint32_t>(num_workers_)) {
      return Status::InvalidArgument("tensor '" + t.name + "': total_num_replicas " +
                                     std::to_string(t.mode.total_num_replicas) +
                                     " exceeds the cluster's " + std::to_string(num_workers_) +
                                     " workers");
    }
    if (t.pinned_shard >= num_shards_) {
      return Status::InvalidArgument("tensor '" + t.name + "' pinned to shard " +
                                     std::to_string(t.pinned_shard) + " but the cluster has " +
                                     std::to_string(num_shards_) + " ps tasks");
    }
    auto it = tensors_.find(t.name);
    if (it == tensors_.end()) {
      if (in_batch.insert(t.name).second) {
        TESSERA_RETURN_IF_ERROR(CheckLimits(t, msg.chunk_bytes, &new_tensors, &new_chunks));
      }
      continue;
    }
    const auto& have = it->second.decl;
    if (have.dtype != t.dtype || have.shape != t.shape || have.rule != t.rule) {
      return Status::AlreadyExists("tensor '" + t.name + "' was declared as " + Describe(have) +
                                   " by " + it->second.declared_by + ", but " + who +
                                   " declares it as " + Describe(t));
    }
  }
  for (const auto& t : msg.tensors) {
    if (t.mode.kind == Consistency::kSync && replicas_to_aggregate_ == 0) {
      replicas_to_aggregate_ = t.mode.replicas_to_aggregate;
    }
  }
  if (!placer_) {
    placer_ = std::make_unique<Placer>(static_cast<PlacementPolicy>(msg.placement), num_shards_);
    // Tensors adopted from the ps tasks' joins weigh on the shards they hold.
    for (const auto& [name, placed] : tensors_) {
      for (const auto& c : placed.chunks) {
        placer_->Place(c.elem_count * DTypeSize(placed.decl.dtype), static_cast<int>(c.shard));
      }
    }
  }

  wire::DeclareReply reply;
  for (const auto& t : msg.tensors) {
    auto it = tensors_.find(t.name);
    const ckpt::TensorRecord* saved = restored_ ? restored_->Find(t.name) : nullptr;
    const bool restores = saved && saved->dtype == t.dtype && saved->shape == t.shape;
    if (it == tensors_.end()) {
      Placed placed{t, who, {}};
      // A restored tensor goes on with the hyper-parameters it was saved
      // with (a learning-rate schedule's place), whatever the code declares.
      if (restores) placed.decl.hyper = saved->hyper;
      const uint64_t total = NumElements(t.shape).value();
      const uint64_t per_chunk = std::max<uint64_t>(1, msg.chunk_bytes / DTypeSize(t.dtype));
      uint64_t offset = 0;
      do {
        uint64_t count = std::min(per_chunk, total - offset);
        int shard = placer_->Place(count * DTypeSize(t.dtype), t.pinned_shard);
        placed.chunks.push_back({static_cast<uint32_t>(shard), offset, count});
        offset += count;
      } while (offset < total);
      num_chunks_ += placed.chunks.size();
      it = tensors_.emplace(t.name, std::move(placed)).first;
    }
    if (by_chief) it->second.chief_declared = true;
    reply.tensors.push_back(it->second.chunks);
    reply.initialized.push_back(it->second.initialized ? 1 : 0);
    reply.restored.push_back(restores ? 1 : 0);
    reply.hyper.push_back(it->second.decl.hyper);
  }
  reply.restored_step = restored_ ? restored_->manifest.global_step : 0;
  return reply;
}

Result<wire::DeclareReply> Coordinator::Lookup(const wire::Declare& msg,
                                               const std::string& who) const {
  wire::DeclareReply reply;
  for (const auto& t : msg.tensors) {
    auto it = tensors_.find(t.name);
    if (it == tensors_.end()) {
      return Status::NotFound("tensor '" + t.name + "', which reader " + who +
                              " looks up, was not declared by any worker");
    }
    const auto& have = it->second.decl;
    if (have.dtype != t.dtype || have.shape != t.shape) {
      return Status::FailedPrecondition("tensor '" + t.name + "' was declared as " +
                                        DescribeTensor(have.dtype, have.shape) + " by " +
                                        it->second.declared_by + ", but reader " + who +
                                        " reads it as " + DescribeTensor(t.dtype, t.shape));
    }
    const ckpt::TensorRecord* saved = restored_ ? restored_->Find(t.name) : nullptr;
    reply.tensors.push_back(it->second.chunks);
    reply.initialized.push_back(it->second.initialized ? 1 : 0);
    reply.restored.push_back(saved && saved->dtype == t.dtype && saved->shape == t.shape ? 1 : 0);
    reply.hyper.push_back(have.hyper);
  }
  reply.restored_step = restored_ ? restored_->manifest.global_step : 0;
  return reply;
}

Status Coordinator::UpdateHyper(const wire::UpdateHyper& msg) {
  auto it = tensors_.find(msg.name);
  if (it == tensors_.end()) {
    return Status::NotFound("hyper-parameters for tensor '" + msg.name +
                            "', which no worker declared");
  }
  TESSERA_RETURN_IF_ERROR(msg.hyper.Validate().WithContext("tensor '" + msg.name + "'"));
  it->second.decl.hyper = msg.hyper;
  return Status::Ok();
}

Status Coordinator::Adopt(int shard, const wire::CreateEntry& chunk, bool initialized) {
  const auto& t = chunk.tensor;
  const std::string from = "ps task " + std::to_string(shard);
  auto it = tensors_.find(t.name);
  if (it == tensors_.end()) {
    TESSERA_RETURN_IF_ERROR(ckpt::CheckNotSlotName(t.name));
    if (chunk.num_chunks > limits_.max_chunks_per_tensor ||
        tensors_.size() >= limits_.max_tensors ||
        num_chunks_ + chunk.num_chunks > limits_.max_chunks) {
      return Status::ResourceExhausted(from + " holds '" + t.name + "' in " +
                                       std::to_string(chunk.num_chunks) +
                                       " chunks, beyond the cluster's limits");
    }
    Placed placed{t, from + " (rejoining)", {}};
    placed.adopted = true;
    placed.chunks.assign(chunk.num_chunks, {kUnplaced, 0, 0});
    placed.chunks_unplaced = chunk.num_chunks;
    num_chunks_ += chunk.num_chunks;
    unplaced_chunks_ += chunk.num_chunks;
    if (t.mode.kind == Consistency::kSync && replicas_to_aggregate_ == 0) {
      replicas_to_aggregate_ = t.mode.replicas_to_aggregate;
    }
    it = tensors_.emplace(t.name, std::move(placed)).first;
  }
  Placed& placed = it->second;
  const auto& have = placed.decl;
  if (have.dtype != t.dtype || have.shape != t.shape || have.rule != t.rule ||
      placed.chunks.size() != chunk.num_chunks) {
    return Status::FailedPrecondition(from + " holds '" + t.name + "' as " + Describe(t) + " in " +
                                      std::to_string(chunk.num_chunks) +
                                      " chunks, but the coordinator knows it as " + Describe(have) +
                                      " in " + std::to_string(placed.chunks.size()));
  }
  auto& c = placed.chunks[chunk.chunk_index];
  if (c.shard == kUnplaced) {
    c = {static_cast<uint32_t>(shard), chunk.elem_offset, chunk.elem_count};
    placed.chunks_unplaced--;
    unplaced_chunks_--;
    if (initialized) placed.chunks_initialized++;
    if (placed.chunks_unplaced == 0) {
      placed.initialized = placed.chunks_initialized == placed.chunks.size();
      placed.chief_declared = placed.initialized;
    }
    if (placer_) placer_->Place(chunk.elem_count * DTypeSize(t.dtype), shard);
    return Status::Ok();
  }
  if (c.shard != static_cast<uint32_t>(shard) || c.elem_offset != chunk.elem_offset ||
      c.elem_count != chunk.elem_count) {
    return Status::FailedPrecondition(
        from + " holds chunk " + std::to_string(chunk.chunk_index) + " of '" + t.name +
        "', which the coordinator placed on ps task " + std::to_string(c.shard));
  }
  return Status::Ok();
}

void Coordinator::NoteSyncStepReached(uint64_t furthest) {
  const uint64_t step = furthest > 0 ? furthest - 1 : 0;
  if (step <= global_step_) return;
  global_step_ = step;
  sync_parts_.erase(sync_parts_.begin(), sync_parts_.lower_bound(step));
  sync_steps_done_.erase(sync_steps_done_.begin(), sync_steps_done_.lower_bound(step));
}

void Coordinator::AdoptionDone() {
  if (tensors_.empty() || initialized_) return;
  for (const auto& [name, placed] : tensors_) {
    if (!placed.initialized) return;
  }
  initialized_ = true;
}

void Coordinator::MarkInitialized(uint64_t start_step) {
  initialized_ = true;
  start_step_ = start_step;
  for (auto& [name, placed] : tensors_) {
    if (placed.chief_declared) placed.initialized = true;
  }
}

bool Coordinator::EveryTensorInitialized() const {
  // A walk over the tensors: asked only by a wait-init once the cluster was
  // initialised (a restarted worker, tensors declared later), never per step.
  if (!initialized_) return false;
  return std::all_of(tensors_.begin(), tensors_.end(),
                     [](const auto& named) { return named.second.initialized; });
}

void Coordinator::RestoreFrom(const ckpt::Checkpoint* checkpoint) {
  restored_ = checkpoint;
  global_step_ = checkpoint->manifest.global_step;
}

Status Coordinator::OnStepsApplied(int shard, const wire::StepsApplied& report) {
  // Built only for an error: every step passes here.
  auto from = [shard] { return "step report from ps task " + std::to_string(shard); };
  if (shard < 0 || shard >= num_shards_) {
    return Status::InvalidArgument(from() + " of a cluster of " + std::to_string(num_shards_));
  }
  for (const auto& worker : report.sync_workers) {
    if (worker.rank >= static_cast<uint32_t>(num_workers_)) {
      return Status::InvalidArgument(from() + " names worker rank " + std::to_string(worker.rank) +
                                     ", but the cluster has " + std::to_string(num_workers_) +
                                     " workers");
    }
    if (worker.parts == 0 || worker.parts > static_cast<uint32_t>(num_shards_)) {
      return Status::InvalidArgument(from() + " says the step of worker rank " +
                                     std::to_string(worker.rank) + " spans " +
                                     std::to_string(worker.parts) + " shards");
    }
  }
  step_reports_by_shard_[static_cast<size_t>(shard)].fetch_add(1, std::memory_order_relaxed);
  global_step_ += report.async_steps;
  for (const auto& worker : report.sync_workers) CountSyncPart(shard, worker, report.sync_step);
  return Status::Ok();
}

std::vector<uint64_t> Coordinator::step_reports_by_shard() const {
  std::vector<uint64_t> counts;
  counts.reserve(step_reports_by_shard_.size());
  for (const auto& n : step_reports_by_shard_) counts.push_back(n.load(std::memory_order_relaxed));
  return counts;
}

void Coordinator::CountSyncPart(int shard, const wire::SyncStepWorker& worker, uint64_t step) {
  if (step < global_step_) return;  // a late worker: that step is counted already
  // Steps that never complete (a worker's part lost with a shard, backup
  // workers) are kept only for the newest kMaxOpenSteps steps.
  constexpr size_t kMaxOpenSteps = 64;
  auto& shards = sync_parts_[step][worker.rank];
  shards.insert(shard);
  if (shards.size() < worker.parts) return;
  auto& done = sync_steps_done_[step];
  done.insert(worker.rank);
  if (replicas_to_aggregate_ == 0 || done.size() >= replicas_to_aggregate_) {
    global_step_ = step + 1;
    sync_parts_.erase(sync_parts_.begin(), sync_parts_.upper_bound(step));
    sync_steps_done_.erase(sync_steps_done_.begin(), sync_steps_done_.upper_bound(step));
  }
  while (sync_parts_.size() > kMaxOpenSteps) sync_parts_.erase(sync_parts_.begin());
  while (sync_steps_done_.size() > kMaxOpenSteps) sync_steps_done_.erase(sync_steps_done_.begin());
}

}  // namespace tessera::coord
