#include "server/worker_presence.h"

#include <vector>

namespace tessera::server {

void WorkerPresence::Connected(uint32_t rank, const std::string& task) {
  Rank& r = seen_[rank];
  r.task = task;
  r.connections++;
  r.lost = false;
  connected_++;
  none_since_.reset();
}

void WorkerPresence::Left(uint32_t rank, bool said_bye, Clock::time_point now) {
  auto it = seen_.find(rank);
  if (it == seen_.end() || it->second.connections == 0) return;
  Rank& r = it->second;
  r.connections--;
  if (r.connections == 0) r.lost = !said_bye;
  if (--connected_ == 0) none_since_ = now;
}

std::optional<Status> WorkerPresence::Verdict(Clock::time_point now) const {
  if (connected_ > 0) return std::nullopt;
  const bool all_came = static_cast<int>(seen_.size()) >= num_workers_;
  if (!all_came && (!none_since_ || now - *none_since_ < grace_)) return std::nullopt;
  std::string lost, missing;
  for (const auto& [rank, r] : seen_) {
    if (r.lost) lost += (lost.empty() ? "" : ", ") + r.task;
  }
  for (int rank = 0; rank < num_workers_; ++rank) {
    if (!seen_.count(static_cast<uint32_t>(rank))) {
      missing += (missing.empty() ? "worker rank " : ", ") + std::to_string(rank);
    }
  }
  if (lost.empty() && missing.empty()) return Status::Ok();
  std::string why;
  if (!lost.empty()) why = lost + " left without saying bye (killed, or lost)";
  if (!missing.empty()) {
    why += (why.empty() ? "" : "; ") + missing + " never connected within " +
           std::to_string(grace_.count() / 1000) + " s of " +
           (seen_.empty() ? "the start" : "the last worker leaving");
  }
  return Status::Aborted("the job's workers are gone: " + why);
}

std::optional<WorkerPresence::Clock::time_point> WorkerPresence::NextCheck() const {
  if (connected_ > 0 || !none_since_) return std::nullopt;
  return *none_since_ + grace_;
}

}  // namespace tessera::server
