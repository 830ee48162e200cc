// What a shard reports: its part of `tessera status` and of ServerStats.

#include <nlohmann/json.hpp>

#include "server/shard.h"

namespace tessera::server {

void Shard::AddStatus(nlohmann::json* status) const {
  (*status)["memory"] = memory_->memory().Describe();
  (*status)["staged_through_host"] = memory_->staged();
}

void Shard::AddStats(ServerStats* s) const {
  tables_.AddStats(s);
  if (memory_) memory_->AddStats(s);
}

}  // namespace tessera::server
