#include "server/apply.h"

#include <algorithm>
#include <cstring>

namespace tessera::server::apply {

Status Publish(const Target& t, Param& p) {
  if (!t.staged) return Status::Ok();
  if (t.staged_bytes != nullptr) *t.staged_bytes += p.bytes;
  return t.memory->ToHost(p.published, p.data, p.bytes);
}

Status ReadValue(const Target& t, const Param& p, void* host_dst) {
  if (t.staged) {
    std::memcpy(host_dst, p.published, p.bytes);
    return Status::Ok();
  }
  return t.memory->ToHost(host_dst, p.data, p.bytes);
}

Status Init(const Target& t, Param& p, const void* value, uint64_t cluster_step) {
  const auto& tensor = p.entry.tensor;
  Status st =
      t.memory->ApplyUpdate(UpdateRule::kAssign, tensor.dtype, p.data, value, p.entry.elem_count);
  if (st.ok()) {
    st = t.memory->ResetRuleState(tensor.rule, p.hyper, tensor.dtype, p.data, p.entry.elem_count,
                                  p.rule_state());
  }
  if (st.ok()) st = Publish(t, p);
  p.updates = 0;
  p.ResetAggregation();
  p.resuming = false;
  // Every sync tensor steps with the cluster: one declared after training
  // began starts at the global step, where the workers' next steps are.
  p.step = std::max(p.step, cluster_step);
  for (auto& pushed : p.pushed_steps) pushed = std::max(pushed, cluster_step);
  p.SetFailure(Status::Ok());
  p.version++;
  p.initialized = true;
  return st;
}

Status Gradient(const Target& t, Param& p, const void* grad) {
  Status st = IsOptimizer(p.rule)
                  ? t.memory->ApplyOptimizer(p.rule, p.hyper, p.dtype, p.data, grad, p.elem_count,
                                             p.rule_state(), ++p.updates)
                  : t.memory->ApplyUpdate(p.rule, p.dtype, p.data, grad, p.elem_count);
  if (st.ok()) st = Publish(t, p);
  if (st.ok()) p.version++;
  return st;
}

void PlainGradient(Param& p, const void* grad) {
  kernels::ApplyPlainRuleCpu(p.rule, p.dtype, p.data, grad, p.elem_count);
  p.version++;
}

void NoteBoundedStep(Param& p, uint32_t rank, uint64_t step) {
  if (rank < p.pushed_steps.size()) {
    p.pushed_steps[rank] = std::max(p.pushed_steps[rank], step + 1);
  }
}

SyncPart AddToSyncStep(const Target& t, Param& p, uint32_t rank, uint64_t step, const void* grad) {
  const auto& mode = p.entry.tensor.mode;
  SyncPart part;
  if (step < p.step || p.agg_count >= mode.replicas_to_aggregate) {
    // Its step was applied, or has its replicas and waits to apply: a late
    // worker or a backup worker. TensorFlow drops these too.
    part.outcome = wire::PushOutcome::kStale;
    return part;
  }
  if (rank >= p.contributed.size()) {
    part.status =
        Status::InvalidArgument("worker rank " + std::to_string(rank) + " pushed to a chunk of " +
                                std::to_string(p.contributed.size()) + " workers");
    return part;
  }
  if (p.contributed[rank]) {
    part.outcome = wire::PushOutcome::kDuplicate;
    return part;
  }
  part.status = t.memory->Accumulate(p.entry.tensor.dtype, p.agg.data(), grad, p.entry.elem_count,
                                     p.agg_count == 0);
  p.contributed[rank] = true;
  part.step_ready = ++p.agg_count == mode.replicas_to_aggregate;
  return part;
}

Status ApplySyncStep(const Target& t, Param& p, const Status& injected) {
  const auto& mode = p.entry.tensor.mode;
  const double scale = mode.average ? 1.0 / mode.replicas_to_aggregate : 1.0;
  Status st = injected;
  if (st.ok()) {
    auto grad =
        t.memory->FinishAccumulation(p.entry.tensor.dtype, p.agg.data(), p.entry.elem_count, scale);
    st = grad.ok() ? Gradient(t, p, *grad) : grad.status();
  }
  p.step++;
  p.ResetAggregation();
  p.writer_waiting = false;
  p.resuming = false;
  return st;
}

}  // namespace tessera::server::apply
