// The client's calls to the coordinator: the chief's init barrier, the
// global step, hyper-parameters.

#include <algorithm>

#include "client/client_impl.h"

namespace tessera {

Status Client::Impl::InitializeNow() {
  if (options_.read_only) return ReadOnlyRefusal("initialise the parameters");
  if (worker_rank_ != 0) {
    return Status::FailedPrecondition(options_.task.ToString() + " is not the chief (" +
                                      options_.cluster.chief().ToString() +
                                      " is); use WaitForInit");
  }
  std::vector<PushItem> items;
  std::vector<std::vector<uint8_t>> generated;
  size_t restored = 0, kept = 0;
  bool any_stepped = false;
  {
    auto lock = tensors_.Lock();
    auto& entries = tensors_.EntriesLocked();
    generated.reserve(entries.size());
    for (uint32_t i = 0; i < entries.size(); ++i) {
      auto& e = entries[i];
      any_stepped = any_stepped || e.decl.mode.kind != Consistency::kAsync;
      if (e.restored || e.initialized) {
        // Restored from a checkpoint, or initialised before (a restarted
        // chief, or an earlier Initialize): the values have moved on; keep them.
        (e.restored ? restored : kept)++;
        continue;
      }
      if (e.initial.empty()) {
        auto value = InitialValue(e.initializer, e.decl.name, e.decl.dtype, e.decl.shape);
        if (!value.ok()) return value.status();
        generated.push_back(std::move(*value));
        items.push_back({{i, id_}, generated.back().data(), e.bytes});
      } else {
        items.push_back({{i, id_}, e.initial.data(), e.bytes});
      }
    }
  }
  if (restored > 0) {
    TLOG_INFO("{}: {} tensor(s) restored from the checkpoint of global step {}; initialising {}",
              options_.task.ToString(), restored, tensors_.restored_step().value_or(0),
              items.size());
  }
  if (kept > 0) {
    TLOG_INFO("{}: {} tensor(s) were initialised before; not initialising them again",
              options_.task.ToString(), kept);
  }
  // Sync and bounded tensors start at the cluster's step: declared after
  // training began, they join the steps the workers are at. It is decided
  // once, here, and is the number every worker starts at (the coordinator
  // hands it to each WaitForInit).
  uint64_t cluster_step = 0;
  if (any_stepped) {
    auto step = StepToStartAt();
    if (!step.ok()) return step.status().WithContext("initialising");
    cluster_step = *step;
  }
  if (!items.empty()) {
    TESSERA_RETURN_IF_ERROR(
        Push(items, wire::kFlagInit, cluster_step, {}).Wait().WithContext("initialising"));
  }
  auto ack = links_->CallCoordinator<wire::InitDone, wire::Ack>(wire::InitDone{cluster_step},
                                                                options_.op_timeout);
  if (!ack.ok()) return ack.status();
  tensors_.Initialized(cluster_step);
  return Status::Ok();
}

Status Client::Impl::SetHyperparams(Tensor t, const Hyperparams& hyper) {
  if (options_.read_only) return ReadOnlyRefusal("change hyper-parameters");
  if (worker_rank_ != 0) {
    return Status::FailedPrecondition(options_.task.ToString() + " is not the chief; only " +
                                      options_.cluster.chief().ToString() +
                                      " changes hyper-parameters");
  }
  TESSERA_RETURN_IF_ERROR(hyper.Validate());
  auto entry = tensors_.Lookup(t, 0, std::nullopt, /*check_bytes=*/false);
  if (!entry.ok()) return entry.status();
  // The coordinator first: checkpoints save what it holds, and re-creates
  // on a restarted shard carry it.
  auto recorded = links_->CallCoordinator<wire::UpdateHyper, wire::Ack>(
      wire::UpdateHyper{(*entry)->decl.name, hyper}, options_.op_timeout);
  if (!recorded.ok()) return recorded.status();
  {
    auto lock = tensors_.Lock();
    tensors_.EntriesLocked()[t.index].decl.hyper = hyper;
  }
  std::vector<wire::SetHyper> by_shard(links_->size());
  for (const auto& c : (*entry)->chunks) by_shard[c.shard].key_ids.push_back(c.key_id);
  for (size_t s = 0; s < by_shard.size(); ++s) {
    if (by_shard[s].key_ids.empty()) continue;
    by_shard[s].hyper = hyper;
    auto ack = links_->Call<wire::SetHyper, wire::Ack>(static_cast<int>(s), by_shard[s],
                                                       options_.op_timeout);
    if (!ack.ok()) return ack.status();
  }
  return Status::Ok();
}

Result<uint64_t> Client::Impl::StepToStartAt() {
  // The global step, and at least the furthest step any ps task's sync
  // tensors reached: the shards report steps after they answered the
  // workers, so the global step may not count the last ones yet. Started
  // below them, fresh tensors would be behind the workers, and a worker that
  // reads the global step later (one that waits for init after the chief
  // was done) would start past the tensors.
  auto global = GlobalStep();
  if (!global.ok()) return global.status();
  uint64_t step = *global;
  // The ps tasks only: a coordinator of its own holds no tensors.
  const int num_ps = options_.cluster.num_tasks("ps");
  for (int s = 0; s < num_ps; ++s) {
    auto reached =
        links_->Call<wire::SyncStep, wire::StepReply>(s, wire::SyncStep{}, options_.op_timeout);
    if (!reached.ok()) return reached.status();
    step = std::max(step, reached->step);
  }
  return step;
}

Result<Client::CheckpointInfo> Client::Impl::SaveCheckpoint(std::chrono::milliseconds timeout) {
  if (options_.read_only) return ReadOnlyRefusal("ask for a checkpoint");
  auto saved = links_->CallCoordinator<wire::SaveCheckpoint, wire::CheckpointSaved>(
      wire::SaveCheckpoint{}, timeout);
  if (!saved.ok()) return saved.status();
  return Client::CheckpointInfo{saved->global_step, saved->path};
}

Result<uint64_t> Client::Impl::GlobalStep() {
  auto reply =
      links_->CallCoordinator<wire::GetStep, wire::StepReply>(wire::GetStep{}, options_.op_timeout);
  if (!reply.ok()) return reply.status();
  return reply->step;
}

Status Client::Impl::WaitForInitNow(std::chrono::milliseconds timeout) {
  auto ack = links_->CallCoordinator<wire::WaitInit, wire::StepReply>(wire::WaitInit{}, timeout);
  if (ack.ok()) {
    tensors_.SetStartStep(ack->step);
    return Status::Ok();
  }
  if (ack.status().code() == StatusCode::kDeadlineExceeded) {
    return Status::DeadlineExceeded("the chief (" + options_.cluster.chief().ToString() +
                                    ") has not initialised the parameters within " +
                                    std::to_string(timeout.count()) + " ms");
  }
  return ack.status();
}

}  // namespace tessera
