#include "server/worker_roster.h"

namespace tessera::server {

void WorkerRoster::Joined(uint32_t rank) {
  connections_[rank]++;
  departed_.erase(rank);
}

bool WorkerRoster::Left(uint32_t rank, const std::string& task, Clock::time_point now) {
  auto it = connections_.find(rank);
  if (it == connections_.end() || it->second == 0) return false;  // not one it counted
  if (--it->second > 0) return false;
  departed_[rank] = {task, now};
  departures_++;
  return true;
}

bool WorkerRoster::MayStillPush(uint32_t rank, Clock::time_point now, std::string* gone) const {
  auto d = departed_.find(rank);
  if (d == departed_.end() || now - d->second.since < rejoin_grace_) return true;
  if (gone != nullptr) *gone = d->second.task;
  return false;
}

std::optional<WorkerRoster::Clock::time_point> WorkerRoster::NextRejoinDeadline(
    Clock::time_point now) const {
  std::optional<Clock::time_point> earliest;
  for (const auto& [rank, d] : departed_) {
    const auto until = d.since + rejoin_grace_;
    if (until > now && (!earliest || until < *earliest)) earliest = until;
  }
  return earliest;
}

}  // namespace tessera::server
