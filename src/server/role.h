// What a server task is, decided once from its options: a ps task holding
// tensors, ps task 0 hosting the coordinator beside its tensors (no
// separate coordinator job in the cluster spec), or the coordinator job
// alone, which holds no tensors.
#pragma once

#include "tessera/server.h"

namespace tessera::server {

enum class Role { kShard, kShardAndCoordinator, kCoordinator };

inline Role RoleOf(const ServerOptions& options) {
  if (options.job == "coordinator") return Role::kCoordinator;
  if (!options.cluster.separate_coordinator() && options.task_index == 0) {
    return Role::kShardAndCoordinator;
  }
  return Role::kShard;
}

inline bool HoldsTensors(Role role) { return role != Role::kCoordinator; }
inline bool HostsCoordinator(Role role) { return role != Role::kShard; }

}  // namespace tessera::server
