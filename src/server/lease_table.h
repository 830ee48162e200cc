// Pull leases: the chunks a worker reads one-sided, held unchanged until it
// releases them, disconnects, or holds them past the lease timeout. The
// table only keeps the books; the shard counts readers per chunk from what
// Grant takes and the other calls give back.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/pool_allocator.h"
#include "tessera/status.h"

namespace tessera::server {

class LeaseTable {
 public:
  using Clock = std::chrono::steady_clock;
  // A lease is made per one-sided pull: its name, keys and table entries
  // take their memory from the pool, not the heap.
  using Task = std::basic_string<char, std::char_traits<char>, PoolAllocator<char>>;
  using Keys = std::vector<uint32_t, PoolAllocator<uint32_t>>;
  struct Lease {
    const void* owner = nullptr;  // the connection that holds it
    Task task;                    // its task, for the logs
    Keys keys;
    Clock::time_point expires;
  };
  struct Ended {
    uint64_t id = 0;
    Lease lease;
  };

  // `max_per_owner` bounds what one connection can make the shard hold:
  // every lease pins chunks against updates until it ends.
  explicit LeaseTable(size_t max_per_owner = 4096) : max_per_owner_(max_per_owner) {}

  // A new lease's id, or ResourceExhausted when its owner holds too many.
  Result<uint64_t> Grant(Lease lease);
  // Ends lease `id` if `owner` holds it, and returns it; NotFound otherwise
  // (someone else's lease, or one already ended: revoked, for instance).
  Result<Lease> Release(uint64_t id, const void* owner);
  // Ends every lease `owner` holds (it disconnected).
  std::vector<Ended> ReleaseAllOf(const void* owner);
  // Ends every lease whose time ran out by `now`.
  std::vector<Ended> TakeExpired(Clock::time_point now);
  void Clear();
  size_t size() const { return leases_.size(); }

 private:
  size_t max_per_owner_;
  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, Lease, std::hash<uint64_t>, std::equal_to<>,
                     PoolAllocator<std::pair<const uint64_t, Lease>>>
      leases_;
  std::unordered_map<const void*, size_t, std::hash<const void*>, std::equal_to<>,
                     PoolAllocator<std::pair<const void* const, size_t>>>
      held_;  // owner -> leases
  void Forget(const void* owner);
};

}  // namespace tessera::server
