#include "server/sync_row_steps.h"

#include <algorithm>
#include <unordered_map>

namespace tessera::server {

Result<SyncRowSteps::Held> SyncRowSteps::Hold(uint32_t rank, uint64_t step,
                                              std::span<const int64_t> ids, const float* grads,
                                              bool end_of_step) {
  if (rank >= workers_) {
    return Status::PermissionDenied("worker rank " + std::to_string(rank) +
                                    " is not one of the table's " + std::to_string(workers_) +
                                    " workers");
  }
  if (!started_) {
    started_ = true;
    applied_ = step;
  }
  if (step < applied_) {
    stale_rows_ += ids.size();
    return Held::kStale;
  }
  if (step > applied_ + 1) {
    return Status::FailedPrecondition("step " + std::to_string(step) + " pushed while step " +
                                      std::to_string(applied_) +
                                      " is not applied: a worker pulls step t before it "
                                      "pushes step t + 1");
  }
  Step& s = steps_[step];
  WorkerRows& mine = s.by_rank[rank];
  if (mine.complete) return Held::kDuplicate;
  if (s.first_complete.size() >= needed_) {
    // The step has its workers already: this one is a backup, its rows stale.
    stale_rows_ += ids.size();
    return Held::kStale;
  }
  if (mine.ids.size() + ids.size() > max_rows_) {
    return Status::ResourceExhausted(
        "worker rank " + std::to_string(rank) + " pushed " +
        std::to_string(mine.ids.size() + ids.size()) + " rows for step " + std::to_string(step) +
        ", more than the table's " + std::to_string(max_rows_) + " rows per ps task");
  }
  mine.ids.insert(mine.ids.end(), ids.begin(), ids.end());
  mine.grads.insert(mine.grads.end(), grads, grads + ids.size() * dim_);
  if (end_of_step) {
    mine.complete = true;
    s.first_complete.push_back(rank);
  }
  return Held::kHeld;
}

bool SyncRowSteps::Ready() const {
  auto it = steps_.find(applied_);
  return it != steps_.end() && it->second.first_complete.size() >= needed_;
}

void SyncRowSteps::Sum(const Step& s) {
  std::vector<uint32_t> ranks(s.first_complete.begin(), s.first_complete.begin() + needed_);
  std::sort(ranks.begin(), ranks.end());
  std::unordered_map<int64_t, uint32_t> at;
  sum_ids_.clear();
  sum_.clear();
  for (uint32_t rank : ranks) {
    const WorkerRows& w = s.by_rank.at(rank);
    for (size_t r = 0; r < w.ids.size(); ++r) {
      const float* g = w.grads.data() + r * dim_;
      auto [it, fresh] = at.emplace(w.ids[r], static_cast<uint32_t>(sum_ids_.size()));
      if (fresh) {
        sum_ids_.push_back(w.ids[r]);
        sum_.insert(sum_.end(), g, g + dim_);
        continue;
      }
      float* acc = sum_.data() + size_t{it->second} * dim_;
      for (uint32_t j = 0; j < dim_; ++j) acc[j] += g[j];
    }
  }
  if (average_) {
    const auto scale = static_cast<float>(1.0 / needed_);
    for (float& v : sum_) v *= scale;
  }
  for (const auto& [rank, w] : s.by_rank) {
    if (std::find(ranks.begin(), ranks.end(), rank) == ranks.end()) stale_rows_ += w.ids.size();
  }
}

std::string SyncRowSteps::Missing(uint64_t step) const {
  auto it = steps_.find(step);
  std::string out;
  uint32_t missing = 0;
  for (uint32_t rank = 0; rank < workers_; ++rank) {
    const bool done = it != steps_.end() && it->second.by_rank.count(rank) != 0 &&
                      it->second.by_rank.at(rank).complete;
    if (done) continue;
    out += (missing++ == 0 ? "" : ", ") + std::string("worker ") + std::to_string(rank);
  }
  const uint32_t have =
      it == steps_.end() ? 0 : static_cast<uint32_t>(it->second.first_complete.size());
  return "step " + std::to_string(step) + " has " + std::to_string(have) + " of the " +
         std::to_string(needed_) + " workers it needs; not complete from " +
         (out.empty() ? std::string("none") : out);
}

size_t SyncRowSteps::held_rows() const {
  size_t rows = 0;
  for (const auto& [step, s] : steps_) {
    for (const auto& [rank, w] : s.by_rank) rows += w.ids.size();
  }
  return rows;
}

}  // namespace tessera::server
