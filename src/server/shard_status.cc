// What a shard reports: its part of `tessera status` and of ServerStats.

#include <nlohmann/json.hpp>

#include "server/shard.h"

namespace tessera::server {

void Shard::AddStatus(nlohmann::json* status) const {
  (*status)["memory"] = memory_->Describe();
  (*status)["staged_through_host"] = table_->staged();
}

void Shard::AddStats(ServerStats* s) const {
  s->tensors = tensors_;
  s->pushes_applied = pushes_applied_;
  s->pulls_served = pulls_served_;
  s->leases_revoked = leases_revoked_;
  s->sync_steps_applied = steps_applied_;
  s->stale_pushes_dropped = stale_dropped_;
  s->duplicate_pushes_dropped = duplicate_dropped_;
  s->chunks_restored = chunks_restored_;
  s->host_staged_bytes = host_staged_bytes_;
  s->cuda_ipc_workers = cuda_ipc_workers_;
}

}  // namespace tessera::server
