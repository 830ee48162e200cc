#include "server/step_counter.h"

#include <algorithm>

namespace tessera::server {

void StepCounter::MakeReady(uint64_t step, wire::SyncStepWorkers workers) {
  wire::StepsApplied report;
  report.sync_step = step;
  report.sync_workers = std::move(workers);
  ready_.push_back(std::move(report));
  // While the coordinator is unreachable reports wait here; a later
  // complete step supersedes the old ones, so only the newest are kept.
  while (ready_.size() > kMaxWaitingReports) ready_.pop_front();
  reported_below_ = std::max(reported_below_, step + 1);
}

void StepCounter::CountSync(uint32_t rank, uint64_t step, uint32_t replicas, uint32_t parts) {
  if (step < reported_below_) return;
  while (!open_.empty() && open_.begin()->first < step) {
    auto earlier = open_.extract(open_.begin());
    MakeReady(earlier.key(), std::move(earlier.mapped()));
  }
  auto& workers = open_[step];
  auto same = [rank](const wire::SyncStepWorker& w) { return w.rank == rank; };
  if (std::find_if(workers.begin(), workers.end(), same) != workers.end()) return;  // a duplicate
  workers.push_back({rank, parts});
  if (workers.size() >= std::max<uint32_t>(replicas, 1)) {
    auto done = open_.extract(step);
    MakeReady(step, std::move(done.mapped()));
  }
}

std::vector<wire::StepsApplied> StepCounter::TakeReports() {
  std::vector<wire::StepsApplied> out;
  TakeReportsInto(&out);
  return out;
}

void StepCounter::TakeReportsInto(std::vector<wire::StepsApplied>* out) {
  out->clear();
  for (auto& report : ready_) out->push_back(std::move(report));
  ready_.clear();
  for (const auto& report : *out) {  // sync steps only: async counts must not repeat
    recent_.push_back(report);
    recent_.back().async_steps = 0;
    if (recent_.size() > kRecentReports) recent_.pop_front();
  }
  if (async_pending_ > 0) {
    if (out->empty()) out->emplace_back();
    out->front().async_steps = async_pending_;
    async_pending_ = 0;
  }
}

}  // namespace tessera::server
