#include "server/lease_table.h"

namespace tessera::server {

Result<uint64_t> LeaseTable::Grant(Lease lease) {
  size_t& held = held_[lease.owner];
  if (held >= max_per_owner_) {
    return Status::ResourceExhausted(std::string(lease.task) + " holds " + std::to_string(held) +
                                     " pull leases, the most one connection may: release "
                                     "them before pulling more");
  }
  held++;
  const uint64_t id = next_id_++;
  leases_.emplace(id, std::move(lease));
  return id;
}

void LeaseTable::Forget(const void* owner) {
  auto it = held_.find(owner);
  if (it != held_.end() && --it->second == 0) held_.erase(it);
}

Result<LeaseTable::Lease> LeaseTable::Release(uint64_t id, const void* owner) {
  auto it = leases_.find(id);
  if (it == leases_.end() || it->second.owner != owner) {
    return Status::NotFound("pull lease " + std::to_string(id) + " is not held by its releaser");
  }
  Lease lease = std::move(it->second);
  leases_.erase(it);
  Forget(owner);
  return lease;
}

std::vector<LeaseTable::Ended> LeaseTable::ReleaseAllOf(const void* owner) {
  std::vector<Ended> ended;
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.owner != owner) {
      ++it;
      continue;
    }
    ended.push_back({it->first, std::move(it->second)});
    it = leases_.erase(it);
  }
  held_.erase(owner);
  return ended;
}

std::vector<LeaseTable::Ended> LeaseTable::TakeExpired(Clock::time_point now) {
  std::vector<Ended> ended;
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.expires > now) {
      ++it;
      continue;
    }
    Forget(it->second.owner);
    ended.push_back({it->first, std::move(it->second)});
    it = leases_.erase(it);
  }
  return ended;
}

void LeaseTable::Clear() {
  leases_.clear();
  held_.clear();
}

}  // namespace tessera::server
