#include "server/pull_waits.h"

#include <fmt/format.h>

namespace tessera::server {

std::string PullWaits::WorkerName(uint32_t rank) const {
  auto task = cluster_.worker_task(static_cast<int>(rank));
  return task.ok() ? task->ToString() : "worker rank " + std::to_string(rank);
}

std::string PullWaits::WhatSyncStepWaitsFor(const Param& p) const {
  const auto& mode = p.entry.tensor.mode;
  std::string pushed, missing;
  for (uint32_t rank = 0; rank < mode.total_num_replicas; ++rank) {
    std::string& list = rank < p.contributed.size() && p.contributed[rank] ? pushed : missing;
    list += (list.empty() ? "" : ", ") + WorkerName(rank);
  }
  return "sync step " + std::to_string(p.step) + " has " + std::to_string(p.agg_count) +
         " of the " + std::to_string(mode.replicas_to_aggregate) +
         " gradients it needs; pushed by " + (pushed.empty() ? "no worker" : pushed) +
         "; not pushed by " + (missing.empty() ? "none" : missing) +
         (p.agg_count >= mode.replicas_to_aggregate ? " (it waits for readers to finish)" : "");
}

std::string PullWaits::WhatItWaitsFor(const wire::Pull& pull) const {
  for (const auto& e : pull.entries) {
    const Param* p = table_.Find(e.key_id);
    const std::string name = "tensor '" + p->display_name + "'";
    if (!p->initialized) return name + " is not initialised yet (the chief has not pushed it)";
    const auto& mode = p->entry.tensor.mode;
    if (mode.kind == Consistency::kSync && p->step < e.min_step) {
      return name + ": " + WhatSyncStepWaitsFor(*p);
    }
    if (mode.kind == Consistency::kBounded && p->StepReached() < e.min_step) {
      std::string behind;
      for (uint32_t rank = 0; rank < p->pushed_steps.size(); ++rank) {
        if (p->pushed_steps[rank] >= e.min_step) continue;
        if (!behind.empty()) behind += ", ";
        behind += fmt::format("{} has pushed {} steps", WorkerName(rank), p->pushed_steps[rank]);
      }
      return fmt::format("{}: step {} is not yet pushed by every worker ({})", name, e.min_step,
                         behind);
    }
    if (p->version < e.min_version) {
      return name + " is at version " + std::to_string(p->version) + ", not yet " +
             std::to_string(e.min_version);
    }
    if (p->writer_waiting) return name + " has an update waiting for readers to finish";
  }
  return "nothing (it was about to be answered)";
}

Status PullWaits::Reachable(const wire::Pull& pull) const {
  const auto now = std::chrono::steady_clock::now();
  for (const auto& e : pull.entries) {
    const Param* p = table_.Find(e.key_id);
    const auto& mode = p->entry.tensor.mode;
    if (mode.kind != Consistency::kSync || p->StepReached() >= e.min_step) continue;
    if (p->agg_count >= mode.replicas_to_aggregate) continue;  // complete, waiting for readers
    // Workers that may still push this step: not yet counted, and not
    // gone for longer than a restart may take.
    uint32_t possible = 0;
    std::string gone;
    for (uint32_t rank = 0; rank < mode.total_num_replicas; ++rank) {
      if (rank < p->contributed.size() && p->contributed[rank]) continue;
      if (std::string task; roster_.MayStillPush(rank, now, &task)) {
        possible++;
      } else {
        gone += (gone.empty() ? "" : ", ") + task;
      }
    }
    const uint32_t needed = mode.replicas_to_aggregate - p->agg_count;
    if (possible < needed) {
      return Status::Unavailable("step " + std::to_string(p->step) + " of '" + p->display_name +
                                 "' cannot complete: it needs " + std::to_string(needed) +
                                 " more worker(s) and " + gone + " disconnected (not back within " +
                                 std::to_string(roster_.rejoin_grace().count()) + " ms)");
    }
  }
  return Status::Ok();
}

}  // namespace tessera::server
