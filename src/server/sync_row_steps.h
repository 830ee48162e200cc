// A sync embedding table's steps on one ps task. Each worker's gradient
// rows of a step are held (f32) until it says its pushes of that step are
// complete (end of step); once replicas_to_aggregate of the table's workers
// did, the step's gradients are summed per id in worker-rank order (so the
// sum does not depend on arrival), averaged over those workers where the
// table averages (a worker that did not touch a row gave it a zero
// gradient, as a dense tensor's would), and each row touched is updated
// once; what other workers push for that step is stale. A row nobody
// touched in a step is not touched by it. Steps apply in order; a worker
// may push the next step before the current one applies, not further.
// Progress thread.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "tessera/status.h"

namespace tessera::server {

class SyncRowSteps {
 public:
  // `max_rows`: the most rows one worker may hold in a step (the table's
  // row limit: a step cannot touch more rows than the table holds).
  SyncRowSteps(uint32_t replicas_to_aggregate, uint32_t total_replicas, bool average, uint32_t dim,
               uint64_t max_rows)
      : needed_(replicas_to_aggregate),
        workers_(total_replicas),
        average_(average),
        dim_(dim),
        max_rows_(max_rows) {}

  enum class Held { kHeld, kStale, kDuplicate };
  // Worker `rank`'s rows of `step`: ids (distinct) and ids.size() f32 rows.
  // An error for a rank the table does not count or a step beyond the next.
  Result<Held> Hold(uint32_t rank, uint64_t step, std::span<const int64_t> ids, const float* grads,
                    bool end_of_step);
  // Whether the next step has its workers.
  bool Ready() const;
  // Applies the next step: `apply(id, grad)` for each id touched, with its
  // summed (and averaged) f32 gradient. Only when Ready().
  template <typename Apply>
  void ApplyNext(Apply apply);

  // Steps applied (the next step to apply). The first push sets where the
  // table starts: the workers' start step (Client::start_step), which a
  // restored cluster resumes at.
  uint64_t applied_steps() const { return applied_; }
  bool started() const { return started_; }
  // Which workers have not said step `step` is complete, for an error.
  std::string Missing(uint64_t step) const;
  // Rows held over every step and worker.
  size_t held_rows() const;
  uint64_t stale_rows() const { return stale_rows_; }

 private:
  struct WorkerRows {
    std::vector<int64_t> ids;
    std::vector<float> grads;  // ids.size() x dim_
    bool complete = false;
  };
  struct Step {
    std::map<uint32_t, WorkerRows> by_rank;  // ordered: the sum's order
    std::vector<uint32_t> first_complete;    // ranks, in the order they completed
  };
  // Sums the step's first workers' rows per id into sum_ (ids in sum_ids_).
  void Sum(const Step& s);

  const uint32_t needed_;
  const uint32_t workers_;
  const bool average_;
  const uint32_t dim_;
  const uint64_t max_rows_;
  uint64_t applied_ = 0;
  bool started_ = false;
  uint64_t stale_rows_ = 0;
  std::map<uint64_t, Step> steps_;  // the next step, and the one after
  std::vector<int64_t> sum_ids_;
  std::vector<float> sum_;
};

template <typename Apply>
void SyncRowSteps::ApplyNext(Apply apply) {
  auto it = steps_.find(applied_);
  Sum(it->second);
  for (size_t i = 0; i < sum_ids_.size(); ++i) apply(sum_ids_[i], sum_.data() + i * dim_);
  steps_.erase(it);
  ++applied_;
}

}  // namespace tessera::server
