// What a shard reports: its part of `tessera status` and of ServerStats.

#include <nlohmann/json.hpp>

#include "server/shard.h"

namespace tessera::server {

void Shard::AddStatus(nlohmann::json* status) const {
  (*status)["memory"] = memory_->memory().Describe();
  (*status)["staged_through_host"] = memory_->staged();
}

void Shard::AddStats(ServerStats* s) const {
  if (creates_) creates_->AddStats(s);
  if (pushes_) pushes_->AddStats(s);
  if (pulls_) pulls_->AddStats(s);
  if (memory_) memory_->AddStats(s);
}

}  // namespace tessera::server
