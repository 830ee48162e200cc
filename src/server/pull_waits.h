// Why a waiting pull still waits, and whether it can still be answered: what
// a pull that timed out is told (the tensor, the step, which workers pushed
// it and which did not), and the error of a pull for a sync step that can no
// longer complete because the workers it needs are gone. Read-only over the
// shard's table and the server's roster; progress thread only.
#pragma once

#include <chrono>
#include <string>

#include "server/param_table.h"
#include "server/worker_roster.h"
#include "tessera/cluster.h"
#include "wire/messages.h"

namespace tessera::server {

class PullWaits {
 public:
  // Each outlives this.
  PullWaits(const ParamTable& table, const WorkerRoster& roster, const ClusterSpec& cluster)
      : table_(table), roster_(roster), cluster_(cluster) {}

  // What the pull (of chunks the table holds) still waits for, naming the
  // tensor, the step and the workers that have and have not pushed it.
  std::string WhatItWaitsFor(const wire::Pull& pull) const;
  // An error if it waits for a sync step that cannot complete: the workers
  // it needs disconnected and were not back within the rejoin grace.
  Status Reachable(const wire::Pull& pull) const;
  // "/job:worker/task:N" for a rank.
  std::string WorkerName(uint32_t rank) const;

 private:
  std::string WhatSyncStepWaitsFor(const Param& p) const;

  const ParamTable& table_;
  const WorkerRoster& roster_;
  const ClusterSpec& cluster_;
};

}  // namespace tessera::server
